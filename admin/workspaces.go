package admin

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
)

// Single workspaces across accounts and instances: list, show and end one
// (roles admin and operator). An operator's kill ends the workspace with
// termination_reason emergency_stopped, the spec's reason for "the broker's
// operator stopped execution"; no other reason of the spec's set says that
// an operator ended it (docs/protocol-notes.md).

// KillReason is the termination_reason of a workspace an operator ends
// with DELETE /admin/v1/workspaces/{id}.
const KillReason = sandgate.ReasonEmergencyStopped

// workspaceRoutes adds the per-workspace routes; New calls it with its
// route helper.
func (s *Server) workspaceRoutes(route func(method, path, action string, h echo.HandlerFunc, roles []adminapi.Role)) {
	ops := []adminapi.Role{adminapi.RoleAdmin, adminapi.RoleOperator}
	route(http.MethodGet, "/workspaces", "workspace.list", s.listWorkspaces, ops)
	route(http.MethodGet, "/workspaces/:id", "workspace.get", s.getWorkspace, ops)
	route(http.MethodDelete, "/workspaces/:id", "workspace.kill", s.killWorkspace, ops)
}

// toWorkspace renders w as of now.
func toWorkspace(w sandgate.Workspace, now time.Time) adminapi.Workspace {
	out := adminapi.Workspace{
		ID: w.ID, AccountID: w.AccountID, InstanceID: w.InstanceID, Provider: w.Provider,
		Label: w.Label, Agent: w.Agent, RunID: w.RunID, Size: w.Size, Image: w.Image, State: string(w.State),
		CreatedAt: protocol.Time(w.CreatedAt), StartedAt: protocol.TimePtr(w.StartedAt), ExpiresAt: protocol.Time(w.ExpiresAt),
		TerminatedAt: protocol.TimePtr(w.TerminatedAt), Currency: w.Price.Currency, UnitPrice: w.Price.UnitMicros,
	}
	if out.Provider == "" {
		out.Provider = "local" // records written before providers had names
	}
	if w.TerminationReason != "" {
		r := string(w.TerminationReason)
		out.TerminationReason = &r
	}
	if out.Currency == "" {
		out.Currency = billing.NoCurrency
	}
	end := now
	if w.State == sandgate.WorkspaceTerminated {
		out.MeteredSeconds, _ = billing.Metered(w)
		end = w.TerminatedAt
	} else {
		to := now
		if !w.ExpiresAt.IsZero() && to.After(w.ExpiresAt) {
			to = w.ExpiresAt
		}
		out.MeteredSeconds = billing.MeteredSeconds(w.StartedAt, to)
	}
	if end.After(w.CreatedAt) {
		out.AgeSeconds = int64(end.Sub(w.CreatedAt) / time.Second)
	}
	out.AmountMicros, _ = billing.Amount(w.Price.UnitMicros, out.MeteredSeconds)
	out.Amount = billing.FormatMinor(out.AmountMicros, out.Currency)
	return out
}

// workspaceFilter is the query of GET /admin/v1/workspaces.
type workspaceFilter struct {
	account, instance, provider string
	states                      []sandgate.WorkspaceState // nil: every state
	all                         bool                      // terminated ones too
	after, before               time.Time                 // created_at in [after, before); zero: unbounded
	limit                       int
	afterMS                     int64 // the cursor: the last row of the previous page
	afterID                     string
}

func parseWorkspaceFilter(c echo.Context) (workspaceFilter, error) {
	q := c.QueryParams()
	f := workspaceFilter{account: q.Get("account"), instance: q.Get("instance"), provider: q.Get("provider"), limit: 100}
	switch st := q.Get("state"); st {
	case "", "live":
		f.states = []sandgate.WorkspaceState{sandgate.WorkspaceStarting, sandgate.WorkspaceRunning, sandgate.WorkspaceTerminating}
	case "all":
		f.all = true
	case string(sandgate.WorkspaceStarting), string(sandgate.WorkspaceRunning), string(sandgate.WorkspaceTerminating):
		f.states = []sandgate.WorkspaceState{sandgate.WorkspaceState(st)}
	case string(sandgate.WorkspaceTerminated):
		f.states, f.all = []sandgate.WorkspaceState{sandgate.WorkspaceTerminated}, true
	default:
		return f, invalid("state must be live (the default), all, starting, running, terminating or terminated")
	}
	if err := queryTime(c, "created_after", &f.after); err != nil {
		return f, err
	}
	if err := queryTime(c, "created_before", &f.before); err != nil {
		return f, err
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 500 {
			return f, invalid("limit must be 1 to 500 (default 100)")
		}
		f.limit = n
	}
	if v := q.Get("cursor"); v != "" {
		b, err := base64.RawURLEncoding.DecodeString(v)
		ms, id, ok := strings.Cut(string(b), ":")
		n, perr := strconv.ParseInt(ms, 10, 64)
		if err != nil || !ok || perr != nil || id == "" {
			return f, invalid("cursor is not one this API returned")
		}
		f.afterMS, f.afterID = n, id
	}
	return f, nil
}

func workspaceCursor(w sandgate.Workspace) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(w.CreatedAt.UnixMilli(), 10) + ":" + w.ID))
}

