// Package sgtest is the test harness of the gateway: a private Redis, the
// broker of internal/broker over a fake provider, its gateway behind an
// httptest TLS server and its operator API beside it, a settable clock and
// a log capture to grep. It builds the broker with broker.New, as `sandgate
// serve` does, and holds no wiring of its own. It is for tests only; every
// helper takes a testing.TB and fails it fatally.
package sgtest

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/broker"
	"github.com/sandgate/sandgate/internal/fakeprovider"
	"github.com/sandgate/sandgate/internal/logbuf"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/saga"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
	"github.com/sandgate/sandgate/token"
)

// DefaultImage is the broker's default image in the harness, and the
// operator API's default for a new instance's scope.
const DefaultImage = "host"

// Clock is a settable sandgate.Clock. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock stopped at t (in UTC).
func NewClock(t time.Time) *Clock { return &Clock{now: t.UTC()} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t.UTC()
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Logs captures every log line of the harness's components. It is an
// io.Writer safe for concurrent use.
type Logs struct{ logbuf.Buffer }

// Contains reports whether s appears anywhere in the logs.
func (l *Logs) Contains(s string) bool { return strings.Contains(l.String(), s) }

// Provider wraps a fakeprovider.Provider with hooks a test may change at any
// time (the fake's own fields may not be changed while requests run), and
// records every ExecSpec it receives.
type Provider struct {
	*fakeprovider.Provider

	mu          sync.Mutex
	create      func(ctx context.Context, spec providers.CreateSpec) error
	exec        func(spec providers.ExecSpec) (providers.ExecResult, error)
	terminate   func(ctx context.Context, sb providers.Sandbox) error
	writeFile   func(path string) error
	execs       []providers.ExecSpec
	terminates  int
	createSpecs []providers.CreateSpec
}

// SetDiskMiB makes the provider report a disk quota of mib for every size,
// as the local provider reports its tiers' (0: none).
func (p *Provider) SetDiskMiB(mib int) {
	p.Provider.Set(func(f *fakeprovider.Provider) {
		caps := *f.Caps
		caps.Sizes = slices.Clone(caps.Sizes)
		for i := range caps.Sizes {
			caps.Sizes[i].DiskMiB = mib
		}
		f.Caps = &caps
	})
}

// SetEgress makes the provider report egress mode m, as a provider whose
// configuration changed under instances set before.
func (p *Provider) SetEgress(m providers.EgressMode) {
	p.Provider.Set(func(f *fakeprovider.Provider) {
		caps := *f.Caps
		caps.Egress = m
		f.Caps = &caps
	})
}

// ProviderName is the harness provider's name: the legacy name, so that
// records a test writes without a provider resolve to it.
const ProviderName = providers.LegacyName

// newProvider returns the harness's provider; its sandboxes start at
// clock's time, so that a workspace's metered time is clock's alone.
func newProvider(clock sandgate.Clock) *Provider {
	p := &Provider{Provider: fakeprovider.New()}
	p.Provider.Clock = clock
	p.Provider.Caps = &providers.Capabilities{Egress: providers.EgressNative, Snapshots: true, NativeCommands: true,
		Sizes: sandgate.StandardSizes, DefaultImage: DefaultImage}
	p.Provider.CreateHook = func(ctx context.Context, spec providers.CreateSpec) error {
		p.mu.Lock()
		p.createSpecs = append(p.createSpecs, spec)
		f := p.create
		p.mu.Unlock()
		if f != nil {
			return f(ctx, spec)
		}
		return nil
	}
	return p
}

// OnCreate sets a hook that runs inside every Create; an error fails the
// create. nil removes it.
func (p *Provider) OnCreate(f func(ctx context.Context, spec providers.CreateSpec) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.create = f
}

// OnExec sets the answer of every Exec on a sandbox that exists; an error
// fails the exec. nil restores the fake's echo.
func (p *Provider) OnExec(f func(spec providers.ExecSpec) (providers.ExecResult, error)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.exec = f
}

// OnTerminate sets a hook that runs before every Terminate; an error fails
// the terminate. nil removes it.
func (p *Provider) OnTerminate(f func(ctx context.Context, sb providers.Sandbox) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.terminate = f
}

// OnWriteFile sets a hook that runs before every WriteFile; an error fails
// the write. nil removes it.
func (p *Provider) OnWriteFile(f func(path string) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.writeFile = f
}

// Execs returns every ExecSpec the provider received, in order.
func (p *Provider) Execs() []providers.ExecSpec {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]providers.ExecSpec(nil), p.execs...)
}

