package gateway_test

// The hot paths' Redis budget, asserted exactly (issue: "design the hot
// paths for the floor"): a warm GET /v1/lease costs no round trip, an
// Acquire two (its admission one script call), a release two, and exec
// adds two round trips to the provider's own time (three when its rate
// check borrows a batch from Redis). Round trips are counted by a go-redis
// hook on the gateway's client; a pipeline or MULTI/EXEC block is one round trip.
// docs/benchmarks.md quotes these counts beside the benchmark figures.

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/broker"
	"github.com/sandgate/sandgate/internal/fakeprovider"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/telemetry"
	"github.com/sandgate/sandgate/termination"
	"github.com/sandgate/sandgate/token"
)

// rtCounter is a redis.Hook that counts round trips to Redis. A pipeline
// (and a MULTI/EXEC block) is one round trip. The pipeline go-redis sends
// to set up a new connection (HELLO, CLIENT SETINFO) is left out: it is paid
// once per pooled connection, not per request. Pub/sub traffic does not go
// through hooks. With names set it also records each round trip's command
// names (tests); without, it is one atomic add (benchmarks). It is safe for
// concurrent use; names is set before the hook is added.
type rtCounter struct {
	trips atomic.Int64
	names bool

	mu   sync.Mutex
	cmds []string // in order; a pipeline's names are joined by "+"
}

func (c *rtCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *rtCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if setup(cmd.Name()) {
			return next(ctx, cmd) // a new connection's set-up, not the request's
		}
		c.trips.Add(1)
		if c.names {
			c.record(strings.ToLower(cmd.Name()))
		}
		return next(ctx, cmd)
	}
}

// refusalCounts reports whether cmds is a batch of the gateway's refusal
// counter (gateway/refusals.go), which writes in the background what
// earlier requests were refused (the tests' 401 barrier among them).
func refusalCounts(cmds []redis.Cmder) bool {
	for _, cmd := range cmds {
		args := cmd.Args()
		if len(args) < 2 {
			return false
		}
		key, _ := args[1].(string)
		if !strings.Contains(key, ":refusals:") {
			return false
		}
	}
	return true
}

func (c *rtCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || setup(cmds[0].Name()) {
			return next(ctx, cmds) // connection set-up
		}
		if refusalCounts(cmds) {
			return next(ctx, cmds) // the refusal counter's batch, off every request's path
		}
		c.trips.Add(1)
		if c.names {
			names := make([]string, len(cmds))
			for i, cmd := range cmds {
				names[i] = strings.ToLower(cmd.Name())
			}
			c.record(strings.Join(names, "+"))
		}
		return next(ctx, cmds)
	}
}

// setup reports whether a command is go-redis's set-up of a new
// connection (HELLO, AUTH, CLIENT SETINFO), which a busy pool may do in the
// middle of a request; the broker itself sends none of them.
func setup(name string) bool {
	return strings.EqualFold(name, "hello") || strings.EqualFold(name, "auth") || strings.EqualFold(name, "client")
}

func (c *rtCounter) record(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cmds = append(c.cmds, name)
}

// reset zeroes the counter.
func (c *rtCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trips.Store(0)
	c.cmds = nil
}

// snapshot returns the round trips and the commands since the last reset.
func (c *rtCounter) snapshot() (int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.trips.Load()), append([]string(nil), c.cmds...)
}

// rtScripts counts the script calls (EVALSHA or EVAL) among cmds.
func rtScripts(cmds []string) int {
	n := 0
	for _, c := range cmds {
		if c == "evalsha" || c == "eval" {
			n++
		}
	}
	return n
}

// rtEnv is one gateway over a private redis-server, serving TLS, with one
// instance and its token. The gateway's Run is started and its auth cache
// is live (a repeated GET /v1/lease costs no round trip) when rtStart
// returns.
type rtEnv struct {
	db     *store.DB
	bill   *billing.Billing
	rt     *rtCounter
	fake   *fakeprovider.Provider // nil when another provider serves
	srv    *httptest.Server
	client *http.Client
	inst   sandgate.Instance
	tok    sandgate.Secret // the token requests carry
	// warmLeaseRT is the most a warm GET /v1/lease costs: 0, or 1 with
	// rate limits on (once per batch the limiter borrows from Redis).
	warmLeaseRT int
}

