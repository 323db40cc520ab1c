package gateway

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/saga"
	"github.com/sandgate/sandgate/store"
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
		return answerJSON(c, http.StatusOK, s.status(res.Workspace, s.clock.Now()))
	}
	return answerJSON(c, http.StatusCreated, s.status(res.Workspace, s.clock.Now()))
}

func unavailable(err error) error { return saga.Unavailable(err) }

// requestCtx is c's request context carrying its request id, for the
// saga's log lines about it.
func requestCtx(c echo.Context) context.Context {
	return saga.WithRequestID(c.Request().Context(), requestID(c))
}

// usable returns the route's workspace, counting the request against the
// token's rate limit of class ("" for none), if it can take commands now
// (saga.Saga.Usable).
func (s *Server) usable(c echo.Context, class admission.Class) (sandgate.Workspace, error) {
	return s.saga.Usable(requestCtx(c), authFrom(c).Lease, c.Param("id"), class)
}

func (s *Server) getWorkspace(c echo.Context) error {
	w, err := s.saga.Workspace(requestCtx(c), authFrom(c).Lease, c.Param("id"))
	if err != nil {
		return err
	}
	now := s.clock.Now()
	if expired(w, now) {
		return errExpired
	}
	return answerJSON(c, http.StatusOK, s.status(w, now))
}

// expired reports whether w ended, or ends, at its expires_at by now:
// then every operation on it answers errExpired (spec §Acquire: "after it
// every operation on the workspace answers 410 workspace_gone"). One
// ended before its deadline (released, idle, …) still answers its
// status.
func expired(w sandgate.Workspace, now time.Time) bool {
	if now.Before(w.ExpiresAt) {
		return false
	}
	return w.State == sandgate.WorkspaceRunning || w.State == sandgate.WorkspaceStarting ||
		w.TerminationReason == sandgate.ReasonExpired
}

// errExpired is the answer about a workspace past its expires_at.
var errExpired = &protocol.Error{Code: protocol.WorkspaceGone, Reason: string(sandgate.ReasonExpired),
	Message: "the workspace reached its expires_at; acquire a new one"}

// status renders a workspace's status object. A running workspace past
// expires_at reads as terminating with reason expired until its end is
// confirmed (docs/protocol-notes.md). now is the clock reading the
// caller decided by, so one answer reads the clock once.
func (s *Server) status(w sandgate.Workspace, now time.Time) protocol.Workspace {
	out := protocol.Workspace{
		WorkspaceID:        w.ID,
		State:              string(w.State),
		Size:               w.Size,
		Image:              w.Image,
		CreatedAt:          protocol.Time(w.CreatedAt),
		ExpiresAt:          protocol.Time(w.ExpiresAt),
		IdleTimeoutSeconds: secs(w.IdleTimeout),
		TerminatedAt:       protocol.TimePtr(w.TerminatedAt),
	}
	reason := w.TerminationReason
	if w.State == sandgate.WorkspaceRunning && !now.Before(w.ExpiresAt) {
		out.State = string(sandgate.WorkspaceTerminating)
		reason = sandgate.ReasonExpired
	}
	if reason != "" && out.State != string(sandgate.WorkspaceRunning) && out.State != string(sandgate.WorkspaceStarting) {
		r := string(reason)
		out.TerminationReason = &r
	}
	if w.State == sandgate.WorkspaceTerminated && !w.StartedAt.IsZero() && !w.TerminatedAt.IsZero() {
		m := saga.Metered(w)
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
	now := s.clock.Now()
	ws, next, err := s.db.ListWorkspaces(c.Request().Context(), a.Lease.AccountID, a.Lease.InstanceID, q.Get("cursor"), limit, live, now)
	if errors.Is(err, store.ErrBadCursor) {
		return errInvalid("cursor is not one this broker returned")
	}
	if err != nil {
		return unavailable(err)
	}
	out := protocol.WorkspaceList{Workspaces: make([]protocol.Workspace, 0, len(ws))}
	for _, w := range ws {
		out.Workspaces = append(out.Workspaces, s.status(w, now))
	}
	if next != "" {
		out.NextCursor = &next
	}
	return answerJSON(c, http.StatusOK, out)
}

// release is DELETE /v1/workspaces/{id}: idempotent, never refused for
// funds, budgets, pauses or stops (spec §Release).
// A workspace that was still live at its expires_at answers errExpired,
// once the release has started its end (recorded with reason expired, so
// a status read answers the same; the release costs no read of its own:
// its two round trips answer the record).
func (s *Server) release(c echo.Context) error {
	w, err := s.saga.Release(c.Request().Context(), authFrom(c).Lease, c.Param("id"))
	if err != nil {
		return err
	}
	now := s.clock.Now()
	if expired(w, now) {
		return errExpired
	}
	return answerJSON(c, http.StatusOK, s.status(w, now))
}
