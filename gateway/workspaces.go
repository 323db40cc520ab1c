package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
)

// acquire is POST /v1/workspaces: decoded here, run by package saga in
// the spec's order (idempotency replay → validate → admission → provider
// create → restore → confirm).
func (s *Server) acquire(c echo.Context) error {
	var req protocol.AcquireRequest
	key := c.Request().Header.Get(protocol.HeaderIdempotencyKey)
	if err := policy.ValidateIdempotencyKey(key); err != nil {
		return err
	}
	if err := decode(c, &req); err != nil {
		return err
	}
	res, err := s.saga.Acquire(c.Request().Context(), authFrom(c).Instance, key, req)
	if err != nil {
		return err
	}
	if res.Replayed {
		return c.JSON(http.StatusOK, s.status(res.Workspace))
	}
	return c.JSON(http.StatusCreated, s.status(res.Workspace))
}

func unavailable(err error) error {
	return &protocol.Error{Code: protocol.Unavailable, Message: "the broker cannot reach its store; retry shortly", RetryAfter: time.Second, Err: err}
}

// loadWorkspace returns the workspace named by the route, refusing ids of
// other instances exactly as unknown ones (spec §Trust model).
func (s *Server) loadWorkspace(c echo.Context) (sandgate.Workspace, error) {
	return s.loadWorkspaceLimited(c, "")
}

// loadWorkspaceLimited is loadWorkspace that also counts the request
// against the token's rate limit of class (when not empty), in the same
// round trip as the read: files cost two round trips in all, exec three
// (its end is recorded too, for the idle timeout).
func (s *Server) loadWorkspaceLimited(c echo.Context, class admission.Class) (sandgate.Workspace, error) {
	id := c.Param("id")
	if !policy.ValidID(id) {
		return sandgate.Workspace{}, errNotFound
	}
	a := authFrom(c)
	ctx := c.Request().Context()
	var limited func() error
	w, err := s.db.WorkspacePipelined(ctx, a.Lease.AccountID, id, func(p redis.Pipeliner) {
		if class != "" {
			limited = s.limiter.Queue(ctx, p, a.Lease.ID, class)
		}
	})
	if err := s.checkRead(c, w, err, limited); err != nil {
		return sandgate.Workspace{}, err
	}
	return w, nil
}

// checkRead answers a workspace read and the rate check that rode with it
// (limited, nil for none), in every workspace route's order: 429, then 404
// (no such workspace, or another instance's), then 503.
func (s *Server) checkRead(c echo.Context, w sandgate.Workspace, err error, limited func() error) error {
	if limited != nil {
		if lerr := limited(); protocol.CodeOf(lerr) == protocol.RateLimited {
			return lerr
		} else if lerr != nil && err == nil {
			s.log.Warn("rate limiter unavailable; request let through", slog.String(sandgate.KeyRequestID, requestID(c)), slog.Any("err", lerr))
		}
	}
	if errors.Is(err, store.ErrNotFound) || (err == nil && w.InstanceID != authFrom(c).Lease.InstanceID) {
		return errNotFound
	}
	if err != nil {
		return unavailable(err)
	}
	return nil
}

// usable returns the workspace, counting the request against the token's
// rate limit of class ("" for none), if it can take commands now: 409 while
// starting, 410 once terminating, terminated or past expires_at.
func (s *Server) usable(c echo.Context, class admission.Class) (sandgate.Workspace, error) {
	w, err := s.loadWorkspaceLimited(c, class)
	if err != nil {
		return w, err
	}
	now := s.clock.Now()
	return w, checkUsable(w, now, func() { s.expireIfDue(c.Request().Context(), w, now) })
}

// checkUsable answers 410 for a workspace gone at now, after calling
// expire (which ends one found past its deadline), and 409 while it starts.
func checkUsable(w sandgate.Workspace, now time.Time, expire func()) error {
	switch {
	case w.GoneAt(now):
		expire()
		return protocol.E(protocol.WorkspaceGone, "the workspace has ended; acquire a new one")
	case w.State == sandgate.WorkspaceStarting:
		return &protocol.Error{Code: protocol.WorkspaceNotReady, Message: "the workspace is still starting; retry shortly", RetryAfter: time.Second}
	}
	return nil
}

