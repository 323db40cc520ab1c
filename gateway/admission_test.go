package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admin"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/reaper"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
	"github.com/sandgate/sandgate/token"
)

// operator is a second operator API over a harness's store, clock and
// provider whose stops, pauses and revokes also end the scope's running
// workspaces, as the broker's does. The harness's own operator API only
// sets controls.
type operator struct{ c *adminapi.Client }

func newOperator(t testing.TB, h *sgtest.Harness) *operator {
	t.Helper()
	log := slog.New(slog.NewJSONHandler(h.Logs, nil)).With("component", "admin")
	adm, err := admin.New(admin.Config{
		Tokens:   []adminapi.OperatorToken{{Name: "sweeper", Role: adminapi.RoleAdmin, Hash: token.Hash(h.AdminToken)}},
		Defaults: sandgate.Scope{DefaultImage: sgtest.DefaultImage},
	}, admin.Deps{DB: h.DB, Clock: h.Clock, Log: log, Providers: h.Providers, Billing: h.Billing,
		Terminator: termination.New(termination.Config{}, termination.Deps{DB: h.DB, Providers: h.Providers, Clock: h.Clock, Log: log})})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(adm.Handler())
	t.Cleanup(srv.Close)
	c, err := adminapi.NewClient(srv.URL, h.AdminToken, srv.Client())
	if err != nil {
		t.Fatalf("adminapi.NewClient: %v", err)
	}
	return &operator{c: c}
}

// do calls the operator API and fails t on any error.
// billing puts acct on a fresh rate card pricing every size at price per
// second, prepaid unless postpaid.
func (o *operator) billing(t testing.TB, acct, price string, postpaid bool) {
	t.Helper()
	card := "card-" + strings.ToLower(acct)
	o.do(t, http.MethodPost, "/rate-cards", adminapi.RateCardRequest{Name: card, Currency: "USD",
		Prices: map[string]string{"small": price, "standard": price, "large": price, "xlarge": price}}, nil)
	o.do(t, http.MethodPut, "/accounts/"+acct+"/billing", adminapi.BillingSettings{RateCard: card, Currency: "USD", Postpaid: postpaid}, nil)
}

func (o *operator) do(t testing.TB, method, path string, in, out any) {
	t.Helper()
	if err := o.c.Do(context.Background(), method, path, in, out); err != nil {
		t.Fatalf("operator API %s %s: %v", method, path, err)
	}
}

// wantSwept sets a stop or a pause (in, posted to path) and checks that its
// sweep terminated n workspaces and failed none; what names it in failures.
func (o *operator) wantSwept(t testing.TB, what, path string, in any, n int) {
	t.Helper()
	var res adminapi.Swept
	o.do(t, http.MethodPost, path, in, &res)
	if res != (adminapi.Swept{Terminated: n}) {
		t.Errorf("%s = %+v; want terminated %d, failed 0", what, res, n)
	}
}

func (o *operator) setLimits(t testing.TB, acct string, l adminapi.RiskLimits) {
	t.Helper()
	o.do(t, http.MethodPut, "/accounts/"+acct+"/limits", l, nil)
}

// wantRefused checks a refusal: its envelope, details.reason ("" for
// none) and Retry-After ("" for none).
func wantRefused(t testing.TB, label string, rep reply, status int, code protocol.Code, reason, retryAfter string) {
	t.Helper()
	env := wantError(t, label, rep, status, code)
	got, ok := env.Details["reason"]
	switch {
	case reason == "" && ok:
		t.Errorf("%s: details.reason = %v; want none", label, got)
	case reason != "" && got != reason:
		t.Errorf("%s: details.reason = %v; want %q", label, got, reason)
	}
	if got := rep.Header.Get(protocol.HeaderRetryAfter); got != retryAfter {
		t.Errorf("%s: Retry-After = %q; want %q", label, got, retryAfter)
	}
}

// leaseAdmission reads the token's lease and requires 200.
func leaseAdmission(t testing.TB, h *sgtest.Harness, tok sandgate.Secret) protocol.Admission {
	t.Helper()
	var l protocol.LeaseResponse
	wantOK(t, "lease", do(t, h, request{Method: http.MethodGet, Path: "/v1/lease", Token: tok}), http.StatusOK, &l)
	return l.Admission
}

func wantAdmission(t testing.TB, h *sgtest.Harness, tok sandgate.Secret, label, state, reason string) {
	t.Helper()
	want := protocol.Admission{State: state, Reason: reason}
	if got := leaseAdmission(t, h, tok); got != want {
		t.Errorf("%s: lease admission = %+v; want %+v", label, got, want)
	}
}

