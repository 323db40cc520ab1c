// Package broker is the assembled broker, and the one place that wires
// it: New builds the store, billing, admission, termination, the
// providers and telemetry once from the config and hands them to the
// gateway, the operator API and the reaper; Run serves; Close releases.
// `sandgate serve`, `sandgate dev` and the tests build it the same way.
package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admin"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/images"
	"github.com/sandgate/sandgate/internal/running"
	"github.com/sandgate/sandgate/internal/tick"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/reaper"
	"github.com/sandgate/sandgate/saga"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/stripesync"
	"github.com/sandgate/sandgate/telemetry"
	"github.com/sandgate/sandgate/termination"
)

// Options are what the process hands the broker besides its config: its
// connections, and what tests and sandgate dev put in place of the
// config's. A zero field means the default beside it.
type Options struct {
	// Redis is the broker's store; required. The caller closes it.
	Redis redis.UniversalClient
	// Log is the broker's logger; nil discards.
	Log *slog.Logger
	// Clock is the broker's clock; nil means sandgate.SystemClock.
	Clock sandgate.Clock
	// Getenv reads the vendors' and the operators' environment variables
	// and OTEL_*; nil means os.Getenv.
	Getenv func(string) string
	// Version is the build's version, on traces.
	Version string
	// Kinds are the provider kinds the broker can open; nil means the
	// ones this binary ships (kinds).
	Kinds providers.Registry
	// Providers, when set, are the broker's providers in place of the
	// config's, which are not opened; the caller closes them.
	Providers *providers.Set

	// Public and Admin are the listeners Run serves: the protocol and
	// the operator API. The broker owns them from New on. Nil ones are
	// allowed only to a broker whose Run is never called (tests).
	Public, Admin net.Listener
	// TLS is the public listener's TLS; nil serves plaintext, allowed
	// only behind tls.trusted_proxies.
	TLS *tls.Config
	// Certs, when set, is the certificate TLS serves, which Reload reads
	// again from its files.
	Certs *CertFiles

	// Gateway, when set, is the gateway's config in place of the one the
	// config gives.
	Gateway *gateway.Config
	// RateLimits, when set, are the per-token rate limits in place of
	// admission.rate_limits.
	RateLimits map[admission.Class]admission.Rate
	// Risk, when not zero, are the default risk limits in place of
	// admission.risk.
	Risk admission.RiskDefaults
	// AfterCreate, when set, runs between each provider create and its
	// confirm (saga.Config.AfterCreate).
	AfterCreate func(workspaceID string)
	// EgressMeter, when set, is what every end records as the
	// workspace's egress in place of the egress proxy's count.
	EgressMeter termination.EgressMeter
}

// Broker is one gateway process: the public listener, the operator
// listener, the reaper and billing's loops, and what they share. New
// builds it, Run serves, Close releases what New took.
type Broker struct {
	cfg    *Config
	log    *slog.Logger
	rdb    redis.UniversalClient
	clock  sandgate.Clock
	tls    *tls.Config
	certs  *CertFiles          // nil: the certificate is not reloaded
	getenv func(string) string // Options.Getenv, read again by Reload
	public net.Listener
	admin  net.Listener
	vendor net.Listener // egress.vendor_listen; nil when none

	obs      *observability
	proxy    *egress.Proxy
	rawProvs *providers.Set // as opened, for health and the data directory claim
	ownProvs bool           // rawProvs were opened by New
	provs    *providers.Set // rawProvs with telemetry
	images   *images.Store  // the local provider's OCI images; nil with Options.Providers or Kinds

	db        *store.DB
	bill      *billing.Billing
	poolMeter *billing.PoolMeter // this process's warm pools' time (pool.go)
	term      *termination.Terminator
	saga      *saga.Saga
	gw        *gateway.Server
	adm       *admin.Server
	reaper    *reaper.Reaper
	stripe    *stripesync.Syncer // nil: no Stripe sync (billing.stripe)
	health    *health
	reloads   reloads
	pub, ops  *http.Server
	// calls counts the requests both servers are serving: the providers
	// close only after the last has returned (Run).
	calls     running.Group
	claimLate bool // the data directory claim waits for Redis (Run)

	closeOnce sync.Once
}