// expireIfDue ends a workspace found past its deadline, in the background.
// The reaper does the same on its own schedule; this only makes it prompt.
func (s *Server) expireIfDue(ctx context.Context, w sandgate.Workspace, now time.Time) {
	if w.State != sandgate.WorkspaceRunning || now.Before(w.ExpiresAt) {
		return
	}
	ctx = context.WithoutCancel(ctx)
	go s.term.Terminate(ctx, w, sandgate.ReasonExpired)
}

func (s *Server) getWorkspace(c echo.Context) error {
	w, err := s.loadWorkspace(c)
	if err != nil {
		return err
	}
	s.expireIfDue(c.Request().Context(), w, s.clock.Now())
	return c.JSON(http.StatusOK, s.status(w))
}

// status renders a workspace's status object. A running workspace past
// expires_at reads as terminating with reason expired until its end is
// confirmed (docs/protocol-notes.md).
func (s *Server) status(w sandgate.Workspace) protocol.Workspace {
	out := protocol.Workspace{
		WorkspaceID:        w.ID,
		State:              string(w.State),
		Size:               w.Size,
		Image:              w.Image,
		CreatedAt:          wireTime(w.CreatedAt),
		ExpiresAt:          wireTime(w.ExpiresAt),
		IdleTimeoutSeconds: secs(w.IdleTimeout),
		TerminatedAt:       timePtr(w.TerminatedAt),
	}
	reason := w.TerminationReason
	if w.State == sandgate.WorkspaceRunning && !s.clock.Now().Before(w.ExpiresAt) {
		out.State = string(sandgate.WorkspaceTerminating)
		reason = sandgate.ReasonExpired
	}
	if reason != "" && out.State != string(sandgate.WorkspaceRunning) && out.State != string(sandgate.WorkspaceStarting) {
		r := string(reason)
		out.TerminationReason = &r
	}
	if w.State == sandgate.WorkspaceTerminated && !w.StartedAt.IsZero() && !w.TerminatedAt.IsZero() {
		m, _ := billing.Metered(w) // the usage ledger's seconds
		out.MeteredSeconds = &m
	}
	return out
}

func (s *Server) listWorkspaces(c echo.Context) error {
	q := c.QueryParams()
	for k := range q {
		if k != "state" && k != "cursor" && k != "limit" {
			return errInvalid("unknown query parameter " + strconv.Quote(k))
		}
	}
	live := true
	switch q.Get("state") {
	case "", "live":
	case "all":
		live = false
	default:
		return errInvalid("state must be live or all")
	}
	limit := 50
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return errInvalid("limit must be an integer from 1 to 100")
		}
		limit = n
	}
	a := authFrom(c)
	ws, next, err := s.db.ListWorkspaces(c.Request().Context(), a.Lease.AccountID, a.Lease.InstanceID, q.Get("cursor"), limit, live, s.clock.Now())
	if errors.Is(err, store.ErrBadCursor) {
		return errInvalid("cursor is not one this broker returned")
	}
	if err != nil {
		return unavailable(err)
	}
	out := protocol.WorkspaceList{Workspaces: make([]protocol.Workspace, 0, len(ws))}
	for _, w := range ws {
		out.Workspaces = append(out.Workspaces, s.status(w))
	}
	if next != "" {
		out.NextCursor = &next
	}
	return c.JSON(http.StatusOK, out)
}

// release is DELETE /v1/workspaces/{id}: idempotent, never refused for
// funds, budgets, pauses or stops (spec §Release).
func (s *Server) release(c echo.Context) error {
	id := c.Param("id")
	if !policy.ValidID(id) {
		return errNotFound
	}
	a := authFrom(c)
	// Two round trips (termination.Terminator.Release): start the
	// termination, reading the record; after the provider's terminate,
	// record the end and settle. A starting workspace is finished by its
	// Acquire, which sees the release when it confirms; a terminating one
	// is retried here.
	w, err := s.term.Release(c.Request().Context(), a.Lease.AccountID, a.Lease.InstanceID, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return errNotFound
	case err != nil && !errors.Is(err, termination.ErrProvider):
		return unavailable(err)
	}
	return c.JSON(http.StatusOK, s.status(w))
}