// wantEnded checks that a workspace is terminated with reason.
func wantEnded(t testing.TB, h *sgtest.Harness, tok sandgate.Secret, id string, reason sandgate.TerminationReason) {
	t.Helper()
	ws := getWorkspace(t, h, tok, id)
	if ws.State != string(sandgate.WorkspaceTerminated) || deref(ws.TerminationReason) != string(reason) {
		t.Errorf("workspace %s: state, termination_reason = %s, %v; want terminated, %s", id, ws.State, deref(ws.TerminationReason), reason)
	}
}

// wantRunning checks that a workspace is still running.
func wantRunning(t testing.TB, h *sgtest.Harness, tok sandgate.Secret, id string) {
	t.Helper()
	ws := getWorkspace(t, h, tok, id)
	if ws.State != string(sandgate.WorkspaceRunning) || ws.TerminationReason != nil {
		t.Errorf("workspace %s: state, termination_reason = %s, %v; want running, none", id, ws.State, deref(ws.TerminationReason))
	}
}

// ids returns the workspace ids of the token's instance, state=all.
func ids(t testing.TB, h *sgtest.Harness, tok sandgate.Secret) []string {
	t.Helper()
	var out []string
	for _, w := range listAll(t, h, tok) {
		out = append(out, w.WorkspaceID)
	}
	slices.Sort(out)
	return out
}

// TestAdmissionFailsClosed kills the harness's redis-server under a
// running gateway: Acquire fails closed and admits nothing, the lease of
// a cached token says why, and once Redis is back the same gateway admits
// the very request it refused, with the same Idempotency-Key.
func TestAdmissionFailsClosed(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	ctx := context.Background()
	// Every write is on disk before its answer, so the crash loses nothing.
	if err := h.DB.Redis().ConfigSet(ctx, "appendfsync", "always").Err(); err != nil {
		t.Fatalf("CONFIG SET appendfsync always: %v", err)
	}
	in := h.NewInstance(adminapi.Scope{})
	ws := acquire(t, h, in.Token, "before-crash")
	wantAdmission(t, h, in.Token, "before the crash", protocol.AdmissionOpen, "")

	h.Redis.Kill()
	acq := acquireReq(in.Token, "during-crash", acquireBody("crash"))
	wantRefused(t, "acquire right after the crash", do(t, h, acq), http.StatusServiceUnavailable, protocol.AdmissionUnavailable, "", "1")
	// The gateway notices the outage on its own; until then the lease may
	// still answer from the live cache.
	var during protocol.Admission
	sgtest.WaitFor(t, "the lease to report the outage", func() bool {
		during = leaseAdmission(t, h, in.Token)
		return during != protocol.Admission{State: protocol.AdmissionOpen}
	})
	if want := (protocol.Admission{State: protocol.AdmissionPaused, Reason: "unavailable"}); during != want {
		t.Errorf("lease admission during the outage = %+v; want %+v", during, want)
	}
	wantRefused(t, "acquire during the outage", do(t, h, acq), http.StatusServiceUnavailable, protocol.AdmissionUnavailable, "", "1")
	wantRefused(t, "release during the outage", do(t, h, request{Method: http.MethodDelete, Path: wsPath(ws.WorkspaceID), Token: in.Token}),
		http.StatusServiceUnavailable, protocol.Unavailable, "", "1")
	if got := len(h.Provider.CreateSpecs()); got != 1 {
		t.Errorf("provider creates during the outage = %d; want 1 (the one before)", got)
	}

	h.Redis.Restart()
	// The gateway finds Redis again on its own: its invalidation
	// subscription comes back. Until its connections have recovered, a
	// request may still meet the outage and be refused before admission
	// (a retryable 503), so the refused request is retried as a client
	// would, with the same key.
	sgtest.WaitFor(t, "the gateway to resubscribe", func() bool {
		n, err := h.DB.Redis().PubSubNumSub(ctx, store.InvalidateChannel).Result()
		return err == nil && n[store.InvalidateChannel] > 0
	})
	var rep reply
	sgtest.WaitFor(t, "admission to reopen", func() bool {
		rep = do(t, h, acq)
		if rep.Status != http.StatusServiceUnavailable {
			return true
		}
		var env protocol.Envelope
		if err := json.Unmarshal(rep.Body, &env); err != nil || (env.Error.Code != protocol.AdmissionUnavailable && env.Error.Code != protocol.Unavailable) {
			t.Errorf("acquire while recovering: 503 body %s; want admission_unavailable or unavailable", rep.Body)
		}
		return false
	})
	var again protocol.Workspace
	wantOK(t, "acquire with the refused key after restart", rep, http.StatusCreated, &again)
	wantAdmission(t, h, in.Token, "after restart", protocol.AdmissionOpen, "")
	if got, want := ids(t, h, in.Token), sortedIDs(ws.WorkspaceID, again.WorkspaceID); !slices.Equal(got, want) {
		t.Errorf("workspaces after restart = %v; want %v (nothing admitted during the outage)", got, want)
	}
	if got := h.LiveCount(in); got != 2 {
		t.Errorf("live slots after restart = %d; want 2", got)
	}
	if got := len(h.Provider.CreateSpecs()); got != 2 {
		t.Errorf("provider creates = %d; want 2", got)
	}
	if got := release(t, h, in.Token, ws.WorkspaceID); got.State != string(sandgate.WorkspaceTerminated) {
		t.Errorf("release after restart: state = %s; want terminated", got.State)
	}
	var replay protocol.Workspace
	wantOK(t, "replay after restart", do(t, h, acq), http.StatusOK, &replay)
	if replay.WorkspaceID != again.WorkspaceID {
		t.Errorf("replay workspace_id = %s; want %s", replay.WorkspaceID, again.WorkspaceID)
	}
}