// CreateSpecs returns every CreateSpec the provider received, in order.
func (p *Provider) CreateSpecs() []providers.CreateSpec {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]providers.CreateSpec(nil), p.createSpecs...)
}

// Terminates returns how many Terminate calls succeeded.
func (p *Provider) Terminates() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.terminates
}

// Exec implements providers.Provider.
func (p *Provider) Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	p.mu.Lock()
	p.execs = append(p.execs, spec)
	f := p.exec
	p.mu.Unlock()
	if f == nil {
		return p.Provider.Exec(ctx, sb, spec)
	}
	// The fake decides whether the sandbox exists; its ExecFunc is never
	// set, so a nil error here means it does.
	if _, err := p.Provider.Exec(ctx, sb, providers.ExecSpec{Argv: []string{"true"}}); err != nil {
		return providers.ExecResult{}, err
	}
	return f(spec)
}

// WriteFile implements providers.Provider.
func (p *Provider) WriteFile(ctx context.Context, sb providers.Sandbox, path string, r io.Reader) error {
	p.mu.Lock()
	f := p.writeFile
	p.mu.Unlock()
	if f != nil {
		if err := f(path); err != nil {
			return err
		}
	}
	return p.Provider.WriteFile(ctx, sb, path, r)
}

// Terminate implements providers.Provider.
func (p *Provider) Terminate(ctx context.Context, sb providers.Sandbox) error {
	p.mu.Lock()
	f := p.terminate
	p.mu.Unlock()
	if f != nil {
		if err := f(ctx, sb); err != nil {
			return err
		}
	}
	if err := p.Provider.Terminate(ctx, sb); err != nil {
		return err
	}
	p.mu.Lock()
	p.terminates++
	p.mu.Unlock()
	return nil
}

// Options configures New. A zero field means the default noted beside it.
type Options struct {
	// Gateway is the gateway's configuration.
	Gateway gateway.Config
	// RateLimits are the per-token rate limits; nil means Unlimited.
	RateLimits map[admission.Class]admission.Rate
	// Risk are the default risk limits; zero means NoRisk.
	Risk admission.RiskDefaults
	// TrustedProxies, when set, replaces Gateway.TrustedProxies.
	TrustedProxies []netip.Prefix
	// Start is the clock's starting time. Zero means the current time,
	// truncated to the second. The fake provider stamps sandboxes' starts
	// with the clock too; see MidHour for a start whose workspaces cross
	// no whole UTC hour (an accrual period's end, see billing).
	Start time.Time
	// Grace is the operator API's default grace period on rotate. 0 means 1 hour.
	Grace time.Duration
}

// MidHour returns the first instant at half past a whole UTC hour that is
// not before now: a harness started there runs its workspaces for up to
// half an hour without crossing a whole hour, where billing cuts usage
// into accrual periods. It lies less than an hour after now, so records
// the store expires at the clock's times still live through the test.
func MidHour(now time.Time) time.Time {
	t := now.UTC().Truncate(time.Hour).Add(30 * time.Minute)
	if t.Before(now) {
		t = t.Add(time.Hour)
	}
	return t
}

