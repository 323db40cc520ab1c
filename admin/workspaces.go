package admin

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"slices"
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
	account, instance, provider string                    // account and instance: an id or a name
	states                      []sandgate.WorkspaceState // nil: every state
	all                         bool                      // terminated ones too
	after, before               time.Time                 // created_at in [after, before); zero: unbounded
	list                        listQuery
}

// workspaceSorts are the columns the workspace list sorts by. Age sorts
// by creation, youngest first, so that a walk's order does not change as
// the rows grow older.
var workspaceSorts = []string{"created", "age", "state", "account", "instance", "provider", "id", "expires"}

func parseWorkspaceFilter(c echo.Context) (workspaceFilter, error) {
	q := c.QueryParams()
	f := workspaceFilter{account: strings.TrimSpace(q.Get("account")), instance: strings.TrimSpace(q.Get("instance")), provider: q.Get("provider")}
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
	var err error
	f.list, err = parseList(c, workspaceSorts, "created", 100)
	return f, err
}

// listWorkspaces is GET /workspaces: the workspaces of every account (or
// of one account or instance, by id or name, or of one provider), or
// those whose id or label, or whose account's or instance's name, starts
// with q; in creation order (or sort), then id, a page at a time.
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
	acct, inst := "", ""
	if f.account != "" {
		var err error
		if acct, err = v.accountByRef(ctx, f.account); err != nil {
			return adminapi.WorkspaceList{}, err
		}
	}
	if f.instance != "" {
		in, err := v.instanceByRef(ctx, acct, f.instance)
		if err != nil {
			return adminapi.WorkspaceList{}, err
		}
		if acct != "" && acct != in.AccountID {
			return adminapi.WorkspaceList{Workspaces: []adminapi.Workspace{}}, nil
		}
		acct, inst = in.AccountID, in.ID
	}
	now := v.clock.Now()
	ws, err := v.db.Workspaces(ctx, acct, inst, f.all, now)
	if err != nil {
		return adminapi.WorkspaceList{}, storeFailed(err)
	}
	as, err := v.db.Accounts(ctx)
	if err != nil {
		return adminapi.WorkspaceList{}, storeFailed(err)
	}
	n, err := v.namesOf(ctx, as)
	if err != nil {
		return adminapi.WorkspaceList{}, err
	}
	ws = slices.DeleteFunc(ws, func(w sandgate.Workspace) bool {
		prov := cmp.Or(w.Provider, "local")
		return (f.provider != "" && prov != f.provider) ||
			(f.states != nil && !slices.Contains(f.states, w.State)) ||
			(!f.after.IsZero() && w.CreatedAt.Before(f.after)) ||
			(!f.before.IsZero() && !w.CreatedAt.Before(f.before)) ||
			!f.list.matches(w.ID, w.Label, n.accounts[w.AccountID], n.instances[w.InstanceID])
	})
	ws, next := page(f.list, ws, map[string]sortKey[sandgate.Workspace]{
		"created":  func(w sandgate.Workspace) string { return timeKey(w.CreatedAt.UnixNano()) },
		"age":      func(w sandgate.Workspace) string { return timeKey(math.MaxInt64 - w.CreatedAt.UnixNano()) },
		"state":    func(w sandgate.Workspace) string { return string(w.State) },
		"account":  func(w sandgate.Workspace) string { return store.AccountNameKey(n.accounts[w.AccountID]) },
		"instance": func(w sandgate.Workspace) string { return strings.ToLower(n.instances[w.InstanceID]) },
		"provider": func(w sandgate.Workspace) string { return cmp.Or(w.Provider, "local") },
		"id":       func(w sandgate.Workspace) string { return w.ID },
		"expires":  func(w sandgate.Workspace) string { return timeKey(w.ExpiresAt.UnixNano()) },
	}, func(w sandgate.Workspace) string { return w.ID })
	out := adminapi.WorkspaceList{Workspaces: []adminapi.Workspace{}}
	if next != "" {
		out.NextCursor = &next
	}
	for _, w := range ws {
		out.Workspaces = append(out.Workspaces, n.named(toWorkspace(w, now)))
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
	out := toWorkspace(w, s.clock.Now())
	s.name(c.Request().Context(), &out)
	return c.JSON(http.StatusOK, out)
}

// name sets the names of w's account and instance. Names are a
// courtesy: a workspace answers without them.
func (s *Server) name(ctx context.Context, w *adminapi.Workspace) {
	if a, err := s.db.Account(ctx, w.AccountID); err == nil {
		w.AccountName = a.Name
	}
	if in, err := s.db.InstanceOf(ctx, w.AccountID, w.InstanceID); err == nil {
		w.InstanceName = in.Name
	}
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
