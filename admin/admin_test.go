package admin_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admin"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/fakeprovider"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
	"github.com/sandgate/sandgate/token"
)

// Operator tokens of the test broker, one per role.
const (
	adminToken    = "sgo_ADMINtoken0123456789abcdefghij"
	operatorToken = "sgo_OPERtoken0123456789abcdefghijk"
	financeToken  = "sgo_FINAtoken0123456789abcdefghijk"
)

// clock is a settable sandgate.Clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// env is an operator API over its own redis-server (stops and the audit
// log are global keys), with a Terminator over a fake provider.
type env struct {
	t     *testing.T
	redis *redistest.Server
	db    *store.DB
	prov  *fakeprovider.Provider
	clock *clock
	pipe  *admission.Pipeline
	url   string
}

func newEnv(t *testing.T, opts ...func(*admin.Deps)) *env {
	t.Helper()
	rs := redistest.Start(t)
	db := store.New(store.Config{}, rs.Client())
	clk := &clock{t: time.Now().UTC().Truncate(time.Second)}
	prov := fakeprovider.New()
	tok := func(name string, role adminapi.Role, s string) adminapi.OperatorToken {
		return adminapi.OperatorToken{Name: name, Role: role, Hash: token.Hash(sandgate.Secret(s)), Prefix: adminapi.TokenPrefix(sandgate.Secret(s))}
	}
	deps := admin.Deps{
		DB: db, Clock: clk,
		Providers:  providers.Single(providers.LegacyName, prov),
		Terminator: termination.New(termination.Config{}, termination.Deps{DB: db, Providers: providers.Single(providers.LegacyName, prov), Clock: clk}),
		Billing:    billing.New(billing.Config{}, billing.Deps{DB: db}),
	}
	for _, o := range opts {
		o(&deps)
	}
	srv, err := admin.New(admin.Config{
		Tokens: []adminapi.OperatorToken{
			tok("alice", adminapi.RoleAdmin, adminToken),
			tok("oscar", adminapi.RoleOperator, operatorToken),
			tok("fiona", adminapi.RoleFinance, financeToken),
		},
		Defaults: sandgate.Scope{DefaultSize: "small", DefaultImage: "host", Limits: sandgate.DefaultLimits},
	}, deps)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(checkedHandler(t, srv.Handler()))
	t.Cleanup(hs.Close)
	dc := db.Config()
	pipe := admission.New(db.Redis(), admission.Standard(db, admission.StandardConfig{
		IdempotencyTTL: dc.IdempotencyTTL, PendingTimeout: dc.PendingTimeout,
		Risk: admission.RiskDefaults{AcquiresPerMinute: 100000, MaxOpenWorkspaces: 100000},
	})...)
	return &env{t: t, redis: rs, db: db, prov: prov, clock: clk, pipe: pipe, url: hs.URL}
}

