package admin

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/protocol"
)

// Detail reads for the console's pages of one workspace and one account,
// and the refusals by code that every gateway process counts in the
// store.

// recentWorkspaces is how many of an account's workspaces its detail lists.
const recentWorkspaces = 20

// refusalWindows are the windows GET /refusals counts over.
var refusalWindows = map[string]time.Duration{"1h": time.Hour, "24h": 24 * time.Hour, "7d": 7 * 24 * time.Hour}

// detailRoutes adds the detail routes; New calls it with its route helper.
func (s *Server) detailRoutes(route func(method, path, action string, h echo.HandlerFunc, roles []adminapi.Role)) {
	all := []adminapi.Role{adminapi.RoleAdmin, adminapi.RoleOperator, adminapi.RoleFinance}
	ops := []adminapi.Role{adminapi.RoleAdmin, adminapi.RoleOperator}
	route(http.MethodGet, "/accounts/:id", "account.get", s.getAccount, all)
	route(http.MethodGet, "/workspaces/:id/detail", "workspace.detail", s.workspaceDetail, ops)
	route(http.MethodGet, "/refusals", "refusal.count", s.countRefusals, ops)
}

// workspaceDetail is GET /workspaces/{id}/detail.
func (s *Server) workspaceDetail(c echo.Context) error {
	w, err := s.workspace(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	out := toWorkspaceDetail(w, s.clock.Now())
	s.name(c.Request().Context(), &out.Workspace)
	return c.JSON(http.StatusOK, out)
}

func toWorkspaceDetail(w sandgate.Workspace, now time.Time) adminapi.WorkspaceDetail {
	out := adminapi.WorkspaceDetail{Workspace: toWorkspace(w, now), EgressDomains: w.AllowedDomains(),
		EgressBytesOut: w.EgressBytesOut, EgressBytesIn: w.EgressBytesIn}
	if out.EgressDomains == nil {
		out.EgressDomains = []string{}
	}
	out.History = []adminapi.StateChange{{State: string(sandgate.WorkspaceStarting), At: protocol.Time(w.CreatedAt)}}
	if !w.StartedAt.IsZero() {
		out.History = append(out.History, adminapi.StateChange{State: string(sandgate.WorkspaceRunning), At: protocol.Time(w.StartedAt)})
	}
	if !w.TerminatedAt.IsZero() {
		out.History = append(out.History, adminapi.StateChange{State: string(sandgate.WorkspaceTerminated),
			At: protocol.Time(w.TerminatedAt), Reason: string(w.TerminationReason)})
	}
	return out
}

// getAccount is GET /accounts/{id}: the account's summary, with the parts
// of it the operator's role reads (adminapi.AccountDetail).
func (s *Server) getAccount(c echo.Context) error {
	ctx, id := c.Request().Context(), c.Param("id")
	a, err := s.db.Account(ctx, id)
	if a, err = found(a, err, "account"); err != nil {
		return err
	}
	out := adminapi.AccountDetail{Account: toAccount(a)}
	states, err := s.bill.States(ctx, []string{id})
	if err != nil {
		return storeFailed(err)
	}
	out.Account.Billing = states[id]
	b, err := s.bill.Balance(ctx, id)
	if err != nil {
		return storeFailed(err)
	}
	out.Balance = toBalance(b)
	if out.Budgets, err = s.budgets(ctx, id); err != nil {
		return storeFailed(err)
	}
	if r := operator(c).Role; r == adminapi.RoleAdmin || r == adminapi.RoleOperator {
		if err := s.accountOps(ctx, id, &out); err != nil {
			return err
		}
	}
	return c.JSON(http.StatusOK, out)
}

// accountOps fills the parts of an account's detail for roles admin and
// operator: instances and tokens, limits, recent workspaces, refusals.
func (v *service) accountOps(ctx context.Context, id string, out *adminapi.AccountDetail) error {
	ins, err := v.db.Instances(ctx, id)
	if err != nil {
		return storeFailed(err)
	}
	out.Instances = []adminapi.InstanceDetail{}
	for _, in := range ins {
		ls, err := v.leases(ctx, in)
		if err != nil {
			return err
		}
		out.Instances = append(out.Instances, adminapi.InstanceDetail{Instance: toInstance(in), Tokens: ls})
	}
	l, err := v.db.Risk(ctx, id)
	if err != nil {
		return storeFailed(err)
	}
	lim := toRiskLimits(l)
	out.Limits = &lim
	now := v.clock.Now()
	ws, err := v.db.Workspaces(ctx, id, "", true, now)
	if err != nil {
		return storeFailed(err)
	}
	slices.SortFunc(ws, func(a, b sandgate.Workspace) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), cmp.Compare(b.ID, a.ID))
	})
	out.Workspaces = []adminapi.Workspace{}
	for _, w := range ws[:min(len(ws), recentWorkspaces)] {
		out.Workspaces = append(out.Workspaces, toWorkspace(w, now))
	}
	rc, err := v.refusals(ctx, id, "24h", now)
	if err != nil {
		return err
	}
	out.Refusals = &rc
	return nil
}

// countRefusals is GET /refusals?window=1h|24h|7d[&account=ID]: the
// requests of protocol v1 refused over the window (24h by default), by
// code, broker wide or of one account's tokens.
func (s *Server) countRefusals(c echo.Context) error {
	window := cmp.Or(c.QueryParam("window"), "24h")
	if _, ok := refusalWindows[window]; !ok {
		return invalid("window must be 1h, 24h or 7d")
	}
	ctx, acct := c.Request().Context(), c.QueryParam("account")
	if acct != "" {
		if err := s.account(ctx, acct); err != nil {
			return err
		}
	}
	out, err := s.refusals(ctx, acct, window, s.clock.Now())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

// refusals counts the refusals of the named window ending at now.
func (v *service) refusals(ctx context.Context, acct, window string, now time.Time) (adminapi.RefusalCounts, error) {
	counts, since, err := v.db.RefusalCounts(ctx, acct, refusalWindows[window], now)
	if err != nil {
		return adminapi.RefusalCounts{}, storeFailed(err)
	}
	out := adminapi.RefusalCounts{Window: window, Since: protocol.Time(since), Counts: make([]adminapi.RefusalCount, 0, len(counts))}
	for code, n := range counts {
		out.Counts = append(out.Counts, adminapi.RefusalCount{Code: code, Count: n})
	}
	slices.SortFunc(out.Counts, func(a, b adminapi.RefusalCount) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Code, b.Code))
	})
	return out, nil
}