func sortedIDs(ids ...string) []string {
	slices.Sort(ids)
	return ids
}

// wantClosed checks that each of ins is refused an acquire under key, 403
// with code and details.reason reason, and that its lease reports
// admission state with that reason; a refusal leaves key unused. what
// names the condition in failures.
func wantClosed(t testing.TB, h *sgtest.Harness, what, key string, code protocol.Code, state, reason string, ins ...sgtest.Instance) {
	t.Helper()
	for _, in := range ins {
		wantRefused(t, "acquire "+what, do(t, h, acquireReq(in.Token, key, acquireBody("closed"))),
			http.StatusForbidden, code, reason, "")
		wantAdmission(t, h, in.Token, what, state, reason)
	}
}

// wantOpen checks that each of ins is admitted: its lease reports
// admission open, and an acquire under key creates a workspace.
func wantOpen(t testing.TB, h *sgtest.Harness, what, key string, ins ...sgtest.Instance) {
	t.Helper()
	for _, in := range ins {
		wantAdmission(t, h, in.Token, what, protocol.AdmissionOpen, "")
		acquire(t, h, in.Token, key)
	}
}

// runningInTwoAccounts makes instances a and b of two accounts, and
// acquires two workspaces on a and one on b.
func runningInTwoAccounts(t testing.TB, h *sgtest.Harness) (a, b sgtest.Instance, wa1, wa2, wb protocol.Workspace) {
	t.Helper()
	a, b = h.NewInstance(adminapi.Scope{}), h.NewInstance(adminapi.Scope{})
	return a, b, acquire(t, h, a.Token, "a1"), acquire(t, h, a.Token, "a2"), acquire(t, h, b.Token, "b1")
}

// TestEmergencyStop sets the broker-wide stop over running workspaces of
// two accounts: every one ends, no instance is admitted, release still
// answers, and lifting the stop restores admission.
func TestEmergencyStop(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	op := newOperator(t, h)
	a, b, wa1, wa2, wb := runningInTwoAccounts(t, h)

	op.wantSwept(t, "stop", "/stop", adminapi.StopRequest{On: new(true), Reason: "incident"}, 3)
	for _, w := range []struct {
		tok sandgate.Secret
		id  string
	}{{a.Token, wa1.WorkspaceID}, {a.Token, wa2.WorkspaceID}, {b.Token, wb.WorkspaceID}} {
		wantEnded(t, h, w.tok, w.id, sandgate.ReasonEmergencyStopped)
	}
	if got := h.Provider.Live(); got != 0 {
		t.Errorf("provider sandboxes after the stop = %d; want 0", got)
	}
	wantClosed(t, h, "while stopped", "stopped", protocol.EmergencyStopped, protocol.AdmissionEmergencyStopped, "incident", a, b)
	if got := release(t, h, a.Token, wa1.WorkspaceID); got.State != string(sandgate.WorkspaceTerminated) || deref(got.TerminationReason) != "emergency_stopped" {
		t.Errorf("release while stopped = %s, %v; want terminated, emergency_stopped", got.State, deref(got.TerminationReason))
	}

	op.do(t, http.MethodPost, "/stop", adminapi.StopRequest{On: new(false)}, nil)
	wantOpen(t, h, "after the stop", "stopped", a, b)
}