// listWorkspaces is GET /workspaces: the workspaces of every account
// (or of one account, instance or provider) in creation order, then id,
// a page at a time. The cursor names the last row returned, so rows
// created or ended during a walk never shift it.
func (s *Server) listWorkspaces(c echo.Context) error {
	f, err := parseWorkspaceFilter(c)
	if err != nil {
		return err
	}
	out, err := s.workspaces(c.Request().Context(), f)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

// workspaces returns the page of workspaces f selects.
func (v *service) workspaces(ctx context.Context, f workspaceFilter) (adminapi.WorkspaceList, error) {
	acct := f.account
	if f.instance != "" {
		in, err := v.instanceByID(ctx, f.instance)
		if err != nil {
			return adminapi.WorkspaceList{}, err
		}
		if acct != "" && acct != in.AccountID {
			return adminapi.WorkspaceList{Workspaces: []adminapi.Workspace{}}, nil
		}
		acct = in.AccountID
	} else if acct != "" {
		if err := v.account(ctx, acct); err != nil {
			return adminapi.WorkspaceList{}, err
		}
	}
	now := v.clock.Now()
	ws, err := v.db.Workspaces(ctx, acct, f.instance, f.all, now)
	if err != nil {
		return adminapi.WorkspaceList{}, storeFailed(err)
	}
	ws = slices.DeleteFunc(ws, func(w sandgate.Workspace) bool {
		prov := cmp.Or(w.Provider, "local")
		created := w.CreatedAt.UnixMilli()
		return (f.provider != "" && prov != f.provider) ||
			(f.states != nil && !slices.Contains(f.states, w.State)) ||
			(!f.after.IsZero() && w.CreatedAt.Before(f.after)) ||
			(!f.before.IsZero() && !w.CreatedAt.Before(f.before)) ||
			(f.afterID != "" && (created < f.afterMS || created == f.afterMS && w.ID <= f.afterID))
	})
	slices.SortFunc(ws, func(a, b sandgate.Workspace) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	out := adminapi.WorkspaceList{Workspaces: []adminapi.Workspace{}}
	if len(ws) > f.limit {
		ws = ws[:f.limit]
		next := workspaceCursor(ws[len(ws)-1])
		out.NextCursor = &next
	}
	for _, w := range ws {
		out.Workspaces = append(out.Workspaces, toWorkspace(w, now))
	}
	return out, nil
}

// workspace returns the workspace id names. Returns NotFound.
func (v *service) workspace(ctx context.Context, id string) (sandgate.Workspace, error) {
	w, err := v.db.FindWorkspace(ctx, id)
	return found(w, err, "workspace")
}

func (s *Server) getWorkspace(c echo.Context) error {
	id := c.Param("id")
	note(c).target = "workspace:" + id
	w, err := s.workspace(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toWorkspace(w, s.clock.Now()))
}

// killWorkspace is DELETE /workspaces/{id}: it ends one workspace now
// with reason emergency_stopped (KillReason) and answers its status. A
// workspace already terminated answers as it is (a kill is idempotent);
// one still starting is ended by its Acquire when the create returns
// (state terminating). When the provider does not confirm the end the
// workspace stays terminating, the reaper retries it, and the answer is
// 502 upstream_error.
func (s *Server) killWorkspace(c echo.Context) error {
	out, ch, err := s.kill(c.Request().Context(), c.Param("id"), operator(c).Actor())
	return answer(c, http.StatusOK, out, ch, err)
}

// kill ends the workspace id with KillReason and returns it as it is now.
func (v *service) kill(ctx context.Context, id, actor string) (adminapi.Workspace, change, error) {
	ch := change{target: "workspace:" + id}
	w, err := v.workspace(ctx, id)
	if err != nil {
		return adminapi.Workspace{}, ch, err
	}
	ch.before = toWorkspace(w, v.clock.Now())
	// Terminate also finishes a workspace already terminating, and
	// outlives the request.
	ok, err := v.term.Terminate(ctx, w, KillReason)
	res := termination.Result{}
	switch {
	case errors.Is(err, store.ErrNotFound):
		return adminapi.Workspace{}, ch, protocol.E(protocol.NotFound, "no such workspace")
	case err != nil:
		res.Failed = 1
	case ok || w.State == sandgate.WorkspaceStarting:
		res.Terminated = 1
	}
	ch.swept = &res
	cur, gerr := v.db.Workspace(context.WithoutCancel(ctx), w.AccountID, w.ID)
	if gerr != nil {
		cur = w
	}
	after := toWorkspace(cur, v.clock.Now())
	ch.after = after
	v.log.Info("workspace killed", sandgate.WorkspaceAttr(w.ID), slog.String(sandgate.KeyAccountID, w.AccountID),
		slog.Bool("confirmed", err == nil && ok), slog.String("actor", actor))
	if err != nil {
		if errors.Is(err, termination.ErrProvider) {
			return after, ch, &protocol.Error{Code: protocol.UpstreamError, Err: err,
				Message: "the provider did not confirm the end; the workspace is terminating and the broker retries it"}
		}
		return after, ch, storeFailed(err)
	}
	return after, ch, nil
}
