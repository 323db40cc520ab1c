package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
)

// restoreMargin keeps a warm start's restore clear of the workspace's
// pending deadline, past which its slot would be freed under it.
const restoreMargin = 10 * time.Second

// acquire is POST /v1/workspaces, in the spec's order: authenticate →
// idempotency replay → validate (the snapshot included) → admission →
// provider create → restore.
func (s *Server) acquire(c echo.Context) error {
	ctx := c.Request().Context()
	a := authFrom(c)
	key := c.Request().Header.Get(protocol.HeaderIdempotencyKey)
	if err := policy.ValidateIdempotencyKey(key); err != nil {
		return err
	}
	var req protocol.AcquireRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	keyHash := hashString(key)
	reqHash := acquireHash(req)

	// spec §Idempotency: a replay answers the original resource, before validation.
	if rec, err := s.db.Idempotency(ctx, a.Lease.AccountID, a.Lease.InstanceID, store.OpAcquire, keyHash); err == nil {
		return s.replayAcquire(c, rec, reqHash)
	} else if !errors.Is(err, store.ErrNotFound) {
		// The store is unreachable before admission could run: new work
		// fails closed with admission's own code (spec §Broker obligations).
		return admissionUnavailable(err)
	}

	now := s.clock.Now()
	scope := s.effectiveScope(a.Instance.Scope)
	ws, env, err := s.validateAcquire(req, scope, now)
	if err != nil {
		return err
	}
	snap, err := s.warmStart(c, req.SnapshotID, now)
	if err != nil {
		return err
	}
	ws.ID = sandgate.NewID(sandgate.PrefixWorkspace)
	ws.AccountID, ws.InstanceID = a.Lease.AccountID, a.Lease.InstanceID

	err = s.admit.Admit(ctx, &admission.Request{
		Workspace: ws.Workspace, Scope: scope,
		Keys:    store.AdmissionKeys(ws.AccountID, ws.InstanceID, ws.ID, keyHash),
		KeyHash: keyHash, RequestHash: reqHash, Now: now,
	})
	if rec, ok := admission.IsReplay(err); ok { // a concurrent request claimed the key first
		return s.replayAcquire(c, rec, reqHash)
	}
	if err != nil {
		return err
	}
	s.bill.FlushAlerts(ctx, ws.AccountID)

	// The create must finish even if the client goes away: the slot and
	// the key are already held, and only this goroutine can settle them.
	ctx = context.WithoutCancel(ctx)
	cctx, cancel := context.WithTimeout(ctx, s.cfg.CreateTimeout)
	size, _ := sandgate.LookupSize(ws.Size)
	sb, err := s.provider.Create(cctx, providers.CreateSpec{
		WorkspaceID: ws.ID, InstanceID: ws.InstanceID, Size: size, Image: ws.Image,
		Env: env, Egress: sandgate.EgressPolicy{AllowedDomains: ws.egress}, ExpiresAt: ws.ExpiresAt, IdleTimeout: ws.IdleTimeout,
	})
	cancel()
	if err != nil {
		if aerr := s.db.Abort(ctx, ws.Workspace, keyHash); aerr != nil {
			s.log.Error("abort after failed create", sandgate.WorkspaceAttr(ws.ID), slog.Any("err", aerr))
		}
		// Nothing ran: the hold goes back uncharged.
		if rerr := s.bill.Release(ctx, ws.Workspace); rerr != nil {
			s.log.Error("release hold after failed create", sandgate.WorkspaceAttr(ws.ID), slog.Any("err", rerr))
		}
		if errors.Is(err, providers.ErrNoCapacity) {
			return &protocol.Error{Code: protocol.Unavailable, Message: "the sandbox provider has no capacity for a new workspace now; retry later", RetryAfter: time.Minute, Err: err}
		}
		return &protocol.Error{Code: protocol.UpstreamError, Message: "the sandbox provider could not create the workspace; retry with the same Idempotency-Key", Err: err}
	}
	if s.cfg.AfterCreate != nil {
		s.cfg.AfterCreate(ws.ID)
	}
	if snap != nil {
		// Warm start: the directory comes back at the same path before the
		// 201, within the workspace's pending deadline.
		rctx, cancel := context.WithTimeout(ctx, min(s.cfg.SnapshotTimeout, now.Add(s.db.Config().PendingTimeout-restoreMargin).Sub(s.clock.Now())))
		err := s.provider.Restore(rctx, sb, providers.SnapshotRef{ID: snap.ID, Ref: snap.ProviderRef}, snap.Dir)
		cancel()
		if err != nil {
			// spec §Acquire: a failure after provider create terminates
			// what was created before answering. The key is freed, so a
			// retry re-evaluates; the workspace stays listed as failed.
			s.terminateSandbox(ctx, ws.Workspace, sb.Ref, sandgate.ReasonFailed)
			if ferr := s.db.FreeKey(ctx, ws.AccountID, ws.InstanceID, store.OpAcquire, keyHash); ferr != nil {
				s.log.Error("free key after failed restore", sandgate.WorkspaceAttr(ws.ID), slog.Any("err", ferr))
			}
			return restoreError(err)
		}
	}
	started := sb.StartedAt
	if started.IsZero() {
		started = s.clock.Now()
	}
	ok, err := s.db.Confirm(ctx, ws.Workspace, sb.Ref, started, keyHash, reqHash)
	if err != nil || !ok {
		// Released while starting, pending slot lost, or Redis failed:
		// nothing may run that the broker does not account for.
		s.terminateSandbox(ctx, ws.Workspace, sb.Ref, sandgate.ReasonFailed)
		if err != nil {
			return unavailable(err)
		}
	}
	cur, err := s.db.Workspace(ctx, ws.AccountID, ws.ID)
	if err != nil {
		return unavailable(err)
	}
	return c.JSON(http.StatusCreated, s.status(cur))
}