// readHeaderTimeout bounds a request's headers on both listeners.
const readHeaderTimeout = 10 * time.Second

// New builds the broker of cfg: it opens the providers and builds the
// store, billing, admission, termination, the saga, the gateway, the
// operator API and the reaper once, sharing them. Nothing is served until
// Run. On error, what New opened is closed again.
func New(ctx context.Context, cfg Config, opts Options) (_ *Broker, err error) {
	b := &Broker{cfg: &cfg, log: opts.Log, rdb: opts.Redis, clock: opts.Clock, tls: opts.TLS, certs: opts.Certs, public: opts.Public, admin: opts.Admin}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	if b.clock == nil {
		b.clock = sandgate.SystemClock{}
	}
	defer func() {
		if err != nil {
			_ = b.Close()
		}
	}()
	proxies, err := b.cfg.trustedProxies()
	if err != nil {
		return nil, err
	}
	if b.public != nil && b.tls == nil && len(proxies) == 0 {
		return nil, errors.New("sandgate refuses plaintext: set tls.cert_file and tls.key_file, or tls.trusted_proxies for a TLS-terminating proxy")
	}
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	b.getenv = getenv
	operators, err := b.cfg.OperatorTokens(getenv)
	if err != nil {
		return nil, err
	}
	if b.obs, err = newObservability(ctx, b.cfg, b.rdb, getenv, opts.Version, b.log); err != nil {
		return nil, err
	}
	tp, meter := b.obs.tracing.Provider, b.obs.meter
	// One egress proxy per broker process: the local provider serves each
	// workspace's listener with it (docs/egress.md).
	ecfg, err := b.cfg.egressConfig(meter)
	if err != nil {
		return nil, err
	}
	if b.cfg.Egress.VendorListen != "" {
		// Vendor guests' credentials are derived from the workspace id
		// under the store's key, so any gateway of the store, this one
		// after a restart too, serves a live workspace (docs/egress.md).
		if ecfg.CredentialKey, ecfg.Lookup, err = vendorCredentials(ctx, store.New(store.Config{}, b.rdb)); err != nil {
			return nil, err
		}
	}
	if b.proxy, err = egress.New(ecfg, egress.Deps{Log: b.log.With("component", "egress")}); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	// Vendor guests reach the same proxy over the network, each request
	// naming its workspace by credential (docs/egress.md).
	var vendor *providers.VendorEgress
	if b.vendor, vendor, err = b.cfg.vendorEgress(b.tls, b.proxy); err != nil {
		return nil, err
	}
	b.rawProvs = opts.Providers
	if b.rawProvs == nil {
		reg := opts.Kinds
		if reg == nil {
			if b.images, err = openImages(b.cfg, b.log.With("component", "images")); err != nil {
				return nil, err
			}
			reg = kinds(b.proxy, localImages{b.images})
		}
		penv := providers.Env{Logger: b.log.With("component", "provider"), Clock: b.clock, BrokerID: b.cfg.BrokerID, DataDir: b.cfg.DataDir,
			Getenv: getenv, Transport: b.obs.transport, TracerProvider: tp, VendorEgress: vendor, GuestBinary: b.cfg.guestBinary()}
		if b.rawProvs, err = reg.Open(ctx, b.cfg.providers, b.cfg.DefaultProvider, penv); err != nil {
			return nil, err
		}
		b.ownProvs = true
	}
	// Every provider call is a span and a latency point (telemetry.Providers).
	if b.provs, err = telemetry.Providers(b.rawProvs, tp, meter); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	// Warm pools' sizes and cost (telemetry.Pools), read from the
	// providers as opened.
	if err := telemetry.Pools(b.rawProvs, meter); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}

	// The one wiring place: everything below is built once and shared.
	// Every script that admits work or moves money waits for the
	// replicas' acknowledgement (redis.wait, docs/scaling.md).
	durable := store.Durable(b.rdb, b.cfg.Redis.Wait.Replicas, b.cfg.Redis.Wait.Timeout)
	db := store.New(store.Config{PendingTimeout: b.cfg.Admission.PendingTimeout}, durable)
	b.db = db
	// A data directory another one holds stops the broker at once; a store
	// that cannot be asked yet (serve starts with Redis down) is asked again
	// in the background by Run, and a refusal then stops it as well.
	if err := claimDataDirs(ctx, db, b.rawProvs, b.clock.Now()); errors.Is(err, errDataDirTaken) {
		return nil, err
	} else if err != nil {
		b.log.Warn("local data directory not yet recorded in Redis; retrying", slog.Any(sandgate.KeyError, err))
		b.claimLate = true
	}
	b.bill = billing.New(billing.Config{Provider: providers.LegacyName, Meter: meter, PoolRateCard: b.cfg.Billing.PoolRateCard,
		Webhook: billing.WebhookConfig{URL: b.cfg.Billing.Webhook.URL, Secret: b.cfg.webhookSecret, Timeout: b.cfg.Billing.Webhook.Timeout}},
		billing.Deps{DB: db, Log: b.log.With("component", "billing"), Clock: b.clock})
	b.poolMeter = b.bill.PoolMeter()
	rates := opts.RateLimits
	if rates == nil {
		rates = map[admission.Class]admission.Rate{}
		for class, r := range b.cfg.Admission.RateLimits {
			rates[admission.Class(class)] = admission.Rate{PerSecond: r.PerSecond, Burst: r.Burst}
		}
	}
	risk := opts.Risk
	if risk == (admission.RiskDefaults{}) {
		risk = admission.RiskDefaults{
			AcquiresPerMinute: b.cfg.Admission.Risk.AcquiresPerMinute,
			MaxOpenWorkspaces: b.cfg.Admission.Risk.MaxOpenWorkspaces,
			MaxSize:           b.cfg.Admission.Risk.MaxSize,
		}
	}
	gcfg := gateway.Config{TrustedProxies: proxies, Meter: b.obs.mp.Meter("github.com/sandgate/sandgate/gateway"), Tracer: tp,
		// Counted per gateway process (README, admission.inflight).
		MaxInflightPerWorkspace:  b.cfg.Admission.Inflight.PerWorkspace,
		MaxInflightPerInstance:   b.cfg.Admission.Inflight.PerInstance,
		InflightBytes:            b.cfg.Admission.Inflight.MaxBytes,
		InflightBytesPerInstance: b.cfg.Admission.Inflight.PerInstanceBytes,
		InflightBytesPerAccount:  b.cfg.Admission.Inflight.PerAccountBytes,
		BodyReadTimeout:          b.cfg.Admission.Inflight.BodyTimeout}
	if opts.Gateway != nil {
		gcfg = *opts.Gateway
	}
	controls := admission.NewControlCache(db, b.clock)
	dc := db.Config()
	admit := admission.New(durable, admission.Standard(controls, admission.StandardConfig{
		IdempotencyTTL: dc.IdempotencyTTL, PendingTimeout: dc.PendingTimeout, Billing: b.bill.Checks(), Risk: risk,
	})...)
	// A workspace's egress bytes go to its record every
	// egressKeepInterval while it runs (keepEgress), and what is left at
	// its end with its usage.
	egressMeter := opts.EgressMeter
	if egressMeter == nil {
		egressMeter = func(id string) termination.EgressCount {
			c := b.proxy.Forget(id)
			n := c.Unkept()
			return termination.EgressCount{Egress: store.Egress{Counter: c.Counter, Out: c.Total.BytesOut, In: c.Total.BytesIn},
				NewOut: n.BytesOut, NewIn: n.BytesIn, Exact: c.Exact}
		}
	}
	b.term = termination.New(termination.Config{Timeout: gcfg.TerminateTimeout}, termination.Deps{DB: db, Providers: b.provs, Clock: b.clock,
		Log: b.log.With("component", "termination"), Settler: telemetry.Settlement(b.bill, tp), EgressMeter: egressMeter})
	tadmit, err := telemetry.Admission(admit, tp, meter)
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if err := telemetry.LiveWorkspaces(meter, b.provs.Names(), b.cfg.Admission.Timeout, func(ctx context.Context) ([]sandgate.Workspace, error) {
		return db.LiveWorkspaces(ctx, "", "", b.clock.Now())
	}); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	afterCreate := opts.AfterCreate
	if afterCreate == nil {
		afterCreate = pauseAfterCreate(b.cfg.testPauseAfterCreate)
	}
	// The saga and the gateway spend one limiter's buckets.
	limiter := admission.NewLimiter(rates, b.rdb)
	b.saga, err = saga.New(saga.Config{
		// A create must end well within the pending deadline, past which
		// the reaper ends the workspace under it.
		CreateTimeout: b.cfg.Admission.PendingTimeout * 3 / 4,
		AfterCreate:   afterCreate,
	}, saga.Deps{DB: db, Providers: b.provs, Admission: tadmit, Holds: b.bill, Terminator: b.term, Limiter: limiter, Clock: b.clock, Log: b.log.With("component", "saga")})
	if err != nil {
		return nil, err
	}
	b.gw, err = gateway.New(gcfg, gateway.Deps{DB: db, Saga: b.saga, Limiter: limiter,
		Controls: controls, Clock: b.clock, Log: b.log.With("component", "gateway"), Caches: []gateway.Cache{b.bill.Prices()}})
	if err != nil {
		return nil, err
	}
	defaults := sandgate.Scope{
		Sizes: b.cfg.Defaults.Sizes, DefaultSize: b.cfg.Defaults.DefaultSize,
		Images: b.cfg.Defaults.Images, DefaultImage: b.cfg.Defaults.DefaultImage,
		Limits: b.cfg.Defaults.Limits.limits(),
	}
	// Every gateway process runs the reaper; one at a time leads (a Redis
	// lease), and its passes are idempotent all the same.
	b.reaper = reaper.New(reaper.Config{Owner: b.cfg.BrokerID + "/" + sandgate.NewID("reaper_"),
		BrokerID: b.cfg.BrokerID, ReconcileInterval: b.cfg.Reaper.ReconcileInterval,
		Meter: b.obs.mp.Meter("github.com/sandgate/sandgate/reaper"), Tracer: tp},
		reaper.Deps{DB: db, Providers: b.provs, Terminator: b.term, Clock: b.clock, Log: b.log.With("component", "reaper")})
	adeps := admin.Deps{DB: db, Clock: b.clock, Log: b.log.With("component", "admin"), Providers: b.provs, Terminator: b.term, Billing: b.bill,
		Meter: b.obs.mp.Meter("github.com/sandgate/sandgate/admin"), Saga: b.saga}
	if b.stripe, err = newStripe(b.cfg.Billing.Stripe, b.rdb, getenv, meter, b.clock, b.log); err != nil {
		return nil, err
	}
	if b.stripe != nil {
		adeps.Stripe = b.stripe
	}
	if b.images != nil {
		adeps.Images = adminImages{b.images}
	}
	b.adm, err = admin.New(admin.Config{Tokens: operators, Grace: b.cfg.Lease.GracePeriod, Defaults: defaults}, adeps)
	if err != nil {
		return nil, err
	}

	// Both servers see the connections of listen.go, so that every answer,
	// even those net/http gives by itself, is the envelope.
	b.health = newHealth(b.rdb, b.rawProvs)
	if err := b.health.observe(b.obs.mp.Meter("github.com/sandgate/sandgate/internal/broker")); err != nil {
		return nil, err
	}
	if b.reloads, err = newReloads(b.obs.mp.Meter("github.com/sandgate/sandgate/internal/broker")); err != nil {
		return nil, err
	}
	b.pub = &http.Server{Handler: b.calls.Handler(withConnInfo(withHealth(b.gw.Handler(), b.health))), ReadHeaderTimeout: readHeaderTimeout, ConnContext: connContext,
		ErrorLog: slog.NewLogLogger(b.log.Handler(), slog.LevelWarn)}
	b.ops = &http.Server{Handler: withMetrics(b.adm.Handler(), b.obs.metrics, b.health), ReadHeaderTimeout: readHeaderTimeout,
		ErrorLog: slog.NewLogLogger(b.log.Handler(), slog.LevelWarn)}
	b.ops.Handler = b.calls.Handler(withConsole(b.ops.Handler, b.adm.Handler(), b.clock, b.log.With("component", "console")))
	return b, nil
}

