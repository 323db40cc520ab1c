package stripesync_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/stripesync"
)

// testKey is a planted secret: it must never appear in a log or an error.
const testKey = "sk_test_51PlantedSecretKeyForStripeSyncTests0123456789"

var t0 = time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)

type env struct {
	rdb    *redis.Client
	ledger *billing.Ledger
	p      *proxy
	clk    *clock
	sl     *sleeper
	logs   *bytes.Buffer
	logMu  *sync.Mutex
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func setup(t *testing.T) *env {
	t.Helper()
	rdb := redistest.Start(t).Client()
	reader := sdkmetric.NewManualReader()
	return &env{mp: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), rdb: rdb, ledger: billing.NewLedger(rdb), p: startProxy(t), clk: &clock{now: t0.Add(6 * time.Hour)},
		sl: &sleeper{}, logs: &bytes.Buffer{}, logMu: &sync.Mutex{}, reader: reader}
}

// syncer is one gateway's Syncer; cfg's zero fields get the test's defaults.
func (e *env) syncer(t *testing.T, cfg stripesync.Config, owner string) *stripesync.Syncer {
	t.Helper()
	cfg.BaseURL = e.p.URL
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 10 * time.Second
	}
	s, err := stripesync.New(cfg, stripesync.Deps{
		Redis: e.rdb,
		Getenv: func(k string) string {
			if k == stripesync.DefaultSecretKeyEnv {
				return testKey
			}
			return ""
		},
		Logger: slog.New(slog.NewJSONHandler(&lockedWriter{mu: e.logMu, w: e.logs}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Meter:  e.mp.Meter("test"),
		Clock:  e.clk,
		Sleep:  e.sl.Sleep,
		Owner:  owner,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func (e *env) add(t *testing.T, es ...billing.UsageEntry) {
	t.Helper()
	for _, u := range es {
		if _, err := e.ledger.Append(context.Background(), u); err != nil {
			t.Fatalf("Append(%s): %v", u.ID, err)
		}
	}
}

// hours are a workspace's interim entries for n whole hours from h.
func hours(acct, ws string, h time.Time, n int) []billing.UsageEntry {
	var out []billing.UsageEntry
	for i := range n {
		s := h.Add(time.Duration(i) * time.Hour)
		out = append(out, billing.UsageEntry{ID: billing.PeriodID(ws, s), Kind: billing.KindUsage, AccountID: acct, WorkspaceID: ws,
			Currency: "USD", UnitPriceMicros: 100, Seconds: 3600, AmountMicros: 360000, StartedAt: s, EndedAt: s.Add(time.Hour), TerminatedAt: s})
	}
	return out
}

func setAccount(t *testing.T, s *stripesync.Syncer, acct string, unit stripesync.Unit) {
	t.Helper()
	err := s.SetAccount(context.Background(), acct, stripesync.Account{Customer: "cus_" + acct, EventName: "sandgate_seconds", Unit: unit, Since: t0.Add(-time.Hour)})
	if err != nil {
		t.Fatalf("SetAccount: %v", err)
	}
}

// drain runs rounds until the account has nothing left or a round fails.
func drain(ctx context.Context, t *testing.T, s *stripesync.Syncer, acct string) error {
	t.Helper()
	for range 1000 {
		r, err := s.SyncOnce(ctx, acct)
		if err != nil || !r.More {
			return err
		}
	}
	t.Fatal("drain: no end after 1000 rounds")
	return nil
}

func identifiers(rs []request) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Form.Get("identifier"))
	}
	return out
}

// TestSendValidates sends every kind of ledger entry in both units and
// checks each request against stripe-mock (which answers 400 to a request
// its OpenAPI specification refuses) and against the entry it came from.
func TestSendValidates(t *testing.T) {
	const acct = "acct_v"
	final := billing.UsageEntry{ID: billing.FinalID("ws_a"), Kind: billing.KindUsage, Final: true, AccountID: acct, WorkspaceID: "ws_a",
		Currency: "USD", UnitPriceMicros: 100, Seconds: 1200, AmountMicros: 120000,
		StartedAt: t0.Add(time.Hour), EndedAt: t0.Add(80 * time.Minute), TerminatedAt: t0.Add(80 * time.Minute)}
	never := billing.UsageEntry{ID: billing.FinalID("ws_b"), Kind: billing.KindUsage, Final: true, AccountID: acct, WorkspaceID: "ws_b",
		Currency: "USD", TerminatedAt: t0.Add(90 * time.Minute)}
	refund := billing.UsageEntry{ID: "adj:aaaa", Kind: billing.KindAdjustment, Final: true, AccountID: acct, WorkspaceID: "ws_a",
		Currency: "USD", AmountMicros: -5000, StartedAt: t0, TerminatedAt: t0.Add(2 * time.Hour), Corrects: final.ID}
	debit := billing.UsageEntry{ID: "adj:bbbb", Kind: billing.KindAdjustment, Final: true, AccountID: acct, WorkspaceID: "ws_a",
		Currency: "USD", AmountMicros: 7000, StartedAt: t0, TerminatedAt: t0.Add(150 * time.Minute), Corrects: final.ID}
	old := hours(acct, "ws_old", t0.Add(-3*time.Hour), 1)[0] // before Since
	interim := hours(acct, "ws_a", t0, 1)[0]

	tests := []struct {
		unit      stripesync.Unit
		wantValue map[string]int64 // entry id → value sent
		wantDead  []string
	}{
		{stripesync.UnitSeconds, map[string]int64{interim.ID: 3600, final.ID: 1200}, nil},
		{stripesync.UnitMicros, map[string]int64{interim.ID: 360000, final.ID: 120000, debit.ID: 7000}, []string{refund.ID}},
	}
	for _, tt := range tests {
		t.Run(string(tt.unit), func(t *testing.T) {
			e := setup(t)
			ctx := context.Background()
			s := e.syncer(t, stripesync.Config{}, "gw1")
			setAccount(t, s, acct, tt.unit)
			e.add(t, old, interim, final, never, refund, debit)
			if err := drain(ctx, t, s, acct); err != nil {
				t.Fatalf("SyncOnce: %v", err)
			}
			byIdent := map[string]billing.UsageEntry{}
			for _, u := range []billing.UsageEntry{old, interim, final, never, refund, debit} {
				byIdent[stripesync.Identifier(acct, u.ID)] = u
			}
			for _, r := range e.p.requests() {
				if r.Status != http.StatusOK || r.Injected {
					t.Errorf("request %v: stripe-mock answered %d; want 200 (the request must validate)", r.Form, r.Status)
				}
			}
			got := map[string]int64{}
			for _, r := range e.p.delivered() {
				u, ok := byIdent[r.Form.Get("identifier")]
				if !ok {
					t.Fatalf("identifier %q matches no entry", r.Form.Get("identifier"))
				}
				v, _ := strconv.ParseInt(r.Form.Get("payload[value]"), 10, 64)
				got[u.ID] = v
				if r.Path != "/v1/billing/meter_events" || r.Form.Get("event_name") != "sandgate_seconds" ||
					r.Form.Get("payload[stripe_customer_id]") != "cus_"+acct {
					t.Errorf("request for %s: path %s, form %v", u.ID, r.Path, r.Form)
				}
				if r.IdempotencyKey != r.Form.Get("identifier") {
					t.Errorf("request for %s: Idempotency-Key %q; want the identifier %q", u.ID, r.IdempotencyKey, r.Form.Get("identifier"))
				}
				if n := len(r.Form.Get("identifier")); n > 100 {
					t.Errorf("identifier of %s is %d characters; Stripe allows 100", u.ID, n)
				}
				ts, _ := strconv.ParseInt(r.Form.Get("timestamp"), 10, 64)
				hour := u.StartedAt.Truncate(time.Hour)
				if u.Kind == billing.KindAdjustment {
					hour = u.TerminatedAt.Truncate(time.Hour)
				}
				if at := time.Unix(ts, 0); at.Before(hour) || !at.Before(hour.Add(time.Hour)) {
					t.Errorf("timestamp of %s = %s; want inside the hour %s", u.ID, at.UTC(), hour)
				}
				if strings.Contains(r.Auth, testKey) == false {
					t.Errorf("request for %s was not authenticated with the key", u.ID)
				}
			}
			if !mapsEqual(got, tt.wantValue) {
				t.Errorf("sent %v; want %v", got, tt.wantValue)
			}
			st, err := s.Status(ctx, acct)
			if err != nil {
				t.Fatal(err)
			}
			var dead []string
			for _, d := range st.DeadLetters {
				dead = append(dead, d.EntryID)
			}
			if !slices.Equal(dead, tt.wantDead) || st.Pending != 0 || st.Sent != int64(len(tt.wantValue)) {
				t.Errorf("Status = dead %v, pending %d, sent %d; want dead %v, pending 0, sent %d", dead, st.Pending, st.Sent, tt.wantDead, len(tt.wantValue))
			}
			if n := counter(t, e.reader, "sent"); n != int64(len(tt.wantValue)) {
				t.Errorf("events{outcome=sent} = %d; want %d", n, len(tt.wantValue))
			}
			// A second round finds nothing new and sends nothing.
			before := len(e.p.requests())
			if err := drain(ctx, t, s, acct); err != nil {
				t.Fatal(err)
			}
			if n := len(e.p.requests()); n != before {
				t.Errorf("a second round sent %d requests; want 0", n-before)
			}
		})
	}
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// counter reads sandgate.stripesync.events{outcome}.
func counter(t *testing.T, r *sdkmetric.ManualReader, outcome string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "sandgate.stripesync.events" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if len(dp.Attributes.ToSlice()) != 1 {
					t.Errorf("events has attributes %v; want outcome only", dp.Attributes.ToSlice())
				}
				if v, _ := dp.Attributes.Value("outcome"); v.AsString() == outcome {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// TestKillResume stops a gateway mid-batch and resumes on another: no
// entry is sent twice when the stop falls between sends, and when it falls
// between Stripe's answer and the cursor's move (a crash), the one entry
// is resent as an identical request (identifier and Idempotency-Key), which
// Stripe counts once.
func TestKillResume(t *testing.T) {
	const acct = "acct_k"
	errCrash := errors.New("crash")
	tests := []struct {
		name    string
		crash   bool
		wantDup int // identifiers seen twice
	}{
		{"cancel between sends", false, 0},
		{"crash before the cursor moves", true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := setup(t)
			a := e.syncer(t, stripesync.Config{BatchSize: 5}, "gw1")
			setAccount(t, a, acct, "")
			e.add(t, hours(acct, "ws_k", t0, 12)...)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			n := 0
			stripesync.SetAfterSend(a, func(string) error {
				n++
				if n == 7 { // mid second batch
					if tt.crash {
						return errCrash
					}
					cancel()
				}
				return nil
			})
			err := drain(ctx, t, a, acct)
			if want := map[bool]error{false: context.Canceled, true: errCrash}[tt.crash]; !errors.Is(err, want) {
				t.Fatalf("first gateway: %v; want %v", err, want)
			}
			if got := len(e.p.delivered()); got != 7 {
				t.Fatalf("first gateway sent %d; want 7", got)
			}
			b := e.syncer(t, stripesync.Config{BatchSize: 5}, "gw2")
			if err := drain(context.Background(), t, b, acct); err != nil {
				t.Fatalf("second gateway: %v", err)
			}
			seen := map[string][]request{}
			for _, r := range e.p.delivered() {
				id := r.Form.Get("identifier")
				seen[id] = append(seen[id], r)
			}
			if len(seen) != 12 {
				t.Errorf("%d distinct identifiers sent; want 12", len(seen))
			}
			dups := 0
			for id, rs := range seen {
				if len(rs) == 1 {
					continue
				}
				dups++
				if len(rs) > 2 || rs[0].Form.Encode() != rs[1].Form.Encode() || rs[0].IdempotencyKey != rs[1].IdempotencyKey || rs[0].IdempotencyKey != id {
					t.Errorf("identifier %s resent as a different request: %v", id, rs)
				}
			}
			if dups != tt.wantDup {
				t.Errorf("%d identifiers sent twice; want %d", dups, tt.wantDup)
			}
			st, err := b.Status(context.Background(), acct)
			if err != nil {
				t.Fatal(err)
			}
			if st.Pending != 0 || st.Lag != 0 {
				t.Errorf("Status after resume: pending %d, lag %s; want 0, 0", st.Pending, st.Lag)
			}
		})
	}
}

// TestTwoGateways runs two gateways' rounds at once over one account:
// the lease lets one send at a time, and no identifier is sent twice.
func TestTwoGateways(t *testing.T) {
	const acct = "acct_two"
	e := setup(t)
	gws := []*stripesync.Syncer{e.syncer(t, stripesync.Config{BatchSize: 3}, "gw1"), e.syncer(t, stripesync.Config{BatchSize: 3}, "gw2")}
	setAccount(t, gws[0], acct, "")
	e.add(t, hours(acct, "ws_t", t0, 30)...)
	var wg sync.WaitGroup
	for _, s := range gws {
		wg.Go(func() {
			for range 500 {
				if _, err := s.SyncOnce(context.Background(), acct); err != nil && !errors.Is(err, stripesync.ErrLeased) {
					t.Errorf("SyncOnce: %v", err)
					return
				}
				st, err := s.Status(context.Background(), acct)
				if err != nil || st.Pending == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	ids := identifiers(e.p.delivered())
	slices.Sort(ids)
	if len(ids) != 30 || len(slices.Compact(ids)) != 30 {
		t.Errorf("sent %d events, %d distinct; want 30, 30", len(identifiers(e.p.delivered())), len(slices.Compact(ids)))
	}
}

// TestRetryAfter injects 429 and 503 answers in front of stripe-mock: the
// send is retried after Retry-After (or the doubled backoff when longer),
// and counted once.
func TestRetryAfter(t *testing.T) {
	tests := []struct {
		name      string
		status    int
		header    string // Retry-After; "" none
		failures  int
		wantWaits []time.Duration
		wantErr   bool // the round gives up (the next one sends)
	}{
		{"429 Retry-After longer than backoff", 429, "7", 2, []time.Duration{7 * time.Second, 7 * time.Second}, false},
		{"429 Retry-After shorter than backoff", 429, "1", 3, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}, false},
		{"503 without Retry-After", 503, "", 2, []time.Duration{time.Second, 2 * time.Second}, false},
		{"429 Retry-After past MaxRetryAfter", 429, "600", 1, nil, true},
		{"500 past MaxAttempts", 500, "", 10, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const acct = "acct_r"
			e := setup(t)
			s := e.syncer(t, stripesync.Config{}, "gw1")
			setAccount(t, s, acct, "")
			e.add(t, hours(acct, "ws_r", t0, 1)...)
			e.p.setFault(func(r request, n int) (int, http.Header, string) {
				if n >= tt.failures {
					return 0, nil, ""
				}
				h := http.Header{}
				if tt.header != "" {
					h.Set("Retry-After", tt.header)
				}
				return tt.status, h, stripeError("api_error", "try later")
			})
			_, err := s.SyncOnce(context.Background(), acct)
			if got := e.sl.got(); !slices.Equal(got, tt.wantWaits) {
				t.Errorf("waits = %v; want %v", got, tt.wantWaits)
			}
			var se *stripesync.SendError
			if tt.wantErr != (err != nil) || err != nil && (!errors.As(err, &se) || se.Status != tt.status) {
				t.Fatalf("SyncOnce: %v; want a %d SendError: %v", err, tt.status, tt.wantErr)
			}
			if tt.wantErr {
				st, _ := s.Status(context.Background(), acct)
				if st.Pending != 1 || !strings.Contains(st.LastError, strconv.Itoa(tt.status)) || st.Failures == 0 {
					t.Errorf("Status = pending %d, last error %q, failures %d; want 1, a %d, > 0", st.Pending, st.LastError, st.Failures, tt.status)
				}
				e.p.setFault(nil)
				if _, err := s.SyncOnce(context.Background(), acct); err != nil {
					t.Fatalf("next round: %v", err)
				}
			}
			if n := len(e.p.delivered()); n != 1 {
				t.Errorf("stripe-mock counted %d events; want 1", n)
			}
		})
	}
}

// TestDeadLetter: an entry Stripe refuses with a 400 holds the cursor for
// DeadAfter rounds, then goes on the dead-letter list and the rest flows;
// Retry sends it again.
func TestDeadLetter(t *testing.T) {
	const acct = "acct_d"
	e := setup(t)
	s := e.syncer(t, stripesync.Config{DeadAfter: 2}, "gw1")
	setAccount(t, s, acct, "")
	es := hours(acct, "ws_d", t0, 3)
	e.add(t, es...)
	bad := stripesync.Identifier(acct, es[1].ID)
	e.p.setFault(func(r request, n int) (int, http.Header, string) {
		if r.Form.Get("identifier") == bad {
			return 400, nil, stripeError("invalid_request_error", "no such customer")
		}
		return 0, nil, ""
	})
	ctx := context.Background()
	for round := 1; round <= 2; round++ {
		_, err := s.SyncOnce(ctx, acct)
		var se *stripesync.SendError
		if !errors.As(err, &se) || se.Status != 400 || se.Retryable() {
			t.Fatalf("round %d: %v; want a 400 SendError", round, err)
		}
	}
	if len(e.sl.got()) != 0 {
		t.Errorf("a 400 was waited on: %v", e.sl.got())
	}
	st, err := s.Status(ctx, acct)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.DeadLetters) != 1 || st.DeadLetters[0].EntryID != es[1].ID || st.DeadLetters[0].Attempts != 2 || st.DeadLetters[0].Status != 400 || st.Pending != 1 {
		t.Fatalf("Status = dead %+v, pending %d; want %s after 2 rounds, pending 1", st.DeadLetters, st.Pending, es[1].ID)
	}
	if _, err := s.SyncOnce(ctx, acct); err != nil {
		t.Fatalf("round 3: %v", err)
	}
	if n := len(e.p.delivered()); n != 2 {
		t.Errorf("sent %d; want 2 (the entries around the dead one)", n)
	}
	// Still refused: Retry puts it back on the list with one more attempt.
	if n, err := s.Retry(ctx, acct, es[1].ID, "no-such-entry"); n != 1 || err != nil {
		t.Fatalf("Retry = %d, %v; want 1, nil", n, err)
	}
	if st, _ := s.Status(ctx, acct); len(st.Requeued) != 1 || len(st.DeadLetters) != 0 {
		t.Errorf("after Retry: requeued %d, dead %d; want 1, 0", len(st.Requeued), len(st.DeadLetters))
	}
	if _, err := s.SyncOnce(ctx, acct); err != nil {
		t.Fatalf("round 4: %v", err)
	}
	if st, _ := s.Status(ctx, acct); len(st.DeadLetters) != 1 || st.DeadLetters[0].Attempts != 3 {
		t.Errorf("after a refused retry: dead %+v; want it back with 3 attempts", st.DeadLetters)
	}
	e.p.setFault(nil)
	if n, err := s.Retry(ctx, acct); n != 1 || err != nil {
		t.Fatalf("Retry(all) = %d, %v; want 1, nil", n, err)
	}
	if r, err := s.SyncOnce(ctx, acct); err != nil || r.Sent != 1 {
		t.Fatalf("round 5 = %+v, %v; want 1 sent", r, err)
	}
	st, _ = s.Status(ctx, acct)
	if len(st.DeadLetters) != 0 || len(st.Requeued) != 0 || st.Sent != 3 || st.DeadLettered != 1 {
		t.Errorf("Status = dead %d, requeued %d, sent %d, dead-lettered %d; want 0, 0, 3, 1", len(st.DeadLetters), len(st.Requeued), st.Sent, st.DeadLettered)
	}
	if ids := identifiers(e.p.delivered()); len(ids) != 3 || !slices.Contains(ids, bad) {
		t.Errorf("delivered %v; want the 3 entries once each", ids)
	}
}

// TestKeyNeverShown plants the key where Stripe would echo it back (an
// error message quoting the Authorization header) and runs Run: the key
// is in no log line, no error, no status and no dead letter.
func TestKeyNeverShown(t *testing.T) {
	tests := []struct {
		name   string
		status int
	}{{"401 account-wide", 401}, {"400 dead-lettered", 400}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const acct = "acct_s"
			e := setup(t)
			s := e.syncer(t, stripesync.Config{DeadAfter: 1}, "gw1")
			setAccount(t, s, acct, "")
			e.add(t, hours(acct, "ws_s", t0, 2)...)
			e.p.setFault(func(r request, n int) (int, http.Header, string) {
				return tt.status, nil, stripeError("invalid_request_error", "Invalid API Key provided: "+strings.TrimPrefix(r.Auth, "Bearer "))
			})
			var texts []string
			_, err := s.SyncOnce(context.Background(), acct)
			if err == nil {
				t.Fatal("SyncOnce: nil; want the refusal")
			}
			texts = append(texts, err.Error())
			ctx, cancel := context.WithCancel(context.Background())
			run := e.syncer(t, stripesync.Config{DeadAfter: 1}, "gw2")
			e.sl.mu.Lock()
			e.sl.block = true
			e.sl.mu.Unlock()
			done := make(chan error)
			go func() { done <- run.Run(ctx) }()
			waitFor(t, func() bool { return strings.Contains(e.logString(), "stripe sync failed") })
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
			st, err := s.Status(context.Background(), acct)
			if err != nil {
				t.Fatal(err)
			}
			texts = append(texts, st.LastError, e.logString())
			for _, d := range st.DeadLetters {
				texts = append(texts, d.Error)
			}
			if st.LastError == "" {
				t.Error("Status.LastError is empty; want the refusal")
			}
			for _, s := range texts {
				if strings.Contains(s, testKey) || strings.Contains(s, testKey[8:]) || strings.Contains(s, "sk_test_") {
					t.Errorf("the key appears in %q", s)
				}
			}
		})
	}
	t.Run("missing key", func(t *testing.T) {
		_, err := stripesync.New(stripesync.Config{}, stripesync.Deps{Redis: redis.NewClient(&redis.Options{}), Getenv: func(string) string { return "" }})
		if err == nil || !strings.Contains(err.Error(), stripesync.DefaultSecretKeyEnv) {
			t.Errorf("New without a key: %v; want an error naming %s", err, stripesync.DefaultSecretKeyEnv)
		}
	})
}

// logString is what the loggers wrote so far.
func (e *env) logString() string {
	e.logMu.Lock()
	defer e.logMu.Unlock()
	return e.logs.String()
}

// waitFor polls cond for up to 30 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for range 3000 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("condition not met after 30 s")
}

func TestValidate(t *testing.T) {
	tests := []struct {
		a    stripesync.Account
		fail bool
	}{
		{stripesync.Account{Customer: "cus_123", EventName: "ev"}, false},
		{stripesync.Account{Customer: "cus_123", EventName: "ev", Unit: stripesync.UnitMicros}, false},
		{stripesync.Account{Customer: "cust_123", EventName: "ev"}, true},
		{stripesync.Account{Customer: "cus_1 2", EventName: "ev"}, true},
		{stripesync.Account{Customer: "cus_123"}, true},
		{stripesync.Account{Customer: "cus_123", EventName: strings.Repeat("e", 101)}, true},
		{stripesync.Account{Customer: "cus_123", EventName: "ev", Unit: "cents"}, true},
	}
	for _, tt := range tests {
		if err := tt.a.Validate(); (err != nil) != tt.fail {
			t.Errorf("Validate(%+v) = %v; want failure %v", tt.a, err, tt.fail)
		}
	}
	a, b := stripesync.Identifier("acct_a", "ws_1:final"), stripesync.Identifier("acct_b", "ws_1:final")
	if a == b || a != stripesync.Identifier("acct_a", "ws_1:final") || len(a) > 100 {
		t.Errorf("Identifier: %q, %q; want deterministic, per account, at most 100 characters", a, b)
	}
}

// TestSettings: SetAccount, Account and ClearAccount round-trip, and a
// zero Since means "from now on" and is kept by later changes.
func TestSettings(t *testing.T) {
	e := setup(t)
	s := e.syncer(t, stripesync.Config{}, "gw1")
	ctx := context.Background()
	if _, err := s.Account(ctx, "acct_x"); !errors.Is(err, stripesync.ErrNotConfigured) {
		t.Fatalf("Account of a new account: %v; want ErrNotConfigured", err)
	}
	if err := s.SetAccount(ctx, "acct_x", stripesync.Account{Customer: "cus_1", EventName: "ev"}); err != nil {
		t.Fatal(err)
	}
	e.clk.mu.Lock()
	e.clk.now = e.clk.now.Add(time.Hour)
	e.clk.mu.Unlock()
	if err := s.SetAccount(ctx, "acct_x", stripesync.Account{Customer: "cus_2", EventName: "ev2", Unit: stripesync.UnitMicros}); err != nil {
		t.Fatal(err)
	}
	a, err := s.Account(ctx, "acct_x")
	want := stripesync.Account{Customer: "cus_2", EventName: "ev2", Unit: stripesync.UnitMicros, Since: t0.Add(6 * time.Hour), UpdatedAt: t0.Add(7 * time.Hour)}
	if err != nil || a != want {
		t.Errorf("Account = %+v, %v; want %+v", a, err, want)
	}
	if ids, err := s.Accounts(ctx); err != nil || !slices.Equal(ids, []string{"acct_x"}) {
		t.Errorf("Accounts = %v, %v; want [acct_x]", ids, err)
	}
	if err := s.ClearAccount(ctx, "acct_x"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SyncOnce(ctx, "acct_x"); !errors.Is(err, stripesync.ErrNotConfigured) {
		t.Errorf("SyncOnce after ClearAccount: %v; want ErrNotConfigured", err)
	}
	if ids, err := s.Accounts(ctx); err != nil || len(ids) != 0 {
		t.Errorf("Accounts after ClearAccount = %v, %v; want none", ids, err)
	}
}

// TestUndecodableEntry: a ledger entry that does not decode is
// dead-lettered at once instead of holding the account's cursor.
func TestUndecodableEntry(t *testing.T) {
	const acct = "acct_u"
	e := setup(t)
	s := e.syncer(t, stripesync.Config{}, "gw1")
	setAccount(t, s, acct, "")
	ctx := context.Background()
	es := hours(acct, "ws_u", t0, 2)
	e.add(t, es[0])
	sid, err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: "sg:{" + acct + "}:usage", Values: []string{"e", "{not json"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	e.add(t, es[1])
	if r, err := s.SyncOnce(ctx, acct); err != nil || r.Sent != 2 || r.DeadLettered != 1 {
		t.Fatalf("SyncOnce = %+v, %v; want 2 sent, 1 dead-lettered", r, err)
	}
	st, err := s.Status(ctx, acct)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.DeadLetters) != 1 || st.DeadLetters[0].EntryID != "stream:"+sid || st.Pending != 0 {
		t.Errorf("Status = dead %+v, pending %d; want stream:%s, 0", st.DeadLetters, st.Pending, sid)
	}
	if _, err := s.Retry(ctx, acct); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SyncOnce(ctx, acct); err != nil {
		t.Fatalf("SyncOnce after Retry: %v", err)
	}
	if st, _ := s.Status(ctx, acct); len(st.DeadLetters) != 1 || st.DeadLetters[0].Attempts != 1 {
		t.Errorf("after Retry: dead %+v; want it back, attempts 1", st.DeadLetters)
	}
}

// TestRunManyGateways runs Run on two gateways over three accounts: every
// entry is sent once, and the metrics carry no account label.
func TestRunManyGateways(t *testing.T) {
	e := setup(t)
	e.sl.block = true
	gws := []*stripesync.Syncer{e.syncer(t, stripesync.Config{BatchSize: 10}, "gw1"), e.syncer(t, stripesync.Config{BatchSize: 10}, "gw2")}
	for _, acct := range []string{"acct_r1", "acct_r2", "acct_r3"} {
		setAccount(t, gws[0], acct, "")
		e.add(t, hours(acct, "ws_"+acct, t0, 25)...)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, s := range gws {
		wg.Go(func() {
			if err := s.Run(ctx); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	// One pass each may leave an account to the other gateway's lease:
	// wait for both passes, then run rounds until all is sent.
	waitFor(t, func() bool { return len(e.sl.got()) == 2 })
	for _, acct := range []string{"acct_r1", "acct_r2", "acct_r3"} {
		if err := drain(ctx, t, gws[0], acct); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	wg.Wait()
	ids := identifiers(e.p.delivered())
	slices.Sort(ids)
	if len(ids) != 75 || len(slices.Compact(ids)) != 75 {
		t.Errorf("sent %d events; want 75, each once", len(ids))
	}
	if n := counter(t, e.reader, "sent"); n != 75 {
		t.Errorf("events{outcome=sent} = %d; want 75", n)
	}
	var rm metricdata.ResourceMetrics
	if err := e.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "sandgate.stripesync.lag" {
				found = true
				for _, dp := range m.Data.(metricdata.Gauge[float64]).DataPoints {
					if dp.Attributes.Len() != 0 {
						t.Errorf("lag has attributes %v; want none", dp.Attributes.ToSlice())
					}
				}
			}
		}
	}
	if !found {
		t.Error("no sandgate.stripesync.lag recorded")
	}
}