// TestAccountStop stops one account: only its workspaces end and only it
// is refused.
func TestAccountStop(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	op := newOperator(t, h)
	a1, a2, b := twoAccounts(h)
	w1, w2, wb := acquire(t, h, a1.Token, "a1"), acquire(t, h, a2.Token, "a2"), acquire(t, h, b.Token, "b")

	op.wantSwept(t, "account stop", "/stop", adminapi.StopRequest{On: new(true), AccountID: a1.AccountID, Reason: "fraud-review"}, 2)
	wantEnded(t, h, a1.Token, w1.WorkspaceID, sandgate.ReasonEmergencyStopped)
	wantEnded(t, h, a2.Token, w2.WorkspaceID, sandgate.ReasonEmergencyStopped)
	wantRunning(t, h, b.Token, wb.WorkspaceID)
	wantClosed(t, h, "in the stopped account", "stopped", protocol.EmergencyStopped, protocol.AdmissionEmergencyStopped, "fraud-review", a1, a2)
	wantOpen(t, h, "other account", "other-account", b)
	release(t, h, a2.Token, w2.WorkspaceID)

	op.do(t, http.MethodPost, "/stop", adminapi.StopRequest{On: new(false), AccountID: a1.AccountID}, nil)
	wantOpen(t, h, "after the account stop", "stopped", a1)
}

// TestPause pauses one instance, then its whole account: a pause refuses
// and ends exactly its scope, the lease says so, and resume restores it.
func TestPause(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	op := newOperator(t, h)
	i1, i2, other := twoAccounts(h)
	w1, w2, wo := acquire(t, h, i1.Token, "i1"), acquire(t, h, i2.Token, "i2"), acquire(t, h, other.Token, "o")

	// An instance pause with no reason: its default.
	op.wantSwept(t, "instance pause", "/pause", adminapi.PauseRequest{InstanceID: i1.ID}, 1)
	wantEnded(t, h, i1.Token, w1.WorkspaceID, sandgate.ReasonPaused)
	wantRunning(t, h, i2.Token, w2.WorkspaceID)
	wantClosed(t, h, "in the paused instance", "p1", protocol.Paused, protocol.AdmissionPaused, "instance_paused", i1)
	wantAdmission(t, h, i2.Token, "sibling of the paused instance", protocol.AdmissionOpen, "")
	w2b := acquire(t, h, i2.Token, "i2-b")
	wantRunning(t, h, i2.Token, w2.WorkspaceID)
	op.do(t, http.MethodPost, "/resume", adminapi.ResumeRequest{InstanceID: i1.ID}, nil)
	wantAdmission(t, h, i1.Token, "resumed instance", protocol.AdmissionOpen, "")
	w1b := acquire(t, h, i1.Token, "p1")

	// An account pause with a reason: every instance of the account.
	op.wantSwept(t, "account pause", "/pause", adminapi.PauseRequest{AccountID: i1.AccountID, Reason: "payment"}, 3)
	for _, w := range []struct {
		tok sandgate.Secret
		id  string
	}{{i1.Token, w1b.WorkspaceID}, {i2.Token, w2.WorkspaceID}, {i2.Token, w2b.WorkspaceID}} {
		wantEnded(t, h, w.tok, w.id, sandgate.ReasonPaused)
	}
	wantRunning(t, h, other.Token, wo.WorkspaceID)
	wantClosed(t, h, "in the paused account", "p2", protocol.Paused, protocol.AdmissionPaused, "payment", i1, i2)
	wantOpen(t, h, "other account", "o2", other)
	release(t, h, i2.Token, w2.WorkspaceID)

	op.do(t, http.MethodPost, "/resume", adminapi.ResumeRequest{AccountID: i1.AccountID}, nil)
	wantOpen(t, h, "resumed account", "p2", i1, i2)
}