// DB returns the broker's store.
func (b *Broker) DB() *store.DB { return b.db }

// Providers returns the broker's providers, with telemetry.
func (b *Broker) Providers() *providers.Set { return b.provs }

// Billing returns the broker's billing.
func (b *Broker) Billing() *billing.Billing { return b.bill }

// Terminator returns the broker's terminator.
func (b *Broker) Terminator() *termination.Terminator { return b.term }

// Saga returns the broker's saga.
func (b *Broker) Saga() *saga.Saga { return b.saga }

// Gateway returns the protocol's server. Run runs it; a test that serves
// its Handler without Run runs it itself.
func (b *Broker) Gateway() *gateway.Server { return b.gw }

// Admin returns the operator API's server.
func (b *Broker) Admin() *admin.Server { return b.adm }

// keepEgress adds the egress proxy's counts to the workspaces' records.
func (b *Broker) keepEgress(ctx context.Context) {
	if err := b.proxy.Record(ctx, egressKeeper(b.db)); err != nil {
		b.log.Warn("egress bytes not recorded; kept for the next try", slog.Any(sandgate.KeyError, err))
	}
}

// Run serves the listeners until ctx ends, then shuts down gracefully.
// It also runs the gateway's caches, the health checks, the reaper and
// billing's loops. Call it once.
func (b *Broker) Run(ctx context.Context) error {
	if b.public == nil || b.admin == nil {
		return errors.New("broker: Run needs both listeners")
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { b.gw.Run(runCtx) })
	wg.Go(func() { b.health.run(runCtx) })
	rpCtx, rpCancel := context.WithCancel(runCtx)
	defer rpCancel()
	rpDone := make(chan struct{})
	wg.Go(func() { defer close(rpDone); b.reaper.Run(rpCtx) })
	wg.Go(func() { b.bill.Run(runCtx, b.cfg.Billing.RepairInterval) })
	wg.Go(func() {
		b.bill.WatchDrift(runCtx, b.cfg.Billing.ReconcileInterval, func() bool { return b.reaper.Fence() != 0 })
	})
	wg.Go(func() { b.bill.RunWebhooks(runCtx) })
	if b.images != nil {
		wg.Go(func() { refreshImages(runCtx, b.images, b.cfg.Images.RefreshInterval, b.log) })
	}
	if b.stripe != nil {
		// Every gateway runs it; a lease per account keeps one sender.
		wg.Go(func() { _ = b.stripe.Run(runCtx) })
	}
	wg.Go(func() { b.recordPools(runCtx) })
	wg.Go(func() {
		tick.Every(runCtx, egressKeepInterval, func() bool {
			kctx, kcancel := context.WithTimeout(runCtx, egressKeepTimeout)
			defer kcancel()
			b.keepEgress(kctx)
			return true
		})
	})
	errc := make(chan error, 4)
	if b.claimLate {
		wg.Go(func() {
			for {
				select {
				case <-runCtx.Done():
					return
				case <-time.After(time.Second):
				}
				err := claimDataDirs(runCtx, b.db, b.rawProvs, b.clock.Now())
				if err == nil {
					b.log.Info("local data directory recorded in Redis")
					return
				}
				if errors.Is(err, errDataDirTaken) {
					errc <- err
					return
				}
			}
		})
	}
	wg.Go(func() {
		var ln net.Listener = plainListener{b.public}
		if b.tls != nil {
			ln = newTLSListener(b.public, b.tls, readHeaderTimeout)
		}
		if err := b.pub.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("public listener: %w", err)
		}
	})
	if b.vendor != nil {
		wg.Go(func() {
			if err := b.proxy.ServeShared(runCtx, tls.NewListener(b.vendor, b.tls)); err != nil {
				errc <- fmt.Errorf("egress vendor listener: %w", err)
			}
		})
	}
	wg.Go(func() {
		if err := b.ops.Serve(plainListener{b.admin}); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("operator listener: %w", err)
		}
	})
	attrs := []any{slog.String("listen", b.public.Addr().String()), slog.String("admin_listen", b.admin.Addr().String()), slog.String("broker_id", b.cfg.BrokerID)}
	if b.vendor != nil {
		attrs = append(attrs, slog.String("egress_vendor_listen", b.vendor.Addr().String()))
	}
	b.log.Info("sandgate listening", attrs...)
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	// Graceful shutdown: refuse new requests (503 unavailable, Retry-After)
	// so clients go to another gateway, hand the reaper's leadership over
	// at once, let requests in flight finish within the bound, then stop.
	// Nothing is lost: every state change is in Redis, and what an
	// interrupted request left (a create past its pending deadline, a
	// termination not confirmed) is the next leader's to settle.
	b.log.Info("sandgate shutting down", slog.Duration("shutdown_timeout", b.cfg.ShutdownTimeout), slog.Duration("drain_delay", b.cfg.DrainDelay))
	// Not ready first, while still serving, so a load balancer moves
	// traffic away before anything is refused.
	b.health.drain()
	time.Sleep(b.cfg.DrainDelay)
	b.gw.Drain()
	rpCancel()
	<-rpDone
	sctx, scancel := context.WithTimeout(context.Background(), b.cfg.ShutdownTimeout)
	defer scancel()
	if err := b.pub.Shutdown(sctx); err != nil {
		b.log.Warn("requests still in flight at the shutdown bound were cut", slog.Any(sandgate.KeyError, err))
	}
	_ = b.ops.Shutdown(sctx)
	// Past the bound, closing the connections left ends their requests'
	// contexts. Close closes the providers, so Run returns only once every
	// call into them has: the requests just cut, and what requests left
	// to run in the background (an expired workspace's end); a call that
	// does not heed its context gets cutWait more.
	_ = b.pub.Close()
	_ = b.ops.Close()
	cancel()
	wg.Wait()
	wctx, wcancel := context.WithTimeout(context.Background(), cutWait)
	defer wcancel()
	if n := b.calls.Wait(wctx) + b.saga.Wait(wctx); n > 0 {
		b.log.Warn("calls still running at the shutdown bound are left to the providers' close", slog.Int("calls", n))
	}
	return runErr
}