// Harness is one broker under test: a private redis-server, the broker's
// gateway over httptest.NewTLSServer and its operator API over a plain
// httptest server, sharing one settable clock and one log capture. The
// broker's reaper and billing loops do not run: a test runs what it needs.
type Harness struct {
	tb         testing.TB
	Redis      *redistest.Server
	DB         *store.DB
	Clock      *Clock
	Provider   *Provider
	Providers  *providers.Set // the one provider, named ProviderName
	Logs       *Logs
	Billing    *billing.Billing
	Terminator *termination.Terminator
	Saga       *saga.Saga
	Gateway    *gateway.Server
	Server     *httptest.Server // the gateway, TLS
	Admin      *httptest.Server // the operator API, plaintext
	AdminToken sandgate.Secret
	admin      *adminapi.Client

	plainOnce sync.Once
	plain     *httptest.Server
}

// Unlimited turns every per-token request-rate limit off.
var Unlimited = map[admission.Class]admission.Rate{admission.ClassRead: {}, admission.ClassAcquire: {}, admission.ClassExec: {}}

// NoRisk are risk defaults no test reaches by accident.
var NoRisk = admission.RiskDefaults{AcquiresPerMinute: 1 << 30, MaxOpenWorkspaces: 1 << 30}

// New starts a broker for one test and stops it when the test ends. It
// returns once the gateway's auth cache is subscribed to invalidations, so
// that tests exercise the cache.
func New(tb testing.TB, opts Options) *Harness {
	tb.Helper()
	start := opts.Start
	if start.IsZero() {
		start = time.Now().UTC().Truncate(time.Second)
	}
	clock := NewClock(start)
	h := &Harness{
		tb:         tb,
		Redis:      redistest.Start(tb),
		Clock:      clock,
		Provider:   newProvider(clock),
		Logs:       &Logs{},
		AdminToken: sandgate.Secret("sgadm_test-operator-token"),
	}
	log := slog.New(slog.NewJSONHandler(h.Logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	gcfg := opts.Gateway
	if opts.TrustedProxies != nil {
		gcfg.TrustedProxies = opts.TrustedProxies
	}
	h.Providers = providers.Single(ProviderName, h.Provider)
	cfg := Config(tb)
	cfg.Defaults.DefaultImage = DefaultImage
	if opts.Grace != 0 {
		cfg.Lease.GracePeriod = opts.Grace
	}
	cfg.Operators = []broker.OperatorConfig{{Name: "test", Role: "admin", TokenSHA256: token.Hash(h.AdminToken)}}
	b := Broker(tb, cfg, broker.Options{Redis: h.Redis.Client(), Providers: h.Providers, Clock: h.Clock, Log: log, Gateway: &gcfg,
		RateLimits: opts.RateLimits, Risk: opts.Risk})
	h.DB, h.Billing, h.Terminator, h.Saga, h.Gateway = b.DB(), b.Billing(), b.Terminator(), b.Saga(), b.Gateway()
	h.Server = httptest.NewTLSServer(h.Gateway.Handler())
	tb.Cleanup(h.Server.Close)
	h.Admin = httptest.NewServer(b.Admin().Handler())
	tb.Cleanup(h.Admin.Close)
	ac, err := adminapi.NewClient(h.Admin.URL, h.AdminToken, h.Admin.Client())
	if err != nil {
		tb.Fatalf("adminapi.NewClient: %v", err)
	}
	h.admin = ac

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.Gateway.Run(ctx)
	}()
	// Registered last, so it runs first: Run exits before Redis is killed.
	tb.Cleanup(func() {
		cancel()
		exited := func() bool {
			select {
			case <-done:
				return true
			default:
				return false
			}
		}
		for i := 0; i < 2000 && !exited(); i++ {
			time.Sleep(5 * time.Millisecond)
		}
		if !exited() {
			tb.Errorf("gateway.Run did not return after its context ended")
		}
	})
	rdb := h.DB.Redis()
	WaitFor(tb, "the gateway to subscribe to invalidations", func() bool {
		n, err := rdb.PubSubNumSub(context.Background(), store.InvalidateChannel).Result()
		return err == nil && n[store.InvalidateChannel] > 0
	})
	return h
}

// WaitFor polls cond every 5ms, at most 12000 times (a minute at least),
// and fails the test if it never holds. It measures no wall-clock time
// itself. The bound is generous: what it waits for (a reconnect after an
// outage, a background pass) can take seconds on a loaded machine, and
// a cond that never holds costs only the wait.
func WaitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	for range 12000 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	tb.Fatalf("timed out waiting for %s", what)
}