// TestRefusalLeavesNoTrace refuses an Acquire for each admission reason
// and checks that the refusal wrote nothing: no workspace, no slot, no
// provider call, and the Idempotency-Key still unused, so the same request
// is admitted once the condition clears (spec §Idempotency).
func TestRefusalLeavesNoTrace(t *testing.T) {
	t.Parallel()
	type env struct {
		h     *sgtest.Harness
		op    *operator
		in    sgtest.Instance
		held  []string        // workspaces the setup acquired
		other sgtest.Instance // another instance of the account, when the setup made one
	}
	tests := []struct {
		name       string
		scope      adminapi.Scope
		body       protocol.AcquireRequest
		setup      func(t *testing.T, e *env)
		status     int
		code       protocol.Code
		reason     string
		retryAfter string
		clear      func(t *testing.T, e *env)
	}{
		{
			name: "broker stop",
			setup: func(t *testing.T, e *env) {
				e.op.do(t, http.MethodPost, "/stop", adminapi.StopRequest{On: new(true), Reason: "incident"}, nil)
			},
			status: http.StatusForbidden, code: protocol.EmergencyStopped, reason: "incident",
			clear: func(t *testing.T, e *env) {
				e.op.do(t, http.MethodPost, "/stop", adminapi.StopRequest{On: new(false)}, nil)
			},
		},
		{
			name: "account stop",
			setup: func(t *testing.T, e *env) {
				e.op.do(t, http.MethodPost, "/stop", adminapi.StopRequest{On: new(true), AccountID: e.in.AccountID, Reason: "operator"}, nil)
			},
			status: http.StatusForbidden, code: protocol.EmergencyStopped, reason: "operator",
			clear: func(t *testing.T, e *env) {
				e.op.do(t, http.MethodPost, "/stop", adminapi.StopRequest{On: new(false), AccountID: e.in.AccountID}, nil)
			},
		},
		{
			name: "account pause",
			setup: func(t *testing.T, e *env) {
				e.op.do(t, http.MethodPost, "/pause", adminapi.PauseRequest{AccountID: e.in.AccountID}, nil)
			},
			status: http.StatusForbidden, code: protocol.Paused, reason: "account_paused",
			clear: func(t *testing.T, e *env) {
				e.op.do(t, http.MethodPost, "/resume", adminapi.ResumeRequest{AccountID: e.in.AccountID}, nil)
			},
		},
		{
			name: "instance pause",
			setup: func(t *testing.T, e *env) {
				e.op.do(t, http.MethodPost, "/pause", adminapi.PauseRequest{InstanceID: e.in.ID, Reason: "maintenance"}, nil)
			},
			status: http.StatusForbidden, code: protocol.Paused, reason: "maintenance",
			clear: func(t *testing.T, e *env) {
				e.op.do(t, http.MethodPost, "/resume", adminapi.ResumeRequest{InstanceID: e.in.ID}, nil)
			},
		},
		{
			name:  "concurrency limit",
			scope: adminapi.Scope{Limits: protocol.Limits{MaxConcurrentWorkspaces: 1}},
			setup: func(t *testing.T, e *env) {
				e.held = append(e.held, acquire(t, e.h, e.in.Token, "held").WorkspaceID)
			},
			status: http.StatusTooManyRequests, code: protocol.ConcurrencyLimit,
			clear: func(t *testing.T, e *env) { release(t, e.h, e.in.Token, e.held[0]) },
		},
		{
			name:  "risk velocity",
			scope: adminapi.Scope{Limits: protocol.Limits{MaxConcurrentWorkspaces: 10}},
			setup: func(t *testing.T, e *env) {
				e.op.setLimits(t, e.in.AccountID, adminapi.RiskLimits{AcquiresPerMinute: 2})
				e.held = append(e.held, acquire(t, e.h, e.in.Token, "v1").WorkspaceID, acquire(t, e.h, e.in.Token, "v2").WorkspaceID)
			},
			// Both acquires were at the same instant: the window frees in 60s.
			status: http.StatusTooManyRequests, code: protocol.RiskLimit, reason: "velocity", retryAfter: "60",
			clear: func(t *testing.T, e *env) { e.h.Clock.Advance(60 * time.Second) },
		},
		{
			name: "risk open workspaces",
			setup: func(t *testing.T, e *env) {
				e.op.setLimits(t, e.in.AccountID, adminapi.RiskLimits{MaxOpenWorkspaces: 1})
				// The limit is the account's: another instance holds it.
				other := e.h.NewInstanceIn(e.in.AccountID, adminapi.Scope{})
				e.held = append(e.held, acquire(t, e.h, other.Token, "open").WorkspaceID)
				e.other = other
			},
			status: http.StatusTooManyRequests, code: protocol.RiskLimit, reason: "open_workspaces",
			clear: func(t *testing.T, e *env) { release(t, e.h, e.other.Token, e.held[0]) },
		},
		{
			name: "risk request cap",
			body: protocol.AcquireRequest{Label: "big", Size: "standard", Egress: &protocol.Egress{AllowedDomains: []string{}}},
			setup: func(t *testing.T, e *env) {
				e.op.setLimits(t, e.in.AccountID, adminapi.RiskLimits{MaxSize: "small"})
			},
			status: http.StatusTooManyRequests, code: protocol.RiskLimit, reason: "request_cap",
			clear: func(t *testing.T, e *env) { e.op.setLimits(t, e.in.AccountID, adminapi.RiskLimits{}) },
		},
		{
			name: "insufficient funds",
			setup: func(t *testing.T, e *env) {
				// Prepaid at 0.000100/s with balance 0: nothing is covered.
				e.op.billing(t, e.in.AccountID, "0.000100", false)
			},
			status: http.StatusPaymentRequired, code: protocol.InsufficientFunds,
			clear: func(t *testing.T, e *env) {
				e.op.do(t, http.MethodPost, "/accounts/"+e.in.AccountID+"/funds/credit",
					adminapi.FundsRequest{Amount: "100.00", Reason: "top-up", IdempotencyKey: "k"}, nil)
			},
		},
		{
			name: "instance budget",
			setup: func(t *testing.T, e *env) {
				e.op.billing(t, e.in.AccountID, "0.000100", true)
				e.op.do(t, http.MethodPut, "/accounts/"+e.in.AccountID+"/budgets",
					adminapi.BudgetRequest{InstanceID: e.in.ID, Monthly: "0.000001"}, nil)
			},
			status: http.StatusPaymentRequired, code: protocol.BudgetExhausted, reason: "instance",
			clear: func(t *testing.T, e *env) {
				e.op.do(t, http.MethodPut, "/accounts/"+e.in.AccountID+"/budgets",
					adminapi.BudgetRequest{InstanceID: e.in.ID, Monthly: "1000.00"}, nil)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := sgtest.New(t, sgtest.Options{})
			e := &env{h: h, op: newOperator(t, h), in: h.NewInstance(tt.scope)}
			tt.setup(t, e)
			body := tt.body
			if body.Label == "" {
				body = acquireBody("refused")
			}
			acq := acquireReq(e.in.Token, "refused-key", body)
			before, live, creates := ids(t, h, e.in.Token), h.LiveCount(e.in), len(h.Provider.CreateSpecs())

			for i := range 2 {
				wantRefused(t, fmt.Sprintf("acquire %d", i), do(t, h, acq), tt.status, tt.code, tt.reason, tt.retryAfter)
			}
			if got := ids(t, h, e.in.Token); !slices.Equal(got, before) {
				t.Errorf("workspaces after the refusal = %v; want %v", got, before)
			}
			if got := h.LiveCount(e.in); got != live {
				t.Errorf("live slots after the refusal = %d; want %d", got, live)
			}
			if got := len(h.Provider.CreateSpecs()); got != creates {
				t.Errorf("provider creates after the refusal = %d; want %d", got, creates)
			}

			tt.clear(t, e)
			var ws protocol.Workspace
			wantOK(t, "acquire with the refused key once cleared", do(t, h, acq), http.StatusCreated, &ws)
			if got := ids(t, h, e.in.Token); !slices.Contains(got, ws.WorkspaceID) || len(got) != len(before)+1 {
				t.Errorf("workspaces once admitted = %v; want %v and %s", got, before, ws.WorkspaceID)
			}
			var replay protocol.Workspace
			wantOK(t, "replay", do(t, h, acq), http.StatusOK, &replay)
			if replay.WorkspaceID != ws.WorkspaceID {
				t.Errorf("replay workspace_id = %s; want %s", replay.WorkspaceID, ws.WorkspaceID)
			}
		})
	}
}