// cutWait bounds how long Run waits, once it has cut the requests left at
// shutdown_timeout, for them to return.
const cutWait = 5 * time.Second

// Close releases what New took: the listeners, the providers New opened
// (then the egress proxy's last counts go to the workspaces' records),
// and the telemetry exporters, flushed. It does not close Options.Redis.
func (b *Broker) Close() error {
	b.closeOnce.Do(func() {
		for _, ln := range []net.Listener{b.public, b.admin, b.vendor} {
			if ln != nil {
				_ = ln.Close()
			}
		}
		if b.ownProvs {
			if err := b.rawProvs.Close(); err != nil {
				b.log.Warn("providers not closed cleanly", slog.Any(sandgate.KeyError, err))
			}
		}
		if b.db != nil {
			kctx, kcancel := context.WithTimeout(context.Background(), egressKeepTimeout)
			b.keepEgress(kctx)
			kcancel()
		}
		if b.poolMeter != nil {
			// The providers closed their pools: what they dropped is in.
			pctx, pcancel := context.WithTimeout(context.Background(), egressKeepTimeout)
			if err := b.RecordPool(pctx); err != nil {
				b.log.Warn("warm pools' last time not recorded", slog.Any(sandgate.KeyError, err))
			}
			pcancel()
		}
		if b.obs != nil {
			b.obs.shutdown()
		}
	})
	return nil
}