// URL returns the gateway's base URL (https).
func (h *Harness) URL() string { return h.Server.URL }

// PlainServer returns a plaintext httptest server over the same gateway
// handler, started on first use, as a TLS-terminating proxy would reach it.
func (h *Harness) PlainServer() *httptest.Server {
	h.plainOnce.Do(func() {
		h.plain = httptest.NewServer(h.Gateway.Handler())
		h.tb.Cleanup(h.plain.Close)
	})
	return h.plain
}

// CertPool trusts the gateway's test certificate.
func (h *Harness) CertPool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(h.Server.Certificate())
	return pool
}

// HTTPClient returns a client of the gateway that trusts its certificate
// and never follows redirects, for raw requests.
func (h *Harness) HTTPClient() *http.Client {
	hc := h.Server.Client()
	out := *hc
	out.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &out
}

// Client returns a protocol v1 client of the gateway for tok, with tiny
// backoffs so that retries cost no time.
func (h *Harness) Client(tok sandgate.Secret) *client.Client {
	h.tb.Helper()
	c, err := client.New(client.Config{
		Endpoint:    h.URL(),
		Token:       tok,
		RootCAs:     h.CertPool(),
		BaseBackoff: time.Millisecond,
	})
	if err != nil {
		h.tb.Fatalf("client.New: %v", err)
	}
	return c
}

// AdminDo calls the operator API and fails the test on any error.
func (h *Harness) AdminDo(method, path string, in, out any) {
	h.tb.Helper()
	if err := h.admin.Do(context.Background(), method, path, in, out); err != nil {
		h.tb.Fatalf("operator API %s %s: %v", method, path, err)
	}
}

// Instance is an account's instance created through the operator API,
// with the token issued for it.
type Instance struct {
	AccountID string
	ID        string
	LeaseID   string
	Token     sandgate.Secret
}

// NewAccount creates an account through the operator API, under a name
// of its own (names are unique per broker), marks it free (an account
// whose billing was never configured cannot acquire; a test that prices
// its workspaces sets billing again) and returns its id.
func (h *Harness) NewAccount() string {
	h.tb.Helper()
	var a adminapi.Account
	h.AdminDo(http.MethodPost, "/accounts", adminapi.CreateAccountRequest{Name: "test account " + sandgate.NewID("")}, &a)
	h.AdminDo(http.MethodPut, "/accounts/"+a.ID+"/billing", adminapi.BillingSettings{Free: true}, nil)
	return a.ID
}

// NewInstance creates a fresh account and an instance of it with scope,
// and issues a token that never expires.
func (h *Harness) NewInstance(scope adminapi.Scope) Instance {
	h.tb.Helper()
	return h.NewInstanceIn(h.NewAccount(), scope)
}

// NewInstanceIn creates an instance of an existing account with scope, and
// issues a token that never expires.
func (h *Harness) NewInstanceIn(accountID string, scope adminapi.Scope) Instance {
	h.tb.Helper()
	var in adminapi.Instance
	h.AdminDo(http.MethodPost, "/instances", adminapi.CreateInstanceRequest{AccountID: accountID, Name: "test", Scope: scope}, &in)
	tok := h.IssueToken(in.ID, adminapi.IssueTokenRequest{})
	return Instance{AccountID: accountID, ID: in.ID, LeaseID: tok.LeaseID, Token: sandgate.Secret(tok.Token)}
}