// TestRateLimits limits each operation class per token, never Release.
func TestRateLimits(t *testing.T) {
	t.Parallel()
	// One request per 100 seconds, two at once: the third quick request is
	// refused however slow the machine is.
	slow := admission.Rate{PerSecond: 0.01, Burst: 2}
	h := sgtest.New(t, sgtest.Options{RateLimits: map[admission.Class]admission.Rate{
		admission.ClassAcquire: slow, admission.ClassRead: slow, admission.ClassExec: slow,
	}})
	wantLimited := func(t *testing.T, label string, rep reply) {
		t.Helper()
		env := wantError(t, label, rep, http.StatusTooManyRequests, protocol.RateLimited)
		if !env.Retryable {
			t.Errorf("%s: retryable = false; want true", label)
		}
		if got := env.Details["reason"]; got != "rate" {
			t.Errorf("%s: details.reason = %v; want rate", label, got)
		}
		ra, err := strconv.Atoi(rep.Header.Get(protocol.HeaderRetryAfter))
		if err != nil || ra < 1 || ra > 100 {
			t.Errorf("%s: Retry-After = %q; want 1 to 100 seconds", label, rep.Header.Get(protocol.HeaderRetryAfter))
		}
	}
	lease := func(tok sandgate.Secret) request {
		return request{Method: http.MethodGet, Path: "/v1/lease", Token: tok}
	}

	t.Run("acquire", func(t *testing.T) {
		t.Parallel()
		in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxConcurrentWorkspaces: 10}})
		acquire(t, h, in.Token, "r1")
		acquire(t, h, in.Token, "r2")
		wantLimited(t, "third acquire", do(t, h, acquireReq(in.Token, "r3", acquireBody("r"))))
		if got := len(ids(t, h, in.Token)); got != 2 {
			t.Errorf("workspaces after the limited acquire = %d; want 2", got)
		}
		wantOK(t, "lease of the limited token", do(t, h, lease(in.Token)), http.StatusOK, nil)
		// Limits are per token: another instance's, and another token of
		// the same instance, have their own.
		other := h.NewInstance(adminapi.Scope{})
		acquire(t, h, other.Token, "r1")
		acquire(t, h, other.Token, "r2")
		second := sandgate.Secret(h.IssueToken(in.ID, adminapi.IssueTokenRequest{}).Token)
		acquire(t, h, second, "r3")
	})
	t.Run("read", func(t *testing.T) {
		t.Parallel()
		in := h.NewInstance(adminapi.Scope{})
		for i := range 2 {
			wantOK(t, fmt.Sprintf("lease %d", i), do(t, h, lease(in.Token)), http.StatusOK, nil)
		}
		wantLimited(t, "third lease", do(t, h, lease(in.Token)))
		wantLimited(t, "list after two leases", do(t, h, request{Method: http.MethodGet, Path: "/v1/workspaces", Token: in.Token}))
		ws := acquire(t, h, in.Token, "read-1")
		wantLimited(t, "get after two leases", do(t, h, request{Method: http.MethodGet, Path: wsPath(ws.WorkspaceID), Token: in.Token}))
		other := h.NewInstance(adminapi.Scope{})
		wantOK(t, "another token's lease", do(t, h, lease(other.Token)), http.StatusOK, nil)
	})
	t.Run("exec", func(t *testing.T) {
		t.Parallel()
		in := h.NewInstance(adminapi.Scope{})
		ws := acquire(t, h, in.Token, "exec-1")
		ops := workspaceOps(in.Token, ws.WorkspaceID) // get, exec, read, write, delete
		wantOK(t, "exec", do(t, h, ops[1]), http.StatusOK, nil)
		wantOK(t, "write", do(t, h, ops[3]), http.StatusNoContent, nil)
		wantLimited(t, "read after exec and write", do(t, h, ops[2]))
		wantLimited(t, "exec after exec and write", do(t, h, ops[1]))
		wantRunning(t, h, in.Token, ws.WorkspaceID)
	})
	t.Run("release", func(t *testing.T) {
		t.Parallel()
		in := h.NewInstance(adminapi.Scope{})
		w1, w2 := acquire(t, h, in.Token, "rel-1"), acquire(t, h, in.Token, "rel-2")
		ops := workspaceOps(in.Token, w1.WorkspaceID)
		for range 2 {
			wantOK(t, "lease", do(t, h, lease(in.Token)), http.StatusOK, nil)
			wantOK(t, "exec", do(t, h, ops[1]), http.StatusOK, nil)
		}
		wantLimited(t, "lease over the limit", do(t, h, lease(in.Token)))
		wantLimited(t, "exec over the limit", do(t, h, ops[1]))
		wantLimited(t, "acquire over the limit", do(t, h, acquireReq(in.Token, "rel-3", acquireBody("r"))))
		for i := range 10 {
			for _, id := range []string{w1.WorkspaceID, w2.WorkspaceID} {
				var ws protocol.Workspace
				wantOK(t, fmt.Sprintf("release %d of %s", i, id), do(t, h, request{Method: http.MethodDelete, Path: wsPath(id), Token: in.Token}), http.StatusOK, &ws)
				if ws.State != string(sandgate.WorkspaceTerminated) {
					t.Errorf("release %d of %s: state = %s; want terminated", i, id, ws.State)
				}
			}
		}
		if got := h.LiveCount(in); got != 0 {
			t.Errorf("live slots after release = %d; want 0", got)
		}
	})
}