func (e *env) client(tok string) *adminapi.Client {
	e.t.Helper()
	c, err := adminapi.NewClient(e.url, sandgate.Secret(tok), nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// do calls the operator API with tok and fails the test on a refusal.
func (e *env) do(tok, method, path string, in, out any) {
	e.t.Helper()
	if err := e.client(tok).Do(context.Background(), method, path, in, out); err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
}

// refused calls the operator API with tok and returns the refusal's status
// and code; it fails the test when the call succeeds.
func (e *env) refused(tok, method, path string, in any) (int, protocol.Code) {
	e.t.Helper()
	err := e.client(tok).Do(context.Background(), method, path, in, nil)
	var ae *adminapi.APIError
	if !errors.As(err, &ae) {
		e.t.Fatalf("%s %s = %v; want a refusal", method, path, err)
	}
	return ae.Status, ae.Code
}

func (e *env) account() string {
	e.t.Helper()
	var a adminapi.Account
	// Names are unique per broker: each test account gets its own.
	e.do(adminToken, http.MethodPost, "/accounts", adminapi.CreateAccountRequest{Name: "acme " + sandgate.NewID("")}, &a)
	return a.ID
}

func (e *env) instance(acct string) string {
	e.t.Helper()
	var in adminapi.Instance
	e.do(adminToken, http.MethodPost, "/instances", adminapi.CreateInstanceRequest{AccountID: acct}, &in)
	return in.ID
}

// admit errors of the admission pipeline for a new workspace of inst.
func (e *env) admit(acct, inst string) (sandgate.Workspace, error) {
	now := e.clock.Now()
	w := sandgate.Workspace{
		ID: sandgate.NewID(sandgate.PrefixWorkspace), AccountID: acct, InstanceID: inst,
		Label: "l", Size: "small", Image: "host", State: sandgate.WorkspaceStarting,
		CreatedAt: now, ExpiresAt: now.Add(time.Hour), IdleTimeout: time.Minute,
	}
	err := e.pipe.Admit(context.Background(), &admission.Request{
		Workspace: w, Scope: sandgate.Scope{Limits: sandgate.Limits{MaxConcurrentWorkspaces: 100}.WithDefaults()},
		Keys: store.AdmissionKeys(acct, inst, w.ID, w.ID), KeyHash: w.ID, RequestHash: "h", Now: now,
	})
	return w, err
}

// running admits n workspaces of inst, creates their sandboxes and
// confirms them, as an Acquire does.
func (e *env) running(acct, inst string, n int) []sandgate.Workspace {
	e.t.Helper()
	ctx := context.Background()
	var out []sandgate.Workspace
	for range n {
		w, err := e.admit(acct, inst)
		if err != nil {
			e.t.Fatalf("Admit: %v", err)
		}
		sb, err := e.prov.Create(ctx, providers.CreateSpec{WorkspaceID: w.ID, InstanceID: inst})
		if err != nil {
			e.t.Fatal(err)
		}
		if ok, err := e.db.Confirm(ctx, w, sb.Ref, e.clock.Now(), w.ID, "h"); !ok || err != nil {
			e.t.Fatalf("Confirm = %v, %v; want true", ok, err)
		}
		out = append(out, w)
	}
	return out
}

// states returns the workspaces' states and termination reasons, "state/reason".
func (e *env) states(ws []sandgate.Workspace) []string {
	e.t.Helper()
	var out []string
	for _, w := range ws {
		got, err := e.db.Workspace(context.Background(), w.AccountID, w.ID)
		if err != nil {
			e.t.Fatal(err)
		}
		s := string(got.State)
		if got.TerminationReason != "" {
			s += "/" + string(got.TerminationReason)
		}
		out = append(out, s)
	}
	return out
}

func (e *env) wantStates(what string, ws []sandgate.Workspace, want string) {
	e.t.Helper()
	for i, got := range e.states(ws) {
		if got != want {
			e.t.Errorf("%s: workspace %d = %s; want %s", what, i, got, want)
		}
	}
}

// audit exports the audit log and decodes every line; raw is the export.
func (e *env) audit(query string) (events []store.AuditEvent, raw string) {
	e.t.Helper()
	var buf bytes.Buffer
	if err := e.client(adminToken).Stream(context.Background(), "/audit"+query, &buf); err != nil {
		e.t.Fatalf("audit export: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(buf.Bytes()))
	for sc.Scan() {
		var ev store.AuditEvent
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ev); err != nil {
			e.t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		events = append(events, ev)
	}
	return events, buf.String()
}

func findEvent(evs []store.AuditEvent, action string, status int) (store.AuditEvent, bool) {
	for _, ev := range evs {
		if ev.Action == action && ev.Outcome.Status == status {
			return ev, true
		}
	}
	return store.AuditEvent{}, false
}

func on(b bool) *bool { return &b }

func TestStopBroker(t *testing.T) {
	e := newEnv(t)
	a1, a2 := e.account(), e.account()
	i1, i2 := e.instance(a1), e.instance(a2)
	ws := append(e.running(a1, i1, 2), e.running(a2, i2, 1)...)

	var swept adminapi.Swept
	e.do(operatorToken, http.MethodPost, "/stop", adminapi.StopRequest{On: on(true), Reason: "incident", Note: "db failover"}, &swept)
	if swept != (adminapi.Swept{Terminated: 3}) {
		t.Fatalf("stop on = %+v; want terminated=3 failed=0", swept)
	}
	e.wantStates("after stop on", ws, "terminated/emergency_stopped")
	if n := e.prov.Live(); n != 0 {
		t.Errorf("provider sandboxes after stop = %d; want 0", n)
	}
	_, err := e.admit(a1, i1)
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.EmergencyStopped || pe.Reason != "incident" {
		t.Fatalf("Admit while stopped = %v; want emergency_stopped/incident", err)
	}

	var st adminapi.Status
	e.do(operatorToken, http.MethodGet, "/status", nil, &st)
	if st.BrokerStop == nil || st.BrokerStop.Reason != "incident" || st.BrokerStop.Note != "db failover" ||
		st.BrokerStop.Actor != "oscar:sgo_OPER" || !st.BrokerStop.Active || st.BrokerStop.Until != nil ||
		st.BrokerStop.Since != e.clock.Now().Format(time.RFC3339) {
		t.Fatalf("status broker_stop = %+v; want incident by oscar:sgo_OPER since now", st.BrokerStop)
	}

	var off map[string]any
	e.do(operatorToken, http.MethodPost, "/stop", adminapi.StopRequest{On: on(false)}, &off)
	if len(off) != 0 {
		t.Errorf("stop off = %v; want {}", off)
	}
	e.do(operatorToken, http.MethodGet, "/status", nil, &st)
	if st.BrokerStop != nil || len(st.Controls) != 0 {
		t.Errorf("status after stop off = %+v; want nothing", st)
	}
	if _, err := e.admit(a1, i1); err != nil {
		t.Errorf("Admit after stop off = %v; want admitted", err)
	}

	evs, _ := e.audit("")
	ev, ok := findEvent(evs, "stop.on", 200)
	if !ok {
		t.Fatalf("audit has no stop.on: %+v", evs)
	}
	if ev.Target != "broker" || ev.Actor != "oscar:sgo_OPER" || ev.Role != "operator" ||
		ev.Outcome.Terminated == nil || *ev.Outcome.Terminated != 3 || *ev.Outcome.Failed != 0 ||
		string(ev.Before) != "null" || !strings.Contains(string(ev.After), `"reason":"incident"`) {
		t.Errorf("stop.on entry = %+v (before %s after %s)", ev, ev.Before, ev.After)
	}
	if ev, ok := findEvent(evs, "stop.off", 200); !ok || !strings.Contains(string(ev.Before), `"incident"`) || string(ev.After) != "null" {
		t.Errorf("stop.off entry = %+v, %v; want before the stop, after null", ev, ok)
	}
}

func TestStopAccount(t *testing.T) {
	e := newEnv(t)
	a1, a2 := e.account(), e.account()
	i1, i2 := e.instance(a1), e.instance(a2)
	stopped, spared := e.running(a1, i1, 2), e.running(a2, i2, 2)
	until := e.clock.Now().Add(time.Hour).Format(time.RFC3339)

	var swept adminapi.Swept
	e.do(adminToken, http.MethodPost, "/stop", adminapi.StopRequest{On: on(true), AccountID: a1, Reason: "abuse", Until: until}, &swept)
	if swept != (adminapi.Swept{Terminated: 2}) {
		t.Fatalf("stop on (account) = %+v; want terminated=2", swept)
	}
	e.wantStates("stopped account", stopped, "terminated/emergency_stopped")
	e.wantStates("other account", spared, "running")

	var st adminapi.Status
	e.do(adminToken, http.MethodGet, "/status", nil, &st)
	if st.BrokerStop != nil || len(st.Controls) != 1 {
		t.Fatalf("status = %+v; want one account stop", st)
	}
	c := st.Controls[0]
	if c.AccountID != a1 || c.Kind != "stop" || c.Reason != "abuse" || c.Actor != "alice:sgo_ADMI" || c.Until == nil || *c.Until != until {
		t.Errorf("status control = %+v; want a1's stop by alice until %s", c, until)
	}
	// Past its until, the stop no longer refuses, and status says so.
	e.clock.Add(2 * time.Hour)
	if _, err := e.admit(a1, i1); err != nil {
		t.Errorf("Admit past the stop's until = %v; want admitted", err)
	}
	e.do(adminToken, http.MethodGet, "/status", nil, &st)
	if st.Controls[0].Active {
		t.Errorf("status of an expired stop: active = true; want false")
	}

	if status, code := e.refused(adminToken, http.MethodPost, "/stop", adminapi.StopRequest{On: on(true), AccountID: "acct_nope", Reason: "x"}); status != 404 || code != protocol.NotFound {
		t.Errorf("stop of an unknown account = %d %s; want 404 not_found", status, code)
	}
}

func TestStopFailures(t *testing.T) {
	e := newEnv(t)
	a := e.account()
	ws := e.running(a, e.instance(a), 2)
	e.prov.TerminateErr = errors.New("vendor down")
	var swept adminapi.Swept
	e.do(operatorToken, http.MethodPost, "/stop", adminapi.StopRequest{On: on(true), AccountID: a, Reason: "incident"}, &swept)
	if swept != (adminapi.Swept{Failed: 2}) {
		t.Fatalf("stop on with a failing provider = %+v; want terminated=0 failed=2", swept)
	}
	// Their slots are freed and the reason recorded; the sweep retries the end.
	e.wantStates("after a failed stop", ws, "terminating/emergency_stopped")
}

func TestPause(t *testing.T) {
	e := newEnv(t)
	a := e.account()
	i1, i2 := e.instance(a), e.instance(a)
	w1, w2 := e.running(a, i1, 2), e.running(a, i2, 1)

	var swept adminapi.Swept
	e.do(operatorToken, http.MethodPost, "/pause", adminapi.PauseRequest{InstanceID: i1}, &swept)
	if swept != (adminapi.Swept{Terminated: 2}) {
		t.Fatalf("pause instance = %+v; want terminated=2", swept)
	}
	e.wantStates("paused instance", w1, "terminated/paused")
	e.wantStates("sibling instance", w2, "running")
	_, err := e.admit(a, i1)
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.Paused || pe.Reason != "instance_paused" {
		t.Fatalf("Admit on a paused instance = %v; want paused/instance_paused", err)
	}
	if _, err := e.admit(a, i2); err != nil {
		t.Fatalf("Admit on the sibling = %v; want admitted", err)
	}

	// The account's pause reaches every instance.
	w3 := e.running(a, i2, 1)
	e.do(operatorToken, http.MethodPost, "/pause", adminapi.PauseRequest{AccountID: a, Reason: "payment", Note: "card declined"}, &swept)
	if swept != (adminapi.Swept{Terminated: 3}) {
		t.Fatalf("pause account = %+v; want terminated=3 (the sibling's two)", swept)
	}
	e.wantStates("paused account", append(w2, w3...), "terminated/paused")

	var st adminapi.Status
	e.do(operatorToken, http.MethodGet, "/status", nil, &st)
	if len(st.Controls) != 2 || st.Controls[0].InstanceID != "" || st.Controls[0].Reason != "payment" ||
		st.Controls[1].InstanceID != i1 || st.Controls[1].Reason != "instance_paused" || st.Controls[1].Kind != "pause" {
		t.Fatalf("status = %+v; want the account pause, then the instance pause", st.Controls)
	}

	// Resuming the account leaves the instance's own pause.
	e.do(operatorToken, http.MethodPost, "/resume", adminapi.ResumeRequest{AccountID: a}, nil)
	if _, err := e.admit(a, i2); err != nil {
		t.Errorf("Admit after resuming the account = %v; want admitted", err)
	}
	if _, err := e.admit(a, i1); protocol.CodeOf(err) != protocol.Paused {
		t.Errorf("Admit on the still-paused instance = %v; want paused", err)
	}
	e.do(operatorToken, http.MethodPost, "/resume", adminapi.ResumeRequest{InstanceID: i1}, nil)
	if _, err := e.admit(a, i1); err != nil {
		t.Errorf("Admit after resuming the instance = %v; want admitted", err)
	}
	e.do(operatorToken, http.MethodGet, "/status", nil, &st)
	if len(st.Controls) != 0 {
		t.Errorf("status after resuming both = %+v; want nothing", st.Controls)
	}

	tests := []struct {
		name string
		req  any
		path string
		want int
	}{
		{"both ids", adminapi.PauseRequest{AccountID: a, InstanceID: i1}, "/pause", 400},
		{"no id", adminapi.PauseRequest{}, "/pause", 400},
		{"unknown instance", adminapi.PauseRequest{InstanceID: "inst_nope"}, "/pause", 404},
		{"unknown account", adminapi.ResumeRequest{AccountID: "acct_nope"}, "/resume", 404},
		{"bad reason", adminapi.PauseRequest{AccountID: a, Reason: "Not A Slug"}, "/pause", 400},
		{"long note", adminapi.PauseRequest{AccountID: a, Note: strings.Repeat("n", 501)}, "/pause", 400},
		{"past until", adminapi.PauseRequest{AccountID: a, Until: "2001-01-01T00:00:00Z"}, "/pause", 400},
		{"bad until", adminapi.PauseRequest{AccountID: a, Until: "tomorrow"}, "/pause", 400},
		{"stop without on", map[string]any{"reason": "x"}, "/stop", 400},
		{"stop on without reason", adminapi.StopRequest{On: on(true)}, "/stop", 400},
		{"stop off with a reason", adminapi.StopRequest{On: on(false), Reason: "x"}, "/stop", 400},
		{"unknown field", map[string]any{"on": true, "reason": "x", "scope": "all"}, "/stop", 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, _ := e.refused(operatorToken, http.MethodPost, tt.path, tt.req); got != tt.want {
				t.Errorf("POST %s = %d; want %d", tt.path, got, tt.want)
			}
		})
	}
	e.do(operatorToken, http.MethodGet, "/status", nil, &st)
	if len(st.Controls) != 0 {
		t.Errorf("refused requests set controls: %+v", st.Controls)
	}
	evs, _ := e.audit("")
	if ev, ok := findEvent(evs, "pause", 404); !ok || ev.Target != "instance:inst_nope" || ev.Outcome.Code != string(protocol.NotFound) {
		t.Errorf("audit of the refused pause = %+v, %v; want instance:inst_nope, 404 not_found", ev, ok)
	}
}

func TestRoles(t *testing.T) {
	e := newEnv(t)
	a := e.account()
	inst := e.instance(a)
	stopOn := adminapi.StopRequest{On: on(true), AccountID: a, Reason: "incident"}
	tests := []struct {
		tok, method, path string
		body              any
		want              int
	}{
		{financeToken, http.MethodGet, "/accounts", nil, 200},
		{financeToken, http.MethodPost, "/stop", stopOn, 403},
		{financeToken, http.MethodPost, "/pause", adminapi.PauseRequest{AccountID: a}, 403},
		{financeToken, http.MethodGet, "/status", nil, 403},
		{financeToken, http.MethodGet, "/audit", nil, 403},
		{financeToken, http.MethodGet, "/instances", nil, 403},
		{financeToken, http.MethodGet, "/accounts/" + a + "/limits", nil, 403},
		{operatorToken, http.MethodPut, "/accounts/" + a + "/limits", adminapi.RiskLimits{}, 403},
		{operatorToken, http.MethodPost, "/accounts", adminapi.CreateAccountRequest{Name: "x"}, 403},
		{operatorToken, http.MethodPost, "/instances/" + inst + "/tokens", nil, 403},
		{operatorToken, http.MethodGet, "/accounts/" + a + "/limits", nil, 200},
		{operatorToken, http.MethodGet, "/instances/" + inst, nil, 200},
		{operatorToken, http.MethodPost, "/stop", stopOn, 200},
		{"sgo_not-a-configured-token-at-all", http.MethodGet, "/accounts", nil, 401},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.method, tt.path, tt.want), func(t *testing.T) {
			err := e.client(tt.tok).Do(context.Background(), tt.method, tt.path, tt.body, nil)
			got := 200
			var ae *adminapi.APIError
			if errors.As(err, &ae) {
				got = ae.Status
			} else if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("%s %s = %d; want %d", tt.method, tt.path, got, tt.want)
			}
		})
	}

	evs, raw := e.audit("")
	ev, ok := findEvent(evs, "stop", 403)
	if !ok || ev.Actor != "fiona:sgo_FINA" || ev.Role != "finance" || ev.Outcome.Code != string(protocol.Forbidden) {
		t.Errorf("audit of finance's stop = %+v, %v; want fiona:sgo_FINA, 403 forbidden", ev, ok)
	}
	if ev, ok := findEvent(evs, "account.list", 401); !ok || ev.Actor != "unknown" || ev.Role != "" {
		t.Errorf("audit of the unknown token = %+v, %v; want actor unknown", ev, ok)
	}
	if _, ok := findEvent(evs, "account.list", 200); ok {
		t.Error("a successful read was audited")
	}
	if ev, ok := findEvent(evs, "limits.set", 403); !ok || ev.Target != "account:"+a {
		t.Errorf("audit of the operator's limits.set = %+v, %v; want target account:%s", ev, ok, a)
	}
	for _, tok := range []string{adminToken, operatorToken, financeToken, "sgo_not-a-configured"} {
		if strings.Contains(raw, tok) {
			t.Errorf("the audit export holds the token %s…", tok[:8])
		}
	}
}

