package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/console"
	"github.com/sandgate/sandgate/internal/broker"
	"github.com/sandgate/sandgate/internal/fakeprovider"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/token"
)

// Operator tokens of the brokers of these tests.
const (
	brokerAdminTok   = "sgo_BRKRadmin0123456789abcdefghij"
	brokerFinanceTok = "sgo_BRKRfinance0123456789abcdefgh"
)

// brokerEnv is a real broker over a real redis-server (internal/broker,
// as `sandgate serve` builds it, over a fake provider): its gateway
// behind a TLS test server, running, and its console over its operator
// API, as the operator listener serves it.
type brokerEnv struct {
	t       *testing.T
	b       *broker.Broker
	clock   *sgtest.Clock
	gw      *httptest.Server
	console *httptest.Server
	api     *adminapi.Client
}

// newBrokerEnv starts a broker over rs (a new redis-server when nil) with
// an admin and a finance operator token.
func newBrokerEnv(t *testing.T, rs *redistest.Server, start time.Time) *brokerEnv {
	t.Helper()
	if rs == nil {
		rs = redistest.Start(t)
	}
	clk := sgtest.NewClock(start)
	cfg := sgtest.Config(t)
	cfg.Defaults.DefaultImage = sgtest.DefaultImage
	cfg.Operators = []broker.OperatorConfig{
		{Name: "ada", Role: "admin", TokenSHA256: token.Hash(brokerAdminTok)},
		{Name: "fin", Role: "finance", TokenSHA256: token.Hash(brokerFinanceTok)},
	}
	b := sgtest.Broker(t, cfg, broker.Options{Redis: rs.Client(), Clock: clk,
		Providers: providers.Single(providers.LegacyName, fakeprovider.New())})
	e := &brokerEnv{t: t, b: b, clock: clk}
	e.gw = httptest.NewTLSServer(b.Gateway().Handler())
	t.Cleanup(e.gw.Close)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Gateway().Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	apiSrv := httptest.NewServer(b.Admin().Handler())
	t.Cleanup(apiSrv.Close)
	var err error
	if e.api, err = adminapi.NewClient(apiSrv.URL, brokerAdminTok, apiSrv.Client()); err != nil {
		t.Fatal(err)
	}
	con, err := console.New(console.Config{API: b.Admin().Handler(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	e.console = httptest.NewServer(con.Handler())
	t.Cleanup(e.console.Close)
	return e
}

func (e *brokerEnv) do(method, path string, in, out any) {
	e.t.Helper()
	if err := e.api.Do(context.Background(), method, path, in, out); err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
}

// tenant creates a free account named name with an instance and returns
// the account and a protocol client of the instance's token.
func (e *brokerEnv) tenant(name string) (adminapi.Account, *client.Client) {
	e.t.Helper()
	var a adminapi.Account
	e.do(http.MethodPost, "/accounts", adminapi.CreateAccountRequest{Name: name}, &a)
	e.do(http.MethodPut, "/accounts/"+a.ID+"/billing", adminapi.BillingSettings{Free: true}, nil)
	var in adminapi.Instance
	e.do(http.MethodPost, "/instances", adminapi.CreateInstanceRequest{AccountID: a.ID, Name: name + "-ci"}, &in)
	var tok adminapi.IssuedToken
	e.do(http.MethodPost, "/instances/"+in.ID+"/tokens", adminapi.IssueTokenRequest{}, &tok)
	pool := e.gw.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	c, err := client.New(client.Config{Endpoint: e.gw.URL, Token: sandgate.Secret(tok.Token), RootCAs: pool, BaseBackoff: time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	return a, c
}

func (e *brokerEnv) acquire(c *client.Client, domains ...string) *protocol.Workspace {
	e.t.Helper()
	if domains == nil {
		domains = []string{}
	}
	ws, _, err := c.Acquire(context.Background(), sandgate.NewID("k"), protocol.AcquireRequest{Label: "detail-test",
		Egress: &protocol.Egress{AllowedDomains: domains}})
	if err != nil {
		e.t.Fatalf("acquire: %v", err)
	}
	return ws
}

// audit returns the audit log's entries.
func (e *brokerEnv) audit() []store.AuditEvent {
	e.t.Helper()
	var out []store.AuditEvent
	err := e.b.DB().AuditRange(context.Background(), time.Time{}, time.Time{}, 0, func(b []byte) error {
		var ev store.AuditEvent
		if err := json.Unmarshal(b, &ev); err != nil {
			return err
		}
		out = append(out, ev)
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// page gets a console page with tok's session and fails the test unless
// it answers want.
func (e *brokerEnv) page(tok, path string, want int) string {
	e.t.Helper()
	resp, body := send(e.t, e.console, http.MethodGet, path, tok, nil, nil)
	if resp.StatusCode != want {
		e.t.Fatalf("GET %s = %d; want %d:\n%s", path, resp.StatusCode, want, body)
	}
	return body
}

// Viewing pages writes no audit entry; signing in, killing a workspace
// from its detail page and downloading an export each write one, under
// the operator's name.
func TestPageViewsAreNotAuditEntries(t *testing.T) {
	e := newBrokerEnv(t, nil, time.Now().UTC().Truncate(time.Second))
	acct, c := e.tenant("globex")
	ws := e.acquire(c, "pypi.org")
	resp, _ := send(t, e.console, http.MethodPost, "/console/login", "", url.Values{"token": {brokerAdminTok}}, nil)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-in = %d; want 303", resp.StatusCode)
	}
	before := e.audit()
	if n := len(before); n == 0 || before[n-1].Action != "console.signin" {
		t.Fatalf("audit after the sign-in ends %+v; want console.signin", before[len(before)-1])
	}
	for _, p := range []string{"/console/", "/console/usage", "/console/accounts", "/console/accounts/" + acct.ID,
		"/console/workspaces", "/console/workspaces/" + ws.WorkspaceID, "/console/audit", "/console/controls", "/console/?window=7d"} {
		e.page(brokerAdminTok, p, http.StatusOK)
	}
	if after := e.audit(); len(after) != len(before) {
		t.Fatalf("viewing pages wrote %d audit entries (%+v); want none", len(after)-len(before), after[len(before):])
	}

	// The confirmation names the account and the instance, ids on hover.
	confirm := e.page(brokerAdminTok, "/console/workspaces/"+ws.WorkspaceID+"/kill", http.StatusOK)
	for _, want := range []string{`title="` + acct.ID + `">globex</strong>`, `>globex-ci</strong>`} {
		if !strings.Contains(confirm, want) {
			t.Errorf("kill confirmation lacks %s:\n%s", want, confirm)
		}
	}
	detail := e.page(brokerAdminTok, "/console/workspaces/"+ws.WorkspaceID, http.StatusOK)
	if !strings.Contains(detail, `id="ws-instance"`) || !strings.Contains(detail, ">globex-ci</span>") {
		t.Errorf("workspace page does not name the instance:\n%s", detail)
	}
	csrf := csrfPattern.FindStringSubmatch(detail)
	if csrf == nil || !strings.Contains(detail, `id="kill"`) {
		t.Fatalf("workspace page has no kill form:\n%s", detail)
	}
	resp, _ = send(t, e.console, http.MethodPost, "/console/workspaces/"+ws.WorkspaceID+"/kill", brokerAdminTok,
		url.Values{"csrf": {csrf[1]}, "from": {"detail"}}, nil)
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "/console/workspaces/"+ws.WorkspaceID+"?killed=1" {
		t.Fatalf("kill from the detail page = %d to %q; want 303 back to the page", resp.StatusCode, loc)
	}
	after := e.audit()
	if len(after) != len(before)+1 {
		t.Fatalf("the kill wrote %d audit entries; want 1: %+v", len(after)-len(before), after[len(before):])
	}
	if k := after[len(after)-1]; k.Action != "workspace.kill" || k.Actor != "ada" || k.Role != "admin" ||
		k.Target != "workspace:"+ws.WorkspaceID || k.Outcome.Status != 200 {
		t.Errorf("kill's audit entry = %+v; want workspace.kill of %s by ada (admin), 200", k, ws.WorkspaceID)
	}
	if got, err := c.Workspace(context.Background(), ws.WorkspaceID); err != nil || got.State != "terminated" {
		t.Errorf("the tenant's read after the kill = %+v, %v; want it terminated", got, err)
	}
	page := e.page(brokerAdminTok, "/console/workspaces/"+ws.WorkspaceID+"?killed=1", http.StatusOK)
	if !strings.Contains(page, "emergency_stopped") || strings.Contains(page, `id="kill"`) {
		t.Errorf("workspace page after the kill shows no terminated state, or still a kill button:\n%s", page)
	}

	n := len(e.audit())
	resp, _ = send(t, e.console, http.MethodGet, "/console/usage.csv", brokerAdminTok, nil, nil)
	evs := e.audit()
	if resp.StatusCode != 200 || len(evs) != n+1 || evs[n].Action != "usage.export" || evs[n].Actor != "ada" {
		t.Errorf("usage CSV download = %d, audit entries %+v; want 200 and one usage.export by ada", resp.StatusCode, evs[n:])
	}
}

// The workspace page shows what the record keeps: history, size,
// provider, image, egress domains and bytes, metered seconds and amount.
func TestWorkspacePage(t *testing.T) {
	e := newBrokerEnv(t, nil, time.Now().UTC().Truncate(time.Second))
	acct, c := e.tenant("initech")
	ws := e.acquire(c, "pypi.org", "files.pythonhosted.org")
	e.clock.Advance(90 * time.Second)
	if _, err := c.Release(context.Background(), ws.WorkspaceID); err != nil {
		t.Fatal(err)
	}
	page := e.page(brokerAdminTok, "/console/workspaces/"+ws.WorkspaceID, http.StatusOK)
	for _, want := range []string{
		`<a id="ws-account" href="/console/accounts/` + acct.ID + `" title="` + acct.ID + `">initech</a>`,
		`<dd id="ws-size">` + ws.Size + `</dd>`,
		`<dd id="ws-provider">local</dd>`,
		`<code id="ws-image">` + sgtest.DefaultImage + `</code>`,
		`<code>pypi.org</code>, <code>files.pythonhosted.org</code>`,
		`<dd id="ws-egress">0 out, 0 in</dd>`,
		`<tr data-state="starting">`, `<tr data-state="running">`, `<tr data-state="terminated">`,
		`released`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("workspace page lacks %q:\n%s", want, page)
		}
	}
	if m := regexp.MustCompile(`<dd id="ws-metered">(\d+) s</dd>`).FindStringSubmatch(page); m == nil || m[1] == "0" {
		t.Errorf("workspace page's metered seconds = %v; want the 90 s it ran", m)
	}
	e.page(brokerAdminTok, "/console/workspaces/ws_nope", http.StatusNotFound)
	e.page(brokerFinanceTok, "/console/workspaces/"+ws.WorkspaceID, http.StatusForbidden)
}

// The account page shows an admin its instances with their tokens'
// prefixes and states, limits, balance, budgets, recent workspaces and
// refusals; finance sees the balance and budgets and an export link, and
// nothing of instances, tokens or workspaces.
func TestAccountPageByRole(t *testing.T) {
	e := newBrokerEnv(t, nil, time.Now().UTC().Truncate(time.Second))
	acct, c := e.tenant("umbrella")
	ws := e.acquire(c)
	if _, err := c.Workspace(context.Background(), "ws_missing"); err == nil {
		t.Fatal("reading an unknown workspace succeeded")
	}
	var ins []adminapi.Instance
	e.do(http.MethodGet, "/instances?account="+acct.ID, nil, &ins)
	var leases []adminapi.Lease
	e.do(http.MethodGet, "/instances/"+ins[0].ID+"/tokens", nil, &leases)

	var page string
	sgtest.WaitFor(t, "the refusal to be counted on the account page", func() bool {
		page = e.page(brokerAdminTok, "/console/accounts/"+acct.ID, http.StatusOK)
		return strings.Contains(page, `<tr data-code="not_found"><td><code>not_found</code></td><td class="num">1</td></tr>`)
	})
	for _, want := range []string{`<dd id="acct-name">umbrella</dd>`, `id="acct-balance"`, `id="inst-` + ins[0].ID + `"`,
		`<code>` + leases[0].TokenPrefix + `…</code> active`, `href="/console/workspaces/` + ws.WorkspaceID + `"`, `id="limits"`} {
		if !strings.Contains(page, want) {
			t.Errorf("admin's account page lacks %q:\n%s", want, page)
		}
	}
	fin := e.page(brokerFinanceTok, "/console/accounts/"+acct.ID, http.StatusOK)
	for _, want := range []string{`<dd id="acct-name">umbrella</dd>`, `id="acct-balance"`, `id="budgets"`, `id="statement"`} {
		if !strings.Contains(fin, want) {
			t.Errorf("finance's account page lacks %q:\n%s", want, fin)
		}
	}
	for _, hidden := range []string{ws.WorkspaceID, leases[0].TokenPrefix, `id="instances"`, `id="limits"`} {
		if strings.Contains(fin, hidden) {
			t.Errorf("finance's account page shows %q", hidden)
		}
	}
	// Everything above is in the page as served, with no script run; the
	// one script of the layout (live tables) is a file, never inline.
	if strings.Contains(fin, "<script>") || strings.Contains(page, "<script>") {
		t.Error("an account page carries an inline script")
	}
	resp, body := send(t, e.console, http.MethodGet, "/console/accounts/"+acct.ID+"/statement?month="+e.clock.Now().Format("2006-01"), brokerFinanceTok, nil, nil)
	if resp.StatusCode != 200 || !strings.Contains(body, acct.ID) {
		t.Errorf("finance's statement download = %d:\n%s", resp.StatusCode, body)
	}
	// Finance's pages: overview, accounts, an account, usage; not the others.
	for path, want := range map[string]int{"/console/": 200, "/console/accounts": 200, "/console/usage": 200,
		"/console/workspaces": 403, "/console/controls": 403, "/console/audit": 403} {
		e.page(brokerFinanceTok, path, want)
	}
}

// Refusals are counted by code in the store by the gateway process that
// refused them, so the overview of a console opened afterwards, in
// another broker process over the same Redis, counts them all; the
// window is chosen with ?window=.
func TestRefusalsFromTheStore(t *testing.T) {
	rs := redistest.Start(t)
	start := time.Now().UTC().Truncate(time.Second)
	one := newBrokerEnv(t, rs, start)
	two := newBrokerEnv(t, rs, start)
	_, c := one.tenant("hooli")
	ctx := context.Background()
	for range 3 {
		if _, err := c.Workspace(ctx, "ws_nowhere"); err == nil {
			t.Fatal("reading an unknown workspace succeeded")
		}
	}
	req, _ := http.NewRequest(http.MethodGet, two.gw.URL+"/v1/workspaces", nil)
	req.Header.Set("Authorization", "Bearer sgl_not-a-token")
	resp, err := two.gw.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("unknown token = %d; want 401", resp.StatusCode)
	}
	count := func(page, code string) string {
		m := regexp.MustCompile(`<tr data-code="` + code + `"><td><code>` + code + `</code></td><td class="num">(\d+)</td>`).FindStringSubmatch(page)
		if m == nil {
			return ""
		}
		return m[1]
	}
	var page string
	sgtest.WaitFor(t, "both processes' refusals on the overview", func() bool {
		page = two.page(brokerAdminTok, "/console/", http.StatusOK)
		return count(page, "not_found") == "3" && count(page, "unauthenticated") == "1"
	})
	// Two hours on, the last hour has none; the last day has them all.
	two.clock.Advance(2 * time.Hour)
	if page = two.page(brokerAdminTok, "/console/?window=1h", http.StatusOK); count(page, "not_found") != "" || !strings.Contains(page, `id="no-refusals"`) {
		t.Errorf("overview's last hour, two hours on, counts not_found %q; want none", count(page, "not_found"))
	}
	if page = two.page(brokerAdminTok, "/console/?window=24h", http.StatusOK); count(page, "not_found") != "3" {
		t.Errorf("overview's last day counts not_found %q; want 3", count(page, "not_found"))
	}
	two.page(brokerAdminTok, "/console/?window=1y", http.StatusBadRequest)
}

// seedUsage appends a usage entry of 60 s at 1 EUR a minute for account
// acct on day (of October 2026), as a settled workspace writes it.
func seedUsage(t *testing.T, l *billing.Ledger, acct string, day, n int) {
	t.Helper()
	for i := range n {
		end := time.Date(2026, 10, day, 12, i, 0, 0, time.UTC)
		ws := fmt.Sprintf("ws_%s_%d_%d", acct, day, i)
		en := billing.UsageEntry{ID: billing.FinalID(ws), Kind: billing.KindUsage, Final: true, AccountID: acct, InstanceID: "inst_" + acct,
			WorkspaceID: ws, Size: "small", Currency: "EUR", UnitPriceMicros: 16_667, Seconds: 60, AmountMicros: 1_000_020,
			StartedAt: end.Add(-time.Minute), EndedAt: end, TerminatedAt: end, TerminationReason: "released"}
		if _, err := l.Append(context.Background(), en); err != nil {
			t.Fatal(err)
		}
	}
}

// seedTenants creates n accounts named "tenant 00"… with usage: use
// gives account i's day of October 2026 and its number of entries.
func seedTenants(t *testing.T, e *brokerEnv, n int, use func(i int) (day, entries int)) {
	t.Helper()
	l := billing.NewLedger(e.b.DB().Redis())
	for i := range n {
		var a adminapi.Account
		e.do(http.MethodPost, "/accounts", adminapi.CreateAccountRequest{Name: fmt.Sprintf("tenant %02d", i)}, &a)
		day, k := use(i)
		seedUsage(t, l, a.ID, day, k)
	}
}

// With 50 accounts of usage the usage page draws a few time series per
// currency, whatever the number of accounts: axes with tick labels and
// units, a legend, a total, the top 8 accounts by name and the other 42
// summed under "others", and it says so.
func TestUsageChartsAtFiftyAccounts(t *testing.T) {
	e := newBrokerEnv(t, nil, time.Date(2026, 10, 20, 12, 0, 0, 0, time.UTC))
	seedTenants(t, e, 50, func(i int) (day, n int) { return 1 + i%19, 1 + i }) // tenant 49 uses the most
	page := e.page(brokerFinanceTok, "/console/usage?month=2026-10", http.StatusOK)
	eur := strings.Count(page, `data-unit="EUR"`)
	if eur == 0 || eur > 3 {
		t.Errorf("usage page has %d charts in EUR; want 1 to 3", eur)
	}
	if all := strings.Count(page, `<figure class="chart`); all > 6 {
		t.Errorf("usage page has %d charts; want at most 6 with one currency", all)
	}
	for _, want := range []string{
		"8 of 50 accounts drawn", "the other 42 are summed under", "others (42 accounts)",
		"tenant 49", "amount (EUR)", "metered seconds (s)", "day (UTC), 2026-10", `class="axis x-tick"`, `class="axis y-tick"`,
		`<ul class="legend">`, "total <strong class=\"total\">1275.03 EUR</strong>", "total <strong class=\"total\">76500 s</strong>",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("usage page lacks %q", want)
		}
	}
	if strings.Contains(page, "<script>") {
		t.Error("the usage page carries an inline script: its charts are drawn by the server")
	}
	if len(page) > 400_000 {
		t.Errorf("usage page is %d bytes; want it bounded", len(page))
	}
	// The per-account table lists the ten busiest, and links to the rest.
	table := func(page string) string {
		_, after, _ := strings.Cut(page, `<table id="by-account">`)
		tbl, _, _ := strings.Cut(after, "</table>")
		return tbl
	}
	tbl := table(page)
	if rows := strings.Count(tbl, `<a href="/console/accounts/`); rows != 10 ||
		!strings.Contains(tbl, ">tenant 49</a>") || !strings.Contains(tbl, ">tenant 40</a>") || strings.Contains(tbl, ">tenant 39</a>") ||
		!strings.Contains(tbl, "40 quieter accounts not listed") {
		t.Errorf("per-account table lists %d accounts; want the 10 busiest (tenant 49 to 40) and a link to 40 more:\n%s", rows, tbl)
	}
	all := table(e.page(brokerFinanceTok, "/console/usage?month=2026-10&accounts=all", http.StatusOK))
	if rows := strings.Count(all, `<a href="/console/accounts/`); rows != 50 || strings.Contains(all, "quieter") {
		t.Errorf("per-account table with accounts=all lists %d accounts; want 50", rows)
	}
}

// The usage page shows the warm pools' time and cost on lines of their
// own, beside the accounts' rows and totals, which it does not change.
func TestUsagePageShowsThePool(t *testing.T) {
	e := newBrokerEnv(t, nil, time.Date(2026, 10, 20, 12, 0, 0, 0, time.UTC))
	seedTenants(t, e, 1, func(int) (day, n int) { return 3, 2 })
	totals := func(page string) []string {
		var out []string
		for _, part := range strings.Split(page, `total <strong class="total">`)[1:] {
			v, _, _ := strings.Cut(part, "<")
			out = append(out, v)
		}
		return out
	}
	before := totals(e.page(brokerFinanceTok, "/console/usage?month=2026-10", http.StatusOK))
	bill := e.b.Billing()
	ctx := context.Background()
	if err := bill.PoolMeter().Record(ctx, e.clock.Now(), []billing.PoolTotal{
		{Provider: "local", Size: "small", Image: "host", Warm: 1300 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	page := e.page(brokerFinanceTok, "/console/usage?month=2026-10", http.StatusOK)
	_, after, _ := strings.Cut(page, `<table id="pool">`)
	tbl, _, _ := strings.Cut(after, "</table>")
	if want := `<tr><td>warm pool</td><td>local</td><td>small</td><td>host</td><td class="num">1300</td><td class="num">unpriced (billing.pool_rate_card)</td></tr>`; !strings.Contains(tbl, want) {
		t.Errorf("usage page's pool table lacks the line %s:\n%s", want, tbl)
	}
	if after := totals(page); len(before) == 0 || !slices.Equal(after, before) {
		t.Errorf("the accounts' totals with pool time = %q; want them as before it, %q", after, before)
	}
}