// TestRevokeTerminates revokes an instance's tokens through the operator
// API: by default its running workspaces end (lease_revoked); with
// terminate_workspaces false they keep running.
func TestRevokeTerminates(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	op := newOperator(t, h)
	a, b, wa1, wa2, wb := runningInTwoAccounts(t, h)

	var res adminapi.RevokeResult
	op.do(t, http.MethodPost, "/instances/"+a.ID+"/tokens/revoke", nil, &res)
	if res != (adminapi.RevokeResult{Count: 1, Terminated: 2}) {
		t.Errorf("revoke = %+v; want count 1, terminated 2, failed 0", res)
	}
	wantError(t, "lease of the revoked token", do(t, h, request{Method: http.MethodGet, Path: "/v1/lease", Token: a.Token}),
		http.StatusUnauthorized, protocol.LeaseRevoked)
	nextA := sandgate.Secret(h.IssueToken(a.ID, adminapi.IssueTokenRequest{}).Token)
	wantEnded(t, h, nextA, wa1.WorkspaceID, sandgate.ReasonLeaseRevoked)
	wantEnded(t, h, nextA, wa2.WorkspaceID, sandgate.ReasonLeaseRevoked)

	res = adminapi.RevokeResult{}
	op.do(t, http.MethodPost, "/instances/"+b.ID+"/tokens/revoke", adminapi.RevokeRequest{TerminateWorkspaces: new(false)}, &res)
	if res != (adminapi.RevokeResult{Count: 1}) {
		t.Errorf("revoke keeping workspaces = %+v; want count 1, terminated 0, failed 0", res)
	}
	wantError(t, "lease of the revoked token", do(t, h, request{Method: http.MethodGet, Path: "/v1/lease", Token: b.Token}),
		http.StatusUnauthorized, protocol.LeaseRevoked)
	nextB := sandgate.Secret(h.IssueToken(b.ID, adminapi.IssueTokenRequest{}).Token)
	wantRunning(t, h, nextB, wb.WorkspaceID)
	if got := h.Provider.Live(); got != 1 {
		t.Errorf("provider sandboxes = %d; want 1", got)
	}
}