// IssueToken issues another token for an instance without superseding
// the others.
func (h *Harness) IssueToken(instanceID string, req adminapi.IssueTokenRequest) adminapi.IssuedToken {
	h.tb.Helper()
	return h.issue("/instances/"+instanceID+"/tokens", req)
}

// RotateToken issues a token for an instance that supersedes every active one.
func (h *Harness) RotateToken(instanceID string, req adminapi.IssueTokenRequest) adminapi.IssuedToken {
	h.tb.Helper()
	return h.issue("/instances/"+instanceID+"/tokens/rotate", req)
}

func (h *Harness) issue(path string, req adminapi.IssueTokenRequest) adminapi.IssuedToken {
	h.tb.Helper()
	var out adminapi.IssuedToken
	h.AdminDo(http.MethodPost, path, req, &out)
	return out
}

// EndGrace ends the grace period of an instance's superseded tokens and
// returns how many it ended.
func (h *Harness) EndGrace(instanceID string) int {
	h.tb.Helper()
	return h.count("/instances/" + instanceID + "/tokens/end-grace")
}

// RevokeTokens revokes every token of an instance and returns how many it revoked.
func (h *Harness) RevokeTokens(instanceID string) int {
	h.tb.Helper()
	return h.count("/instances/" + instanceID + "/tokens/revoke")
}

// count posts to path and returns the count it answers.
func (h *Harness) count(path string) int {
	h.tb.Helper()
	var out adminapi.Count
	h.AdminDo(http.MethodPost, path, nil, &out)
	return out.Count
}

// RevokeLease revokes the one token of a lease and returns how many it
// revoked (0 when it already was).
func (h *Harness) RevokeLease(leaseID string) int {
	h.tb.Helper()
	var out adminapi.RevokeResult
	h.AdminDo(http.MethodPost, "/leases/"+leaseID+"/revoke", nil, &out)
	return out.Count
}

// LiveCount returns how many concurrency slots an instance holds now.
func (h *Harness) LiveCount(in Instance) int64 {
	h.tb.Helper()
	n, err := h.DB.LiveCount(context.Background(), in.AccountID, in.ID, h.Clock.Now())
	if err != nil {
		h.tb.Fatalf("LiveCount: %v", err)
	}
	return n
}

// String names the harness in test output.
func (h *Harness) String() string { return fmt.Sprintf("sgtest harness at %s", h.URL()) }

// Config returns the config of a broker under test: the defaults, with
// its data directory under tb's.
func Config(tb testing.TB) broker.Config {
	tb.Helper()
	cfg, err := broker.LoadConfig("", func(string) string { return "" })
	if err != nil {
		tb.Fatalf("broker.LoadConfig: %v", err)
	}
	cfg.DataDir = tb.TempDir()
	return *cfg
}

// Broker builds the broker of cfg (see Config) over opts.Redis, which
// is required, and closes it when the test ends. Rate and risk limits are
// off unless set: tests fire bursts on purpose, and the rate and risk
// tests set their own. opts.Log nil discards. It does not Run the broker:
// a test serves the handlers it needs, and runs the gateway's caches
// (Gateway().Run) where it needs them.
func Broker(tb testing.TB, cfg broker.Config, opts broker.Options) *broker.Broker {
	tb.Helper()
	if opts.RateLimits == nil {
		opts.RateLimits = Unlimited
	}
	if opts.Risk == (admission.RiskDefaults{}) {
		opts.Risk = NoRisk
	}
	if opts.Getenv == nil {
		opts.Getenv = func(string) string { return "" }
	}
	b, err := broker.New(context.Background(), cfg, opts)
	if err != nil {
		tb.Fatalf("broker.New: %v", err)
	}
	tb.Cleanup(func() { _ = b.Close() })
	return b
}
