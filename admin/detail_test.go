package admin_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admin"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/fakeprovider"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
	"github.com/sandgate/sandgate/token"
)

func TestWorkspaceDetail(t *testing.T) {
	e := newEnv(t)
	acct := e.account()
	inst := e.instance(acct)
	w := e.running(acct, inst, 1)[0]
	var d adminapi.WorkspaceDetail
	e.do(operatorToken, http.MethodGet, "/workspaces/"+w.ID+"/detail", nil, &d)
	if d.Workspace.ID != w.ID || d.Workspace.AccountID != acct || len(d.History) != 2 ||
		d.History[0].State != "starting" || d.History[1].State != "running" || d.EgressDomains == nil {
		t.Fatalf("detail of a running workspace = %+v; want it with history starting, running", d)
	}
	e.do(operatorToken, http.MethodDelete, "/workspaces/"+w.ID, nil, nil)
	e.do(adminToken, http.MethodGet, "/workspaces/"+w.ID+"/detail", nil, &d)
	if n := len(d.History); n != 3 || d.History[2].State != "terminated" || d.History[2].Reason != string(admin.KillReason) {
		t.Errorf("history after a kill = %+v; want it to end terminated, %s", d.History, admin.KillReason)
	}
	if st, code := e.refused(financeToken, http.MethodGet, "/workspaces/"+w.ID+"/detail", nil); st != 403 || code != "forbidden" {
		t.Errorf("finance's workspace detail = %d %s; want 403 forbidden", st, code)
	}
	if st, code := e.refused(adminToken, http.MethodGet, "/workspaces/ws_nope/detail", nil); st != 404 || code != "not_found" {
		t.Errorf("unknown workspace's detail = %d %s; want 404 not_found", st, code)
	}
}

// An account's summary: every role reads its balance and budgets; admin
// and operator also its instances with tokens, limits, workspaces and
// refusals, finance none of those.
func TestAccountDetailByRole(t *testing.T) {
	e := newEnv(t)
	acct := e.account()
	inst := e.instance(acct)
	var tok adminapi.IssuedToken
	e.do(adminToken, http.MethodPost, "/instances/"+inst+"/tokens", adminapi.IssueTokenRequest{}, &tok)
	ws := e.running(acct, inst, 2)
	if err := e.db.CountRefusals(context.Background(), []store.Refusal{{Code: "rate_limited", At: e.clock.Now(), Account: acct}}); err != nil {
		t.Fatal(err)
	}
	var d adminapi.AccountDetail
	e.do(operatorToken, http.MethodGet, "/accounts/"+acct, nil, &d)
	if d.Account.ID != acct || d.Budgets == nil || len(d.Instances) != 1 || d.Instances[0].Instance.ID != inst ||
		len(d.Instances[0].Tokens) != 1 || d.Instances[0].Tokens[0].ID != tok.LeaseID || d.Instances[0].Tokens[0].TokenPrefix == "" || d.Limits == nil ||
		len(d.Workspaces) != 2 || d.Refusals == nil || !slices.Equal(d.Refusals.Counts, []adminapi.RefusalCount{{Code: "rate_limited", Count: 1}}) {
		t.Fatalf("operator's account detail = %+v; want instances, tokens, limits, 2 workspaces and 1 refusal", d)
	}
	if got := []string{d.Workspaces[0].ID, d.Workspaces[1].ID}; !slices.Contains(got, ws[0].ID) || !slices.Contains(got, ws[1].ID) {
		t.Errorf("recent workspaces = %v; want %s and %s", got, ws[0].ID, ws[1].ID)
	}
	var f adminapi.AccountDetail
	e.do(financeToken, http.MethodGet, "/accounts/"+acct, nil, &f)
	if f.Account.ID != acct || f.Instances != nil || f.Limits != nil || f.Workspaces != nil || f.Refusals != nil {
		t.Errorf("finance's account detail = %+v; want the account and its money only", f)
	}
	if st, code := e.refused(financeToken, http.MethodGet, "/accounts/acct_nope", nil); st != 404 || code != "not_found" {
		t.Errorf("unknown account = %d %s; want 404 not_found", st, code)
	}
}