// claimDataDir makes sure that every broker process on this store serves
// local workspaces from one data directory: the first records its id, and
// one with another refuses to start, saying why. A local workspace lives
// only in the directory that created it: a process with another would
// answer 410 workspace_gone for it, and reap it. The claim is never lifted
// by the broker; an operator who retires a data directory for good deletes
// it (providers/local/README.md).
// errDataDirTaken is claimDataDir's refusal: another data directory serves
// this Redis's local workspaces.
var errDataDirTaken = errors.New("the data directory is another one than this Redis serves")

// claimDataDirs claims the data directory of every local provider of ps
// (claimDataDir).
func claimDataDirs(ctx context.Context, db *store.DB, ps *providers.Set, now time.Time) error {
	for _, e := range ps.All() {
		if lp, ok := e.Provider.(*local.Provider); ok {
			if err := claimDataDir(ctx, db, e.Name, lp, now); err != nil {
				return err
			}
		}
	}
	return nil
}

func claimDataDir(ctx context.Context, db *store.DB, name string, prov *local.Provider, now time.Time) error {
	host, _ := os.Hostname()
	ours := store.DataDir{ID: prov.DataDirID(), Host: host, Path: prov.DataDir(), ClaimedAt: now.UTC().Truncate(time.Second)}
	got, err := db.ClaimDataDir(ctx, name, ours)
	if err != nil {
		return fmt.Errorf("provider %s: cannot record its data directory in Redis: %w", name, err)
	}
	if got.ID == ours.ID {
		return nil
	}
	live := "an unknown number of"
	if ws, err := db.LiveWorkspaces(ctx, "", "", now); err == nil {
		live = fmt.Sprint(len(ws))
	}
	return fmt.Errorf("provider %s: %w: refusing to start: this Redis already serves its local workspaces from the data directory %s "+
		"on host %q (id %s, since %s; %s workspaces live now), and this process's data directory %s (id %s) is another one. "+
		"A local workspace lives only in the data directory that created it, so this process would answer 410 workspace_gone "+
		"for those of the other and its reaper would end them. Run every `sandgate serve` on this Redis with that data directory "+
		"(on that host), or use another Redis; if that data directory is retired for good and no workspace of it is live, "+
		"delete the Redis key %s and start again",
		name, errDataDirTaken, got.Path, got.Host, got.ID, got.ClaimedAt.Format(time.RFC3339), live, ours.Path, ours.ID, store.DataDirKey(name))
}