// rtOptions configures rtStart. A zero field means the default noted beside it.
type rtOptions struct {
	provider      providers.Provider                 // nil means a fakeprovider
	maxConcurrent int                                // the instance's limit; 0 means the default
	names         bool                               // record command names, not only round trips
	rateLimited   bool                               // the production rate limits on (each request adds its rate check)
	rates         map[admission.Class]admission.Rate // with rateLimited, these instead of the defaults
	egress        termination.EgressMeter            // nil: no workspace moved egress bytes
	// production logs, meters and traces as `sandgate serve` does with no
	// OTLP exporter configured: the JSON access log at info written to a
	// file (stderr's stand-in), the Prometheus-exported metric SDK, and the
	// tracer telemetry.NewTracing builds. Off, the gateway logs to nowhere
	// and records no metric.
	production bool
}

func rtStart(tb testing.TB, o rtOptions) *rtEnv {
	tb.Helper()
	rs := redistest.Start(tb)
	e := &rtEnv{rt: &rtCounter{names: o.names}}
	rates := sgtest.Unlimited
	if o.rateLimited {
		rates, e.warmLeaseRT = nil, 1
	}
	rdb := rs.Client()
	rdb.AddHook(e.rt)
	e.db = store.New(store.Config{}, rdb)
	p := o.provider
	if p == nil {
		e.fake = fakeprovider.New()
		p = e.fake
	}

	ctx := context.Background()
	now := time.Now().UTC()
	acct := sandgate.NewID(sandgate.PrefixAccount)
	if err := e.db.CreateAccount(ctx, sandgate.Account{ID: acct, Name: "bench", CreatedAt: now}); err != nil {
		tb.Fatalf("CreateAccount: %v", err)
	}
	e.inst = sandgate.Instance{ID: sandgate.NewID(sandgate.PrefixInstance), AccountID: acct, Name: "bench", CreatedAt: now,
		Scope: sandgate.Scope{Limits: sandgate.Limits{MaxConcurrentWorkspaces: o.maxConcurrent}}}
	if err := e.db.PutInstance(ctx, e.inst); err != nil {
		tb.Fatalf("PutInstance: %v", err)
	}
	e.tok = e.issue(tb, false)

	if rates == nil {
		rates = o.rates
		if rates == nil {
			rates = map[admission.Class]admission.Rate{} // the production defaults
		}
	}
	bo := broker.Options{Redis: rdb, Providers: providers.Single(providers.LegacyName, p), Clock: sandgate.SystemClock{},
		RateLimits: rates, EgressMeter: o.egress, Gateway: &gateway.Config{}}
	if o.production {
		bo.Log, *bo.Gateway = productionTelemetry(tb)
	}
	wired := sgtest.Broker(tb, sgtest.Config(tb), bo)
	gw := wired.Gateway()
	e.bill = wired.Billing()
	if err := e.bill.SetSettings(ctx, billing.Settings{AccountID: acct, Free: true}); err != nil { // unconfigured accounts cannot acquire
		tb.Fatalf("SetSettings: %v", err)
	}
	e.srv = httptest.NewTLSServer(gw.Handler())
	tb.Cleanup(e.srv.Close)
	e.client = e.srv.Client() // keep-alive; trusts the test certificate
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); gw.Run(runCtx) }()
	tb.Cleanup(func() { cancel(); <-done })

	// The cache is live once a repeated lease read costs no round trip.
	// A bounded poll: the subscription is normally up within milliseconds.
	for i := 0; !e.leaseIsWarm(tb); i++ {
		if i == 500 {
			tb.Fatalf("auth cache never went live: a repeated GET /v1/lease still costs Redis round trips")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return e
}

// productionTelemetry returns the logger and the gateway's meter and
// tracer as `sandgate serve` builds them (internal/broker: NewLogger,
// newMetrics, newObservability) with the default log settings and no
// OTEL_* variable set. The log goes to a file, where serve's goes to stderr.
func productionTelemetry(tb testing.TB) (*slog.Logger, gateway.Config) {
	tb.Helper()
	f, err := os.OpenFile(filepath.Join(tb.TempDir(), "sandgate.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.Close() })
	log, lw, err := telemetry.NewBufferedLogger(f, "info", "json")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = lw.Close() })
	exp, err := otelprom.New(otelprom.WithRegisterer(prometheus.NewRegistry()), otelprom.WithoutScopeInfo())
	if err != nil {
		tb.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	tb.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	tr, err := telemetry.NewTracing(context.Background(), func(string) string { return "" }, "bench", "bench")
	if err != nil {
		tb.Fatal(err)
	}
	return log, gateway.Config{Meter: mp.Meter("github.com/sandgate/sandgate/gateway"), Tracer: tr.Provider}
}

// issue stores a new lease for the instance and returns its token. With
// rotate, the instance's active leases become superseded (an hour's grace).
func (e *rtEnv) issue(tb testing.TB, rotate bool) sandgate.Secret {
	tb.Helper()
	now := time.Now().UTC()
	tok := token.New(token.Prefix)
	l := sandgate.Lease{ID: sandgate.NewID(sandgate.PrefixLease), TokenHash: token.Hash(tok),
		TokenPrefix: token.DisplayPrefix(tok), InstanceID: e.inst.ID, AccountID: e.inst.AccountID, IssuedAt: now}
	if err := e.db.IssueLease(context.Background(), l, rotate, now, time.Hour); err != nil {
		tb.Fatalf("IssueLease: %v", err)
	}
	return tok
}

// leaseIsWarm reads the lease twice and reports whether the second read
// cost no round trip.
func (e *rtEnv) leaseIsWarm(tb testing.TB) bool {
	tb.Helper()
	e.mustDo(tb, http.MethodGet, "/v1/lease", "", nil, http.StatusOK)
	e.rt.reset()
	e.mustDo(tb, http.MethodGet, "/v1/lease", "", nil, http.StatusOK)
	n, _ := e.rt.snapshot()
	return n <= e.warmLeaseRT
}

// do sends one request with e.tok and returns its status and body.
func (e *rtEnv) do(tb testing.TB, method, path, body string, hdr http.Header) (int, []byte) {
	tb.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		tb.Fatalf("NewRequest: %v", err)
	}
	req.Header.Set("Authorization", "Bearer "+e.tok.Reveal())
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := e.client.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp.StatusCode, b
}

// mustDo is do that fails the test unless the status is want.
func (e *rtEnv) mustDo(tb testing.TB, method, path, body string, hdr http.Header, want int) []byte {
	tb.Helper()
	got, b := e.do(tb, method, path, body, hdr)
	if got != want {
		tb.Fatalf("%s %s = %d %s; want %d", method, path, got, bytes.TrimSpace(b), want)
	}
	return b
}

// settled returns once the gateway's handler of the last request has
// returned, exec's end record included, which is sent after the answer:
// it sends the connection's next request (the client reuses its most
// recent idle connection), which the server reads only then, one refused
// before any round trip (no token).
func (e *rtEnv) settled(tb testing.TB) {
	tb.Helper()
	req, err := http.NewRequest(http.MethodGet, e.srv.URL+"/v1/lease", nil)
	if err != nil {
		tb.Fatalf("NewRequest: %v", err)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		tb.Fatalf("GET /v1/lease: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		tb.Fatalf("GET /v1/lease without a token = %d; want 401", resp.StatusCode)
	}
}

// lease reads GET /v1/lease and returns the lease's state.
func (e *rtEnv) lease(tb testing.TB) string {
	tb.Helper()
	var r protocol.LeaseResponse
	if err := json.Unmarshal(e.mustDo(tb, http.MethodGet, "/v1/lease", "", nil, http.StatusOK), &r); err != nil {
		tb.Fatalf("lease: %v", err)
	}
	return r.Lease.State
}

// wantRefused fails the test unless GET /v1/lease answers 401 with code.
func (e *rtEnv) wantRefused(tb testing.TB, label string, code protocol.Code) {
	tb.Helper()
	got, b := e.do(tb, http.MethodGet, "/v1/lease", "", nil)
	var env protocol.Envelope
	_ = json.Unmarshal(b, &env)
	if got != http.StatusUnauthorized || env.Error.Code != code {
		tb.Fatalf("%s: GET /v1/lease = %d %q; want 401 %q", label, got, env.Error.Code, code)
	}
}

const rtAcquireBody = `{"label":"bench","egress":{"allowed_domains":[]}}`

// acquire acquires a running workspace under a fresh Idempotency-Key and
// returns its id.
func (e *rtEnv) acquire(tb testing.TB) string {
	tb.Helper()
	hdr := http.Header{protocol.HeaderIdempotencyKey: {sandgate.NewID("key_")}}
	b := e.mustDo(tb, http.MethodPost, "/v1/workspaces", rtAcquireBody, hdr, http.StatusCreated)
	var w protocol.Workspace
	if err := json.Unmarshal(b, &w); err != nil {
		tb.Fatalf("acquire: decode %s: %v", b, err)
	}
	if w.State != "running" {
		tb.Fatalf("acquire: state = %q; want running", w.State)
	}
	return w.WorkspaceID
}

// exec runs argv in workspace id and returns the decoded response.
func (e *rtEnv) exec(tb testing.TB, id string, argv ...string) protocol.ExecResponse {
	tb.Helper()
	body, _ := json.Marshal(protocol.ExecRequest{Argv: argv})
	b := e.mustDo(tb, http.MethodPost, "/v1/workspaces/"+id+"/exec", string(body), nil, http.StatusOK)
	var r protocol.ExecResponse
	if err := json.Unmarshal(b, &r); err != nil {
		tb.Fatalf("exec: decode %s: %v", b, err)
	}
	return r
}

// rtLeaseCold is the most a lease read may cost with a cold cache: the
// token record, then the instance it names (the instance's key is read
// from the token record, so the two cannot share a pipeline).
const rtLeaseCold = 2

func TestRoundTripsLease(t *testing.T) {
	e := rtStart(t, rtOptions{names: true})

	e.rt.reset()
	e.mustDo(t, http.MethodGet, "/v1/lease", "", nil, http.StatusOK)
	if n, cmds := e.rt.snapshot(); n != 0 {
		t.Errorf("warm GET /v1/lease: %d round trips %v; want 0", n, cmds)
	}

	// Any instance or token change empties every gateway's cache; the
	// next read fills it again. The first read of a new token is cold too.
	cold := map[string]func(){
		"after PutInstance": func() {
			if err := e.db.PutInstance(context.Background(), e.inst); err != nil {
				t.Fatalf("PutInstance: %v", err)
			}
		},
		"new token": func() { e.tok = e.issue(t, false) },
	}
	for name, change := range cold {
		change()
		e.rt.reset()
		e.mustDo(t, http.MethodGet, "/v1/lease", "", nil, http.StatusOK)
		n, cmds := e.rt.snapshot()
		if n == 0 || n > rtLeaseCold {
			t.Errorf("cold GET /v1/lease (%s): %d round trips %v; want 1 to %d", name, n, cmds, rtLeaseCold)
		}
		t.Logf("cold GET /v1/lease (%s): %d round trips %v", name, n, cmds)
		e.rt.reset()
		e.mustDo(t, http.MethodGet, "/v1/lease", "", nil, http.StatusOK)
		if n, cmds := e.rt.snapshot(); n != 0 {
			t.Errorf("GET /v1/lease after refill (%s): %d round trips %v; want 0", name, n, cmds)
		}
	}
}

func TestRoundTripsAcquireAdmission(t *testing.T) {
	e := rtStart(t, rtOptions{names: true})
	var (
		mu     sync.Mutex
		before [][]string // the commands each Acquire sent before the provider's create
	)
	e.fake.CreateHook = func(context.Context, providers.CreateSpec) error {
		_, cmds := e.rt.snapshot()
		mu.Lock()
		defer mu.Unlock()
		before = append(before, cmds)
		return nil
	}
	// The first use of each script loads it (EVALSHA answers NOSCRIPT,
	// then EVAL): once per Redis server, not per request. Warm up first.
	e.acquire(t)

	e.rt.reset()
	e.acquire(t)
	total, cmds := e.rt.snapshot()
	mu.Lock()
	defer mu.Unlock()
	if len(before) != 2 {
		t.Fatalf("provider creates = %d; want 2", len(before))
	}
	// What runs before the provider's create is authentication (cached)
	// and admission, whose script checks the Idempotency-Key first.
	adm := before[1]
	if got := rtScripts(adm); got != 1 {
		t.Errorf("Acquire admission: %d script calls in %v; want exactly 1", got, adm)
	}
	// In all: the admission script (which also answers a replay, records
	// and reserves) and the confirm (which also answers the record).
	// Pricing comes from billing's cache; the budget-alert queue is read
	// only when the script says an alert was queued.
	if total != rtAcquire || len(adm) != 1 {
		t.Errorf("Acquire: %d round trips in all %v, %d before the provider create %v; want exactly %d in all (evalsha admit · evalsha confirm), 1 before the create",
			total, cmds, len(adm), adm, rtAcquire)
	}
	t.Logf("Acquire: %d round trips in all %v; %d before the provider create %v", total, cmds, len(adm), adm)
}

// rtAcquire is what an Acquire costs in Redis round trips end to end.
const rtAcquire = 2

// TestRoundTripsPriceCache: an Acquire prices its workspace from
// billing's in-process cache, and a change of the account's rate card (a
// new version) or settings reaches it before the operator's call returns:
// the very next Acquire is priced at the new version.
func TestRoundTripsPriceCache(t *testing.T) {
	e := rtStart(t, rtOptions{names: true, maxConcurrent: 100})
	ctx := context.Background()
	card := func(unit int64) {
		t.Helper()
		prices := map[string]int64{}
		for _, sz := range sandgate.StandardSizes {
			prices[sz.Name] = unit
		}
		if _, err := e.bill.CreateRateCard(ctx, "rt", "EUR", prices, time.Now().UTC()); err != nil {
			t.Fatalf("CreateRateCard: %v", err)
		}
	}
	price := func(id string) sandgate.Price {
		t.Helper()
		w, err := e.db.Workspace(ctx, e.inst.AccountID, id)
		if err != nil {
			t.Fatalf("Workspace: %v", err)
		}
		return w.Price
	}
	card(5)
	if err := e.bill.SetSettings(ctx, billing.Settings{AccountID: e.inst.AccountID, RateCard: "rt", Currency: "EUR", Postpaid: true}); err != nil {
		t.Fatalf("SetSettings: %v", err)
	}
	if p := price(e.acquire(t)); p.UnitMicros != 5 || p.RateCardVersion != 1 || p.Currency != "EUR" {
		t.Fatalf("price after SetSettings = %+v; want 5 micros/s, version 1, EUR", p)
	}
	e.rt.reset()
	if p := price(e.acquire(t)); p.UnitMicros != 5 {
		t.Fatalf("price = %+v; want 5 micros/s", p)
	}
	if n, cmds := e.rt.snapshot(); n != rtAcquire+1 { // + the price read above
		t.Errorf("warm Acquire on a priced account: %d round trips %v; want %d (pricing from the cache)", n-1, cmds, rtAcquire)
	}
	card(9)
	if p := price(e.acquire(t)); p.UnitMicros != 9 || p.RateCardVersion != 2 {
		t.Errorf("price right after a new rate card version = %+v; want 9 micros/s, version 2", p)
	}
	if err := e.bill.SetSettings(ctx, billing.Settings{AccountID: e.inst.AccountID, Currency: "EUR", Postpaid: true}); err != nil {
		t.Fatalf("SetSettings: %v", err)
	}
	if p := price(e.acquire(t)); p.UnitMicros != 0 || p.RateCard != "" || p.Currency != "EUR" {
		t.Errorf("price right after the rate card was removed = %+v; want none, EUR", p)
	}
}

// TestAcquireFlushesQueuedAlerts: the budget-alert queue is read only when
// the admission script says it queued an alert, and then the alert reaches
// the audit log before the Acquire answers.
func TestAcquireFlushesQueuedAlerts(t *testing.T) {
	e := rtStart(t, rtOptions{names: true, maxConcurrent: 100})
	ctx := context.Background()
	prices := map[string]int64{}
	for _, sz := range sandgate.StandardSizes {
		prices[sz.Name] = 1000
	}
	if _, err := e.bill.CreateRateCard(ctx, "alerts", "USD", prices, time.Now().UTC()); err != nil {
		t.Fatal(err)
	}
	if err := e.bill.SetSettings(ctx, billing.Settings{AccountID: e.inst.AccountID, RateCard: "alerts", Currency: "USD", Postpaid: true}); err != nil {
		t.Fatal(err)
	}
	e.acquire(t) // fills the price cache, loads the scripts
	// A soft budget the next workspace's hold alone goes past: 50, 80 and
	// 100 % are queued by its admission.
	if err := e.bill.SetBudget(ctx, e.inst.AccountID, billing.Budget{InstanceID: e.inst.ID, MonthlyMicros: 1, Soft: true}); err != nil {
		t.Fatal(err)
	}
	e.rt.reset()
	e.acquire(t)
	_, cmds := e.rt.snapshot()
	if !slices.Contains(cmds, "lrange") {
		t.Errorf("Acquire that queued alerts sent %v; want the queue read (lrange)", cmds)
	}
	alerts := 0
	if err := e.db.AuditRange(ctx, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), 100, func(raw []byte) error {
		var ev struct{ Action string }
		if err := json.Unmarshal(raw, &ev); err != nil {
			return err
		}
		if ev.Action == "budget.alert" {
			alerts++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if alerts != 3 {
		t.Errorf("budget.alert entries in the audit log = %d; want 3 (50, 80, 100 %%)", alerts)
	}
	e.rt.reset()
	e.acquire(t) // every threshold of the month already alerted
	if n, cmds := e.rt.snapshot(); n != rtAcquire {
		t.Errorf("Acquire that queued nothing: %d round trips %v; want %d", n, cmds, rtAcquire)
	}
}

// rtRelease is what a release of a running workspace costs: the script
// that starts the termination and answers the record, then (after the
// provider's terminate) the one that records the end, settles and frees
// the hold, answering the final record.
const rtRelease = 2

func TestRoundTripsRelease(t *testing.T) {
	// Every workspace moved bytes through the egress proxy: the end's
	// script records them, no round trip of their own.
	e := rtStart(t, rtOptions{names: true, egress: func(string) termination.EgressCount {
		return termination.EgressCount{Egress: store.Egress{Counter: "p.1", Out: 1500, In: 70000}, NewOut: 1500, NewIn: 70000, Exact: true}
	}})
	// The first release loads its scripts (once per Redis server).
	e.mustDo(t, http.MethodDelete, "/v1/workspaces/"+e.acquire(t), "", nil, http.StatusOK)
	for i := range 3 {
		id := e.acquire(t)
		e.rt.reset()
		b := e.mustDo(t, http.MethodDelete, "/v1/workspaces/"+id, "", nil, http.StatusOK)
		n, cmds := e.rt.snapshot()
		var w protocol.Workspace
		if err := json.Unmarshal(b, &w); err != nil {
			t.Fatalf("release: decode %s: %v", b, err)
		}
		if w.State != "terminated" {
			t.Errorf("release %d: state = %q; want terminated", i, w.State)
		}
		rec, err := e.db.Workspace(context.Background(), e.inst.AccountID, id)
		if err != nil || rec.EgressBytesOut != 1500 || rec.EgressBytesIn != 70000 {
			t.Errorf("release %d: record egress out %d, in %d (%v); want 1500, 70000", i, rec.EgressBytesOut, rec.EgressBytesIn, err)
		}
		if n != rtRelease || rtScripts(cmds) != rtRelease {
			t.Errorf("release %d: %d round trips %v; want exactly %d script calls (begin the termination, then finish and settle)", i, n, cmds, rtRelease)
		}
		t.Logf("release: %d round trips %v", n, cmds)
	}
}

func TestRoundTripsExec(t *testing.T) {
	e := rtStart(t, rtOptions{names: true})
	id := e.acquire(t)
	e.exec(t, id, "true") // loads the exec scripts once per Redis server
	e.settled(t)
	for i := range 3 {
		e.rt.reset()
		if r := e.exec(t, id, "echo", "hi"); r.ExitCode != 0 {
			t.Fatalf("exec exit code = %d; want 0", r.ExitCode)
		}
		e.settled(t)
		if n, cmds := e.rt.snapshot(); n != 2 || rtScripts(cmds) != 2 {
			t.Errorf("exec %d: %d round trips %v; want exactly 2 script calls (load the workspace and mark it busy, record its end)", i, n, cmds)
		}
	}
}

// TestRoundTripsRateLimited: with the production rate limits on, a warm
// lease costs no round trip of its own: once per batch of requests (Batch
// to MaxBatch of the read limit, as fast as they come) the limiter
// borrows the next batch from Redis (admission.Limiter), in the
// background, started by the request that left half a batch; and exec
// stays at two round trips, three for the one exec of a batch that
// borrows: the borrow shares the workspace read's pipeline, and the busy
// mark, which the read makes itself otherwise, waits for the borrow's answer.
func TestRoundTripsRateLimited(t *testing.T) {
	e := rtStart(t, rtOptions{names: true, rateLimited: true})
	read := admission.DefaultRates[admission.ClassRead]
	e.tok = e.issue(t, false)                                        // a new lease: its bucket starts empty
	e.mustDo(t, http.MethodGet, "/v1/lease", "", nil, http.StatusOK) // cold auth, and the first borrow
	e.rt.reset()
	leases := 3 * read.MaxBatch()
	for range leases {
		e.mustDo(t, http.MethodGet, "/v1/lease", "", nil, http.StatusOK)
	}
	// The last borrow ahead lands whenever it does; a bounded poll until
	// the round trips stop growing, normally at once.
	n, cmds := e.rt.snapshot()
	for i := 0; i < 50; i++ {
		time.Sleep(10 * time.Millisecond)
		m, c := e.rt.snapshot()
		if m == n {
			break
		}
		n, cmds = m, c
	}
	least, most := leases/read.MaxBatch()-1, leases/read.Batch()+1
	if rtScripts(cmds) != n || n < least || n > most {
		t.Errorf("%d warm leases: %d round trips %v; want only borrows, %d to %d (batches of %d to %d)", leases, n, cmds, least, most, read.Batch(), read.MaxBatch())
	}
	id := e.acquire(t)
	e.exec(t, id, "true") // borrows the first batch, loading the borrow and busy mark scripts
	e.exec(t, id, "true") // held locally: loads the script that reads and marks at once
	e.settled(t)
	// The batch's other requests are held locally; then one borrows.
	batch := admission.DefaultRates[admission.ClassExec].Batch()
	for i := range batch {
		e.rt.reset()
		if r := e.exec(t, id, "echo", "hi"); r.ExitCode != 0 {
			t.Fatalf("exec exit code = %d; want 0", r.ExitCode)
		}
		e.settled(t)
		n, cmds := e.rt.snapshot()
		if i != batch-2 && (n != 2 || rtScripts(cmds) != 2) {
			t.Errorf("exec %d: %d round trips %v; want exactly 2 script calls (load the workspace and mark it busy, record its end)", i, n, cmds)
		}
		if i == batch-2 && (n != 3 || len(cmds) != 3 || cmds[0] != "eval+hgetall") {
			t.Errorf("exec %d: %d round trips %v; want exactly 3 (the borrow and the workspace read in one pipeline, the busy mark, the end)", i, n, cmds)
		}
	}
}

// TestRoundTripsExecRefused: an exec by a token that Redis refused a
// moment ago, still within that refusal's Retry-After, is answered 429
// before its body is read and with no round trip: a tenant over its exec
// limit sending large bodies costs the broker neither their reading nor
// a script call per request.
func TestRoundTripsExecRefused(t *testing.T) {
	e, id, path := rtExecSpent(t)
	body, _ := json.Marshal(protocol.ExecRequest{Argv: []string{"true"}})
	if got, b := e.do(t, http.MethodPost, path, string(body), nil); got != http.StatusTooManyRequests {
		t.Fatalf("second exec = %d %s; want 429 (Redis's refusal)", got, bytes.TrimSpace(b))
	}
	e.settled(t)

	// In process, so that what the handler read of the body is seen.
	big := &countingReader{r: strings.NewReader(`{"argv":["true"],"stdin_b64":"` + strings.Repeat("A", 4<<20) + `"}`)}
	req := httptest.NewRequest(http.MethodPost, path, big)
	req.TLS = &tls.ConnectionState{}
	req.Header.Set("Authorization", "Bearer "+e.tok.Reveal())
	req.Header.Set("Content-Type", "application/json")
	e.rt.reset()
	rec := httptest.NewRecorder()
	e.srv.Config.Handler.ServeHTTP(rec, req)
	var env protocol.Envelope
	_ = json.Unmarshal(rec.Body.Bytes(), &env)
	if rec.Code != http.StatusTooManyRequests || env.Error.Code != protocol.RateLimited {
		t.Fatalf("exec within the refusal = %d %s; want 429 rate_limited", rec.Code, bytes.TrimSpace(rec.Body.Bytes()))
	}
	if ra, err := strconv.Atoi(rec.Header().Get(protocol.HeaderRetryAfter)); err != nil || ra < 1 || ra > 100 {
		t.Errorf("Retry-After = %q; want 1 to 100 seconds", rec.Header().Get(protocol.HeaderRetryAfter))
	}
	if n := big.n.Load(); n != 0 {
		t.Errorf("the refused exec's body was read: %d bytes; want none", n)
	}
	if n, cmds := e.rt.snapshot(); n != 0 {
		t.Errorf("the refused exec cost %d round trips %v; want none", n, cmds)
	}
	var w protocol.Workspace
	if err := json.Unmarshal(e.mustDo(t, http.MethodGet, "/v1/workspaces/"+id, "", nil, http.StatusOK), &w); err != nil || w.State != "running" {
		t.Errorf("workspace after the refused exec: %+v, %v; want running", w, err)
	}
}

// TestExecRefusedWhileItsBodyIsRead: an exec whose body is still being
// read when Redis refuses another request of its token is refused from
// that refusal once its body is in, without marking the workspace busy or
// touching its activity, and without a round trip.
func TestExecRefusedWhileItsBodyIsRead(t *testing.T) {
	e, id, path := rtExecSpent(t)
	e.settled(t)
	before, err := e.db.Workspace(context.Background(), e.inst.AccountID, id)
	if err != nil {
		t.Fatal(err)
	}

	pr, pw := io.Pipe()
	req := httptest.NewRequest(http.MethodPost, path, pr)
	req.TLS = &tls.ConnectionState{}
	req.Header.Set("Authorization", "Bearer "+e.tok.Reveal())
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.srv.Config.Handler.ServeHTTP(rec, req)
	}()
	// The write returns once the handler reads the body: past its early
	// refusal check.
	if _, err := io.WriteString(pw, `{"argv":`); err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(protocol.ExecRequest{Argv: []string{"true"}})
	if got, b := e.do(t, http.MethodPost, path, string(body), nil); got != http.StatusTooManyRequests {
		t.Fatalf("second exec = %d %s; want 429 (Redis's refusal)", got, bytes.TrimSpace(b))
	}
	e.settled(t)
	e.rt.reset()
	_, _ = io.WriteString(pw, `["true"]}`)
	pw.Close()
	<-done
	var env protocol.Envelope
	_ = json.Unmarshal(rec.Body.Bytes(), &env)
	if rec.Code != http.StatusTooManyRequests || env.Error.Code != protocol.RateLimited {
		t.Fatalf("the exec whose body was being read = %d %s; want 429 rate_limited", rec.Code, bytes.TrimSpace(rec.Body.Bytes()))
	}
	if n, cmds := e.rt.snapshot(); n != 0 {
		t.Errorf("it cost %d round trips %v; want none (no mark, no end)", n, cmds)
	}
	after, err := e.db.Workspace(context.Background(), e.inst.AccountID, id)
	if err != nil || !after.LastActivity.Equal(before.LastActivity) || !after.BusyUntil.Equal(before.BusyUntil) {
		t.Errorf("workspace after it: activity %v, busy %v (%v); want %v, %v as before", after.LastActivity, after.BusyUntil, err, before.LastActivity, before.BusyUntil)
	}
}

// rtExecSpent starts a gateway whose exec limit allows one exec and then
// none for 100 s, and spends that one on a new workspace: its id and its
// exec path.
func rtExecSpent(t *testing.T) (e *rtEnv, id, path string) {
	t.Helper()
	slow := admission.Rate{PerSecond: 0.01, Burst: 1}
	e = rtStart(t, rtOptions{rateLimited: true, rates: map[admission.Class]admission.Rate{admission.ClassExec: slow}})
	id = e.acquire(t)
	e.exec(t, id, "true")
	return e, id, "/v1/workspaces/" + id + "/exec"
}

// countingReader counts the bytes read from r.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestRoundTripsCacheNeverStale is the assertion that the cache never
// trades safety for speed: a token served from a warm cache is refused, or
// reads as superseded, on the very next request once the store's call has
// returned. Repeated, so that a cache cleared only eventually is caught.
func TestRoundTripsCacheNeverStale(t *testing.T) {
	e := rtStart(t, rtOptions{})
	for i := range 20 {
		e.tok = e.issue(t, false)
		if !e.leaseIsWarm(t) {
			t.Fatalf("round %d: the new token is not served from the cache", i)
		}

		old := e.tok
		e.issue(t, true) // rotate
		if got := e.lease(t); got != string(sandgate.LeaseSuperseded) {
			t.Fatalf("round %d: lease state right after rotate = %q; want %q", i, got, sandgate.LeaseSuperseded)
		}
		if !e.leaseIsWarm(t) {
			t.Fatalf("round %d: the superseded token is not served from the cache", i)
		}
		if _, err := e.db.EndGrace(context.Background(), e.inst.AccountID, e.inst.ID, time.Now().UTC()); err != nil {
			t.Fatalf("EndGrace: %v", err)
		}
		e.wantRefused(t, fmt.Sprintf("round %d: right after end-grace", i), protocol.LeaseSuperseded)

		e.tok = e.issue(t, false)
		if !e.leaseIsWarm(t) {
			t.Fatalf("round %d: the new token is not served from the cache", i)
		}
		n, err := e.db.RevokeLeases(context.Background(), e.inst.AccountID, e.inst.ID, time.Now().UTC())
		if err != nil || n < 1 {
			t.Fatalf("RevokeLeases = %d, %v; want at least 1, nil", n, err)
		}
		e.wantRefused(t, fmt.Sprintf("round %d: right after revoke", i), protocol.LeaseRevoked)
		e.tok = old
		e.wantRefused(t, fmt.Sprintf("round %d: the rotated-out token after revoke", i), protocol.LeaseRevoked)
	}
}