func TestRefusalWindows(t *testing.T) {
	e := newEnv(t)
	now := e.clock.Now()
	ctx := context.Background()
	var rs []store.Refusal
	for _, r := range []struct {
		code string
		ago  time.Duration
	}{{"rate_limited", 0}, {"rate_limited", 30 * time.Minute}, {"not_found", 3 * time.Hour}, {"unauthenticated", 3 * 24 * time.Hour}, {"conflict", 9 * 24 * time.Hour}} {
		rs = append(rs, store.Refusal{Code: r.code, At: now.Add(-r.ago)})
	}
	if err := e.db.CountRefusals(ctx, rs); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		window string
		want   []adminapi.RefusalCount
	}{
		{"1h", []adminapi.RefusalCount{{Code: "rate_limited", Count: 2}}},
		{"24h", []adminapi.RefusalCount{{Code: "rate_limited", Count: 2}, {Code: "not_found", Count: 1}}},
		{"7d", []adminapi.RefusalCount{{Code: "rate_limited", Count: 2}, {Code: "not_found", Count: 1}, {Code: "unauthenticated", Count: 1}}},
	} {
		var got adminapi.RefusalCounts
		e.do(operatorToken, http.MethodGet, "/refusals?window="+tt.window, nil, &got)
		if got.Window != tt.window || !slices.Equal(got.Counts, tt.want) {
			t.Errorf("refusals over %s = %+v; want %v", tt.window, got, tt.want)
		}
	}
	if st, code := e.refused(operatorToken, http.MethodGet, "/refusals?window=1y", nil); st != 400 || code != "invalid_request" {
		t.Errorf("window 1y = %d %s; want 400 invalid_request", st, code)
	}
	if st, code := e.refused(financeToken, http.MethodGet, "/refusals", nil); st != 403 || code != "forbidden" {
		t.Errorf("finance's refusals = %d %s; want 403 forbidden", st, code)
	}
}

// A read the console marks in process (adminapi.WithConsoleRead) writes
// no audit entry, even of a usage summary, which is audited when a
// client asks; a change so marked is audited all the same. Over HTTP the
// mark cannot be sent.
func TestConsoleReadsAreNotAudited(t *testing.T) {
	e := newEnv(t)
	db := e.db
	prov := providers.Single(providers.LegacyName, fakeprovider.New())
	srv, err := admin.New(admin.Config{Tokens: []adminapi.OperatorToken{{Name: "alice", Role: adminapi.RoleAdmin,
		Hash: token.Hash(sandgate.Secret(adminToken))}}}, admin.Deps{DB: db, Clock: e.clock, Providers: prov,
		Terminator: termination.New(termination.Config{}, termination.Deps{DB: db, Providers: prov, Clock: e.clock}),
		Billing:    billing.New(billing.Config{}, billing.Deps{DB: db})})
	if err != nil {
		t.Fatal(err)
	}
	count := func() int {
		n := 0
		if err := db.AuditRange(context.Background(), time.Time{}, time.Time{}, 0, func([]byte) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	serve := func(ctx context.Context, method, path string, in any) int {
		req, err := adminapi.NewRequest(ctx, method, path, adminToken, in)
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		return rec.Code
	}
	marked := adminapi.WithConsoleRead(context.Background())
	before := count()
	for _, p := range []string{"/admin/v1/usage/summary?group_by=day", "/admin/v1/accounts", "/admin/v1/refusals", "/admin/v1/audit"} {
		if st := serve(marked, http.MethodGet, p, nil); st != 200 {
			t.Fatalf("console read %s = %d; want 200", p, st)
		}
	}
	if n := count() - before; n != 0 {
		t.Errorf("console reads wrote %d audit entries; want 0", n)
	}
	if st := serve(context.Background(), http.MethodGet, "/admin/v1/usage/summary?group_by=day", nil); st != 200 || count()-before != 1 {
		t.Errorf("an unmarked usage summary = %d with %d audit entries; want 200 and 1", st, count()-before)
	}
	if st := serve(marked, http.MethodPost, "/admin/v1/accounts", adminapi.CreateAccountRequest{}); st != 400 || count()-before != 2 {
		t.Errorf("a marked refused change = %d with %d audit entries; want 400 and 2", st, count()-before)
	}
}