// IsLoopback reports whether addr (host:port) binds only loopback.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// ServerTLS is the public listener's TLS config with cert.
func ServerTLS(cert tls.Certificate) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
}

// pauseAfterCreate returns the gateway's test-only AfterCreate hook for
// SANDGATE_TEST_PAUSE_AFTER_CREATE (see Config.testPauseAfterCreate): it
// writes dir/<workspace id> and blocks until the file is removed. dir ""
// (production) means no hook.
func pauseAfterCreate(dir string) func(string) {
	if dir == "" {
		return nil
	}
	return func(id string) {
		f := filepath.Join(dir, id)
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			return
		}
		for {
			if _, err := os.Stat(f); errors.Is(err, os.ErrNotExist) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// How often the egress proxy's counts go to the workspaces' records, and
// the bound of one such round trip (an end waits for one in flight).
const (
	egressKeepInterval = 10 * time.Second
	egressKeepTimeout  = 5 * time.Second
)

// egressKeeper adds the proxy's counts to the workspaces' records
// (store.DB.AddEgress), for egress.Proxy.Record.
func egressKeeper(db *store.DB) func(context.Context, []egress.Delta) ([]egress.Kept, error) {
	return func(ctx context.Context, ds []egress.Delta) ([]egress.Kept, error) {
		adds := make([]store.EgressAdd, len(ds))
		for i, d := range ds {
			adds[i] = store.EgressAdd{AccountID: d.AccountID, WorkspaceID: d.WorkspaceID, Egress: store.Egress{Counter: d.Counter, Out: d.BytesOut, In: d.BytesIn}}
		}
		res, err := db.AddEgress(ctx, adds)
		if err != nil {
			return nil, err
		}
		kept := make([]egress.Kept, len(res))
		for i, r := range res {
			switch r {
			case store.EgressAdded:
				kept[i] = egress.KeptAll
			case store.EgressEnded:
				kept[i] = egress.KeptEnded
			case store.EgressInDoubt:
				kept[i] = egress.KeptInDoubt
			}
		}
		return kept, nil
	}
}