// terminateSandbox ends a sandbox that Confirm refused and records the end.
func (s *Server) terminateSandbox(ctx context.Context, w sandgate.Workspace, ref string, reason sandgate.TerminationReason) {
	w.ProviderRef = ref
	if _, _, err := s.db.BeginTerminate(ctx, w, reason, s.clock.Now()); err != nil {
		s.log.Error("terminate: record", sandgate.WorkspaceAttr(w.ID), slog.Any("err", err))
	}
	s.term.Finish(ctx, w)
}

func (s *Server) replayAcquire(c echo.Context, rec store.IdemRecord, reqHash string) error {
	if rec.Hash != reqHash {
		return protocol.E(protocol.IdempotencyConflict, "this Idempotency-Key was used with a different request")
	}
	if rec.State != store.IdemDone {
		return &protocol.Error{Code: protocol.IdempotencyInProgress,
			Message: "the original request with this Idempotency-Key is still running", RetryAfter: time.Second}
	}
	a := authFrom(c)
	w, err := s.db.Workspace(c.Request().Context(), a.Lease.AccountID, rec.WorkspaceID)
	if errors.Is(err, store.ErrNotFound) {
		return protocol.E(protocol.WorkspaceGone, "the workspace this Idempotency-Key created is gone")
	}
	if err != nil {
		return unavailable(err)
	}
	return c.JSON(http.StatusOK, s.status(w))
}

// pendingWorkspace is a validated Acquire: the record to admit and the
// parts that are never persisted.
type pendingWorkspace struct {
	sandgate.Workspace
	egress []string
}