// TestReaperSweepsControlledScopes sets controls without the operator
// API's sweep, as when a workspace was admitted while a pause or stop was
// being set: a reaper pass ends exactly the controlled scopes' workspaces.
func TestReaperSweepsControlledScopes(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	ctx := context.Background()
	i1, i2, lapsed := twoAccounts(h)
	other := h.NewInstance(adminapi.Scope{})
	w1, w2 := acquire(t, h, i1.Token, "w1"), acquire(t, h, i2.Token, "w2")
	wl, wo := acquire(t, h, lapsed.Token, "wl"), acquire(t, h, other.Token, "wo")
	now := h.Clock.Now().UnixMilli()
	set := func(acct, field string, c *store.Control) {
		t.Helper()
		if err := h.DB.SetControl(ctx, acct, field, c); err != nil {
			t.Fatalf("SetControl %s %s: %v", acct, field, err)
		}
	}
	set(i1.AccountID, store.InstancePauseField(i1.ID), &store.Control{Reason: "instance_paused", Actor: "test", Since: now})
	set(lapsed.AccountID, store.FieldPause, &store.Control{Reason: "account_paused", Actor: "test", Since: now - 1000, Until: now})
	wantRunning(t, h, i1.Token, w1.WorkspaceID)

	r := reaper.New(reaper.Config{}, reaper.Deps{DB: h.DB, Terminator: h.Terminator, Clock: h.Clock})
	pass := func() {
		t.Helper()
		if err := r.Pass(ctx); err != nil {
			t.Fatalf("reaper pass: %v", err)
		}
	}
	pass()
	wantEnded(t, h, i1.Token, w1.WorkspaceID, sandgate.ReasonPaused)
	wantRunning(t, h, i2.Token, w2.WorkspaceID)
	wantRunning(t, h, lapsed.Token, wl.WorkspaceID)
	wantRunning(t, h, other.Token, wo.WorkspaceID)

	set(i1.AccountID, store.FieldStop, &store.Control{Reason: "operator", Actor: "test", Since: now})
	pass()
	wantEnded(t, h, i2.Token, w2.WorkspaceID, sandgate.ReasonEmergencyStopped)
	wantEnded(t, h, i1.Token, w1.WorkspaceID, sandgate.ReasonPaused) // ended once, with its first reason
	wantRunning(t, h, other.Token, wo.WorkspaceID)

	if err := h.DB.SetGlobalStop(ctx, &store.Control{Reason: "incident", Actor: "test", Since: now}); err != nil {
		t.Fatalf("SetGlobalStop: %v", err)
	}
	pass()
	wantEnded(t, h, lapsed.Token, wl.WorkspaceID, sandgate.ReasonEmergencyStopped)
	wantEnded(t, h, other.Token, wo.WorkspaceID, sandgate.ReasonEmergencyStopped)
	if got := h.Provider.Live(); got != 0 {
		t.Errorf("provider sandboxes = %d; want 0", got)
	}
}
