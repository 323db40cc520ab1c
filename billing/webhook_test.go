package billing_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
)

const hookSecret = sandgate.Secret("whsec_test")

// hookReceiver is a webhook endpoint on loopback that verifies every
// signature and answers with the statuses in fail first, then 200.
type hookReceiver struct {
	t        *testing.T
	srv      *httptest.Server
	mu       sync.Mutex
	fail     []int
	attempts map[string]int // event id → requests
	events   []billing.WebhookEvent
}

func newHookReceiver(t *testing.T, fail ...int) *hookReceiver {
	r := &hookReceiver{t: t, fail: fail, attempts: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if err := billing.VerifyWebhook(hookSecret, req.Header.Get(billing.HeaderSignature), body, time.Now(), time.Minute); err != nil {
			t.Errorf("webhook: %v", err)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var ev billing.WebhookEvent
		if err := json.Unmarshal(body, &ev); err != nil {
			t.Errorf("webhook body: %v", err)
		}
		if got := req.Header.Get(billing.HeaderEventID); got != ev.ID {
			t.Errorf("%s = %q, body id %q", billing.HeaderEventID, got, ev.ID)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.attempts[ev.ID]++
		if len(r.fail) > 0 {
			code := r.fail[0]
			r.fail = r.fail[1:]
			w.WriteHeader(code)
			return
		}
		r.events = append(r.events, ev)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *hookReceiver) delivered() []billing.WebhookEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]billing.WebhookEvent(nil), r.events...)
}

// newHookEnv is newEnv with a webhook to url and fast retries.
func newHookEnv(t *testing.T, url string) *env {
	t.Helper()
	db := store.New(store.Config{}, redistest.Start(t).Client())
	clock := sgtest.NewClock(time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC))
	b := billing.New(billing.Config{Webhook: billing.WebhookConfig{URL: url, Secret: hookSecret,
		Timeout: 2 * time.Second, Backoff: 50 * time.Millisecond, Poll: 20 * time.Millisecond}}, billing.Deps{DB: db})
	pipe := admission.New(db.Redis(), admission.Standard(db, admission.StandardConfig{
		IdempotencyTTL: time.Hour, PendingTimeout: 2 * time.Minute,
		Risk:    admission.RiskDefaults{AcquiresPerMinute: 100000, MaxOpenWorkspaces: 100000},
		Billing: b.Checks(),
	})...)
	term := termination.New(termination.Config{}, termination.Deps{DB: db, Clock: clock, Settler: b})
	return &env{t: t, db: db, bill: b, pipe: pipe, term: term, clock: clock}
}

func (e *env) runWebhooks() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.bill.RunWebhooks(ctx) }()
	e.t.Cleanup(func() { cancel(); <-done })
}