func (s *Server) validateAcquire(req protocol.AcquireRequest, scope sandgate.Scope, now time.Time) (pendingWorkspace, map[string]string, error) {
	if err := policy.ValidateLabel(req.Label); err != nil {
		return pendingWorkspace{}, nil, err
	}
	if err := policy.ValidateAgent(req.Agent); err != nil {
		return pendingWorkspace{}, nil, err
	}
	if err := policy.ValidateRunID(req.RunID); err != nil {
		return pendingWorkspace{}, nil, err
	}
	size, err := policy.ResolveSize(scope, req.Size)
	if err != nil {
		return pendingWorkspace{}, nil, err
	}
	image, err := policy.ResolveImage(scope, req.Image)
	if err != nil {
		return pendingWorkspace{}, nil, err
	}
	if err := policy.ValidateEnv(req.Env, scope.Limits.MaxEnvEntries); err != nil {
		return pendingWorkspace{}, nil, err
	}
	domains, err := policy.CheckEgress(req.Egress, scope.EgressCeiling, scope.Limits.MaxEgressDomains)
	if err != nil {
		return pendingWorkspace{}, nil, err
	}
	lim := scope.Limits
	w := pendingWorkspace{
		Workspace: sandgate.Workspace{
			Label: req.Label, Size: size.Name, Image: image, Agent: req.Agent, RunID: req.RunID,
			State: sandgate.WorkspaceStarting, CreatedAt: now.Truncate(time.Second),
			ExpiresAt: now.Truncate(time.Second).Add(lim.MaxLifetime), IdleTimeout: lim.IdleTimeout,
		},
		egress: domains,
	}
	return w, req.Env, nil
}

// acquireHash is the canonical hash of an Acquire request: the fields as
// sent, with env values replaced by their hashes (spec §Idempotency).
func acquireHash(req protocol.AcquireRequest) string {
	env := make(map[string]string, len(req.Env))
	for k, v := range req.Env {
		env[k] = hashString(v)
	}
	canon := struct {
		Label, Size, Image, SnapshotID, Agent, RunID string
		Env                                          map[string]string
		Egress                                       []string
		EgressSet                                    bool
	}{req.Label, req.Size, req.Image, req.SnapshotID, req.Agent, req.RunID, env, nil, req.Egress != nil}
	if req.Egress != nil {
		canon.Egress = req.Egress.AllowedDomains
	}
	b, _ := json.Marshal(canon) // maps marshal with sorted keys
	return hashString(string(b))
}

func hashString(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// admissionUnavailable is admission's fail-closed refusal, for a store
// failure on an Acquire's way to the admission script.
func admissionUnavailable(err error) error {
	return &protocol.Error{Code: protocol.AdmissionUnavailable, Message: "the broker cannot evaluate admission; retry shortly", RetryAfter: time.Second, Err: err}
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
// round trip as the read: exec and files cost two round trips in all.
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
	if limited != nil {
		if lerr := limited(); protocol.CodeOf(lerr) == protocol.RateLimited {
			return sandgate.Workspace{}, lerr
		} else if lerr != nil && err == nil {
			s.log.Warn("rate limiter unavailable; request let through", slog.String(sandgate.KeyRequestID, requestID(c)), slog.Any("err", lerr))
		}
	}
	if errors.Is(err, store.ErrNotFound) || (err == nil && w.InstanceID != a.Lease.InstanceID) {
		return sandgate.Workspace{}, errNotFound
	}
	if err != nil {
		return sandgate.Workspace{}, unavailable(err)
	}
	return w, nil
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
	switch {
	case w.GoneAt(now):
		s.expireIfDue(c.Request().Context(), w, now)
		return w, protocol.E(protocol.WorkspaceGone, "the workspace has ended; acquire a new one")
	case w.State == sandgate.WorkspaceStarting:
		return w, &protocol.Error{Code: protocol.WorkspaceNotReady, Message: "the workspace is still starting; retry shortly", RetryAfter: time.Second}
	}
	return w, nil
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
	w, err := s.loadWorkspace(c)
	if err != nil {
		return err
	}
	ctx := context.WithoutCancel(c.Request().Context())
	// A starting workspace is finished by its Acquire, which sees the
	// release when it confirms; a terminating one is retried here.
	if _, err := s.term.Terminate(ctx, w, sandgate.ReasonReleased); err != nil && !errors.Is(err, termination.ErrProvider) && !errors.Is(err, store.ErrNotFound) {
		return unavailable(err)
	}
	cur, err := s.db.Workspace(ctx, w.AccountID, w.ID)
	if err != nil {
		return unavailable(err)
	}
	return c.JSON(http.StatusOK, s.status(cur))
}