func TestRevoke(t *testing.T) {
	e := newEnv(t)
	a := e.account()
	i1, i2 := e.instance(a), e.instance(a)
	var issued adminapi.IssuedToken
	e.do(adminToken, http.MethodPost, "/instances/"+i1+"/tokens", nil, &issued)
	e.do(adminToken, http.MethodPost, "/instances/"+i2+"/tokens", nil, nil)
	w1, w2 := e.running(a, i1, 2), e.running(a, i2, 2)

	var res adminapi.RevokeResult
	e.do(operatorToken, http.MethodPost, "/instances/"+i1+"/tokens/revoke", nil, &res)
	if res != (adminapi.RevokeResult{Count: 1, Terminated: 2}) {
		t.Fatalf("revoke = %+v; want count=1 terminated=2", res)
	}
	e.wantStates("revoked instance", w1, "terminated/lease_revoked")
	e.wantStates("other instance", w2, "running")

	e.do(operatorToken, http.MethodPost, "/instances/"+i2+"/tokens/revoke", adminapi.RevokeRequest{TerminateWorkspaces: on(false)}, &res)
	if res != (adminapi.RevokeResult{Count: 1}) {
		t.Fatalf("revoke keeping workspaces = %+v; want count=1 terminated=0", res)
	}
	e.wantStates("kept workspaces", w2, "running")

	evs, raw := e.audit("")
	ev, ok := findEvent(evs, "token.revoke", 200)
	if !ok || ev.Target != "instance:"+i1 || !strings.Contains(string(ev.Before), `"state":"active"`) || !strings.Contains(string(ev.After), `"state":"revoked"`) {
		t.Errorf("token.revoke entry = %+v (before %s after %s); want the leases active, then revoked", ev, ev.Before, ev.After)
	}
	if _, ok := findEvent(evs, "token.issue", 201); !ok {
		t.Error("audit has no token.issue")
	}
	if strings.Contains(raw, issued.Token) || strings.Contains(raw, issued.Token[8:]) {
		t.Error("the audit export holds an issued instance token")
	}
}