// newAlertedEnv is newHookEnv with a webhook receiver answering fail
// first, and an account acct whose soft budget of one micro-unit a
// workspace took past 50, 80 and 100 %: three alerts queued, not flushed.
func newAlertedEnv(t *testing.T, acct string, fail ...int) (*env, *hookReceiver) {
	t.Helper()
	r := newHookReceiver(t, fail...)
	e := newHookEnv(t, r.srv.URL)
	e.account(acct, 1000, false)
	e.credit(acct, 1_000_000_000, "c1")
	if err := e.bill.SetBudget(context.Background(), acct, billing.Budget{MonthlyMicros: 1, Soft: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.acquire(acct, "inst_"+acct, "", time.Minute); err != nil {
		t.Fatal(err)
	}
	return e, r
}

func waitEvents(t *testing.T, r *hookReceiver, n int) []billing.WebhookEvent {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if ev := r.delivered(); len(ev) >= n {
			return ev
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("webhook: %d events delivered, want %d", len(r.delivered()), n)
	return nil
}

// TestWebhookThresholdsOncePerMonth crosses 50, 80 and 100 % of a soft
// account budget and checks that each threshold is delivered, signed,
// exactly once a month, and again in the next month.
func TestWebhookThresholdsOncePerMonth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newHookReceiver(t)
	e := newHookEnv(t, r.srv.URL)
	e.account("acct_h", 1000, false)
	e.credit("acct_h", 1_000_000_000, "c1")
	w, err := e.acquire("acct_h", "inst_h", "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	hold := w.Price.HoldMicros
	if hold <= 0 {
		t.Fatalf("hold = %d", hold)
	}
	// The first workspace alone is 60 % of the budget; the second takes it
	// to 120 %: 50, then 80 and 100.
	if err := e.bill.SetBudget(ctx, "acct_h", billing.Budget{MonthlyMicros: hold * 5 / 3, Soft: true}); err != nil {
		t.Fatal(err)
	}
	e.runWebhooks()
	for range 3 {
		if _, err := e.acquire("acct_h", "inst_h", "", time.Minute); err != nil {
			t.Fatal(err)
		}
		e.bill.FlushAlerts(ctx, "acct_h")
	}
	got := waitEvents(t, r, 3)
	sort.Slice(got, func(i, j int) bool { return got[i].Percent < got[j].Percent })
	seen := map[string]bool{}
	for i, want := range []int{50, 80, 100} {
		ev := got[i]
		if ev.Percent != want || ev.AccountID != "acct_h" || ev.Scope != "a" || ev.Month != "202603" ||
			ev.Currency != "USD" || ev.CapMicros != hold*5/3 || ev.SpentMicros <= 0 || ev.At.IsZero() {
			t.Errorf("event %d = %+v; want %d %% of account acct_h's budget, USD, March", i, ev, want)
		}
		if seen[ev.ID] {
			t.Errorf("event id %s twice", ev.ID)
		}
		seen[ev.ID] = true
	}
	// Next month the budget starts over: 50 % once more, under a new id.
	e.clock.Advance(30 * 24 * time.Hour)
	if _, err := e.acquire("acct_h", "inst_h", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	e.bill.FlushAlerts(ctx, "acct_h")
	got = waitEvents(t, r, 4)
	if ev := got[3]; ev.Percent != 50 || ev.Month != "202604" || seen[ev.ID] {
		t.Errorf("next month's event = %+v; want a new 50 %% alert for 202604", ev)
	}
	time.Sleep(200 * time.Millisecond)
	if n := len(r.delivered()); n != 4 {
		t.Errorf("%d events delivered, want 4 (one per threshold per month)", n)
	}
}

// TestWebhookRetried answers 500 then 200: the alert is retried with the
// same id and signature scheme, and delivered once.
func TestWebhookRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, r := newAlertedEnv(t, "acct_r", http.StatusInternalServerError, http.StatusBadGateway)
	// Queued before any deliverer runs: the queue is in Redis, not in the
	// process that saw the alert.
	e.bill.FlushAlerts(ctx, "acct_r")
	e.runWebhooks()
	waitEvents(t, r, 3)
	time.Sleep(300 * time.Millisecond) // room for a duplicate delivery to show up
	got := r.delivered()
	if len(got) != 3 {
		t.Fatalf("%d events delivered, want 3 (50, 80, 100 %%)", len(got))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	total := 0
	for id, n := range r.attempts {
		total += n
		if n > 3 {
			t.Errorf("event %s: %d requests", id, n)
		}
	}
	if total != 5 {
		t.Errorf("%d requests, want 5: two failures retried, then three deliveries", total)
	}
}

func TestValidateWebhookURL(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		url string
		ok  bool
	}{
		{"https://hooks.example.com/sandgate", true},
		{"http://127.0.0.1:8080/h", true},
		{"http://[::1]:8080/h", true},
		{"http://localhost/h", true},
		{"http://hooks.example.com/h", false},
		{"ftp://hooks.example.com/h", false},
		{"/relative", false},
		{"", false},
	} {
		if err := billing.ValidateWebhookURL(c.url); (err == nil) != c.ok {
			t.Errorf("ValidateWebhookURL(%q) = %v, want ok %v", c.url, err, c.ok)
		}
	}
}

func TestVerifyWebhookRejectsTampering(t *testing.T) {
	t.Parallel()
	now := time.Now()
	body := []byte(`{"id":"bga_1"}`)
	sig := billing.SignWebhook(hookSecret, now, body)
	if err := billing.VerifyWebhook(hookSecret, sig, body, now, time.Minute); err != nil {
		t.Fatalf("VerifyWebhook of its own signature: %v", err)
	}
	if billing.VerifyWebhook(hookSecret, sig, []byte(`{"id":"bga_2"}`), now, time.Minute) == nil {
		t.Error("VerifyWebhook accepted another body")
	}
	if billing.VerifyWebhook("other", sig, body, now, time.Minute) == nil {
		t.Error("VerifyWebhook accepted another secret")
	}
	if billing.VerifyWebhook(hookSecret, sig, body, now.Add(time.Hour), time.Minute) == nil {
		t.Error("VerifyWebhook accepted a stale signature")
	}
}

// TestWebhookSurvivesDelivererCrash ends a deliverer in the middle of an
// attempt, as a gateway crash would: its claim lapses and another process
// delivers the alert, once.
func TestWebhookSurvivesDelivererCrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	started := make(chan struct{}, 1)
	var mu sync.Mutex
	var delivered []string
	first := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if err := billing.VerifyWebhook(hookSecret, req.Header.Get(billing.HeaderSignature), body, time.Now(), time.Minute); err != nil {
			t.Errorf("webhook: %v", err)
		}
		mu.Lock()
		hang := first
		first = false
		mu.Unlock()
		if hang {
			started <- struct{}{}
			<-req.Context().Done()
			return
		}
		mu.Lock()
		delivered = append(delivered, req.Header.Get(billing.HeaderEventID))
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	e := newHookEnv(t, srv.URL)
	e.account("acct_c", 1000, false)
	e.credit("acct_c", 1_000_000_000, "c1")
	w, err := e.acquire("acct_c", "inst_c", "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// Only the 50 % threshold: one alert.
	if err := e.bill.SetBudget(ctx, "acct_c", billing.Budget{MonthlyMicros: w.Price.HoldMicros * 3, Soft: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.acquire("acct_c", "inst_c", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	e.bill.FlushAlerts(ctx, "acct_c")

	crashCtx, crash := context.WithCancel(ctx)
	crashed := make(chan struct{})
	go func() { defer close(crashed); e.bill.RunWebhooks(crashCtx) }()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery attempt")
	}
	crash()
	<-crashed

	other := billing.New(billing.Config{Webhook: billing.WebhookConfig{URL: srv.URL, Secret: hookSecret,
		Timeout: 2 * time.Second, Backoff: 50 * time.Millisecond, Poll: 50 * time.Millisecond}}, billing.Deps{DB: e.db})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); other.RunWebhooks(runCtx) }()
	defer func() { stop(); <-done }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n := len(delivered)
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the alert was not delivered after its deliverer crashed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(delivered) != 1 {
		t.Errorf("delivered %v; want one alert, once", delivered)
	}
}