func TestRevokeLease(t *testing.T) {
	e := newEnv(t)
	a := e.account()
	inst := e.instance(a)
	var old, succ adminapi.IssuedToken
	e.do(adminToken, http.MethodPost, "/instances/"+inst+"/tokens", nil, &old)
	e.do(adminToken, http.MethodPost, "/instances/"+inst+"/tokens/rotate", adminapi.IssueTokenRequest{GraceSeconds: 3600}, &succ)
	ws := e.running(a, inst, 2)
	states := func() map[string]string {
		var ls []adminapi.Lease
		e.do(operatorToken, http.MethodGet, "/instances/"+inst+"/tokens", nil, &ls)
		m := map[string]string{}
		for _, l := range ls {
			m[l.ID] = l.State
		}
		return m
	}

	var res adminapi.RevokeResult
	e.do(operatorToken, http.MethodPost, "/leases/"+old.LeaseID+"/revoke", nil, &res)
	if res != (adminapi.RevokeResult{Count: 1}) {
		t.Fatalf("revoke lease = %+v; want count=1", res)
	}
	if got, want := states(), map[string]string{old.LeaseID: "revoked", succ.LeaseID: "active"}; !maps.Equal(got, want) {
		t.Errorf("token states after revoking one lease = %v; want %v", got, want)
	}
	e.wantStates("workspaces of the instance", ws, "running")
	e.do(operatorToken, http.MethodPost, "/leases/"+old.LeaseID+"/revoke", nil, &res)
	if res != (adminapi.RevokeResult{}) {
		t.Errorf("second revoke of the lease = %+v; want count=0", res)
	}

	// A lease issued before the lease index existed is found all the same.
	if err := e.db.Redis().Del(context.Background(), "sg:lease:"+succ.LeaseID).Err(); err != nil { // see store/README.md
		t.Fatal(err)
	}
	e.do(operatorToken, http.MethodPost, "/leases/"+succ.LeaseID+"/revoke", nil, &res)
	if res != (adminapi.RevokeResult{Count: 1}) || states()[succ.LeaseID] != "revoked" {
		t.Errorf("revoke of an unindexed lease = %+v, state %s; want count=1, revoked", res, states()[succ.LeaseID])
	}

	tests := []struct {
		tok, id    string
		wantStatus int
		wantCode   protocol.Code
	}{
		{operatorToken, "lse_nope", 404, protocol.NotFound},
		{operatorToken, "..", 404, protocol.NotFound},
		{financeToken, old.LeaseID, 403, protocol.Forbidden},
	}
	for _, tt := range tests {
		if status, code := e.refused(tt.tok, http.MethodPost, "/leases/"+tt.id+"/revoke", nil); status != tt.wantStatus || code != tt.wantCode {
			t.Errorf("revoke lease %q = %d %s; want %d %s", tt.id, status, code, tt.wantStatus, tt.wantCode)
		}
	}

	evs, raw := e.audit("")
	ev, ok := findEvent(evs, "token.revoke_lease", 200)
	if !ok || ev.Target != "instance:"+inst || ev.Actor != "oscar:sgo_OPER" ||
		!strings.Contains(string(ev.Before), `"state":"superseded"`) || !strings.Contains(string(ev.After), `"state":"revoked"`) {
		t.Errorf("token.revoke_lease entry = %+v (before %s after %s); want instance:%s by oscar, superseded then revoked", ev, ev.Before, ev.After, inst)
	}
	if ev, ok := findEvent(evs, "token.revoke_lease", 404); !ok || ev.Target != "lease:lse_nope" {
		t.Errorf("audit of the unknown lease = %+v, %v; want target lease:lse_nope", ev, ok)
	}
	if _, ok := findEvent(evs, "token.revoke_lease", 403); !ok {
		t.Error("audit has no refused token.revoke_lease")
	}
	if strings.Contains(raw, old.Token) || strings.Contains(raw, succ.Token) {
		t.Error("the audit export holds an instance token")
	}
}

// TestStoreOutage checks that while Redis is down the operator API answers
// 503 unavailable with Retry-After, never 500 internal (a broker bug).
func TestStoreOutage(t *testing.T) {
	e := newEnv(t)
	a := e.account()
	inst := e.instance(a)
	var issued adminapi.IssuedToken
	e.do(adminToken, http.MethodPost, "/instances/"+inst+"/tokens", nil, &issued)
	e.redis.Kill()

	tests := []struct {
		method, path string
		body         any
	}{
		{http.MethodGet, "/status", nil},
		{http.MethodGet, "/accounts", nil},
		{http.MethodPost, "/accounts", adminapi.CreateAccountRequest{Name: "x"}},
		{http.MethodGet, "/instances", nil},
		{http.MethodGet, "/instances/" + inst, nil},
		{http.MethodGet, "/instances/" + inst + "/tokens", nil},
		{http.MethodPost, "/instances/" + inst + "/tokens", nil},
		{http.MethodPost, "/instances/" + inst + "/tokens/revoke", nil},
		{http.MethodPost, "/leases/" + issued.LeaseID + "/revoke", nil},
		{http.MethodPost, "/stop", adminapi.StopRequest{On: on(true), AccountID: a, Reason: "incident"}},
		{http.MethodPost, "/stop", adminapi.StopRequest{On: on(true), Reason: "incident"}},
		{http.MethodPost, "/pause", adminapi.PauseRequest{AccountID: a}},
		{http.MethodGet, "/accounts/" + a + "/limits", nil},
		{http.MethodGet, "/accounts/" + a + "/funds", nil},
		{http.MethodGet, "/rate-cards", nil},
	}
	for _, tt := range tests {
		t.Run(tt.method+tt.path, func(t *testing.T) {
			var rd io.Reader
			if tt.body != nil {
				b, _ := json.Marshal(tt.body)
				rd = bytes.NewReader(b)
			}
			req, err := http.NewRequest(tt.method, e.url+"/admin/v1"+tt.path, rd)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+adminToken)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var env protocol.Envelope
			if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
				t.Fatalf("%s %s: body is not the envelope: %v", tt.method, tt.path, err)
			}
			if resp.StatusCode != http.StatusServiceUnavailable || env.Error.Code != protocol.Unavailable || !env.Error.Retryable ||
				resp.Header.Get(protocol.HeaderRetryAfter) != "1" {
				t.Errorf("%s %s during the outage = %d %s (retryable %v, Retry-After %q); want 503 unavailable, retryable, Retry-After 1",
					tt.method, tt.path, resp.StatusCode, env.Error.Code, env.Error.Retryable, resp.Header.Get(protocol.HeaderRetryAfter))
			}
		})
	}

	// Once Redis is back, so is the answer (the client's dialer retries
	// about once a second).
	e.redis.Restart()
	for i := 0; ; i++ {
		err := e.client(operatorToken).Do(context.Background(), http.MethodGet, "/status", nil, &adminapi.Status{})
		if err == nil {
			break
		}
		if i == 300 {
			t.Fatalf("GET /status after Redis came back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestLimits(t *testing.T) {
	e := newEnv(t)
	a := e.account()
	var got adminapi.RiskLimits
	e.do(operatorToken, http.MethodGet, "/accounts/"+a+"/limits", nil, &got)
	if got != (adminapi.RiskLimits{}) {
		t.Fatalf("limits of a new account = %+v; want zero (the broker defaults)", got)
	}
	want := adminapi.RiskLimits{AcquiresPerMinute: 30, MaxOpenWorkspaces: 5, MaxSize: "standard"}
	e.do(adminToken, http.MethodPut, "/accounts/"+a+"/limits", want, &got)
	if got != want {
		t.Fatalf("PUT limits = %+v; want %+v", got, want)
	}
	e.do(operatorToken, http.MethodGet, "/accounts/"+a+"/limits", nil, &got)
	if got != want {
		t.Fatalf("GET limits = %+v; want %+v", got, want)
	}
	if r, err := e.db.Risk(context.Background(), a); err != nil || r != (store.RiskLimits{AcquiresPerMinute: 30, MaxOpenWorkspaces: 5, MaxSize: "standard"}) {
		t.Fatalf("store.Risk = %+v, %v", r, err)
	}
	for _, bad := range []adminapi.RiskLimits{{MaxSize: "huge"}, {AcquiresPerMinute: -1}, {MaxOpenWorkspaces: 2_000_000}} {
		if status, _ := e.refused(adminToken, http.MethodPut, "/accounts/"+a+"/limits", bad); status != 400 {
			t.Errorf("PUT limits %+v = %d; want 400", bad, status)
		}
	}
	if status, _ := e.refused(adminToken, http.MethodPut, "/accounts/acct_nope/limits", want); status != 404 {
		t.Errorf("PUT limits of an unknown account = %d; want 404", status)
	}
	evs, _ := e.audit("")
	ev, ok := findEvent(evs, "limits.set", 200)
	if !ok || string(ev.After) != `{"acquires_per_minute":30,"max_open_workspaces":5,"max_size":"standard"}` ||
		string(ev.Before) != `{"acquires_per_minute":0,"max_open_workspaces":0,"max_size":""}` {
		t.Errorf("limits.set entry = %+v (before %s after %s)", ev, ev.Before, ev.After)
	}
}

func TestAuditExport(t *testing.T) {
	e := newEnv(t)
	start := e.clock.Now()
	a := e.account()
	e.clock.Add(time.Hour)
	mid := e.clock.Now()
	e.do(operatorToken, http.MethodPost, "/pause", adminapi.PauseRequest{AccountID: a}, nil)
	e.clock.Add(time.Hour)
	end := e.clock.Now()
	e.do(operatorToken, http.MethodPost, "/resume", adminapi.ResumeRequest{AccountID: a}, nil)

	// Source, user agent and request id come from the request.
	req, _ := http.NewRequest(http.MethodPost, e.url+"/admin/v1/stop", strings.NewReader(`{"on":true,"reason":"x"}`))
	req.Header.Set("Authorization", "Bearer "+financeToken)
	req.Header.Set("User-Agent", "audit-test/1")
	req.Header.Set("X-Request-Id", "req-audit-1")
	req.Header.Set("X-Forwarded-For", "203.0.113.9")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || resp.Header.Get("X-Request-Id") != "req-audit-1" {
		t.Fatalf("finance stop = %d, request id %q; want 403, req-audit-1", resp.StatusCode, resp.Header.Get("X-Request-Id"))
	}

	evs, _ := e.audit("")
	var actions []string
	for _, ev := range evs {
		actions = append(actions, fmt.Sprint(ev.Action, " ", ev.Outcome.Status))
	}
	want := []string{"account.create 201", "pause 200", "resume 200", "stop 403"}
	if strings.Join(actions, ",") != strings.Join(want, ",") {
		t.Fatalf("audit actions = %v; want %v", actions, want)
	}
	last := evs[3]
	if last.UserAgent != "audit-test/1" || last.RequestID != "req-audit-1" || last.SourceIP != "127.0.0.1" || !last.Time.Equal(end) {
		t.Errorf("refused stop entry = %+v; want its user agent, request id, peer address 127.0.0.1 and time", last)
	}
	if !evs[0].Time.Equal(start) || evs[0].RequestID == "" {
		t.Errorf("first entry = %+v; want time %v and a generated request id", evs[0], start)
	}

	// [from, to) is half-open.
	q := url.Values{"from": {mid.Format(time.RFC3339)}, "to": {end.Format(time.RFC3339)}}
	evs, _ = e.audit("?" + q.Encode())
	if len(evs) != 1 || evs[0].Action != "pause" {
		t.Errorf("audit [mid, end) = %+v; want the pause alone", evs)
	}
	evs, _ = e.audit("?from=" + url.QueryEscape(end.Format(time.RFC3339)))
	if len(evs) != 4 { // resume, the refused stop, and the two exports before
		t.Errorf("audit from end = %d entries; want 4", len(evs))
	}
	if status, _ := e.refused(adminToken, http.MethodGet, "/audit?from=yesterday", nil); status != 400 {
		t.Errorf("audit with a bad from = %d; want 400", status)
	}
	if status, _ := e.refused(adminToken, http.MethodGet, "/audit?"+url.Values{"from": {end.Format(time.RFC3339)}, "to": {mid.Format(time.RFC3339)}}.Encode(), nil); status != 400 {
		t.Errorf("audit with from after to = %d; want 400", status)
	}
	evs, _ = e.audit("?from=" + url.QueryEscape(end.Format(time.RFC3339)))
	if ev, ok := findEvent(evs, "audit.export", 200); !ok || ev.Actor != "alice:sgo_ADMI" || string(ev.After) != `{"entries":4}` {
		t.Errorf("first audit.export entry = %+v (after %s), %v; want alice's export of 4 entries", ev, ev.After, ok)
	}
}
