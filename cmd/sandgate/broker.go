package main

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
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/reaper"
	"github.com/sandgate/sandgate/saga"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/telemetry"
	"github.com/sandgate/sandgate/termination"
)

// broker is one running gateway process: the public listener, the
// operator listener, and what they share.
type broker struct {
	cfg       *Config
	log       *slog.Logger
	rdb       redis.UniversalClient
	tls       *tls.Config // nil: plaintext behind trusted proxies only
	public    net.Listener
	admin     net.Listener
	operators []admin.OperatorToken
	// kinds are the provider kinds it can open; nil means kinds().
	kinds providers.Registry
	// getenv reads the vendors' environment variables; nil means os.Getenv.
	getenv func(string) string
}

// run serves until ctx ends, then shuts down gracefully.
func (b *broker) run(ctx context.Context) error {
	clock := sandgate.SystemClock{}
	proxies, err := b.cfg.trustedProxies()
	if err != nil {
		return err
	}
	if b.tls == nil && len(proxies) == 0 {
		return errors.New("sandgate refuses plaintext: set tls.cert_file and tls.key_file, or tls.trusted_proxies for a TLS-terminating proxy")
	}
	getenv := b.getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	obs, err := newObservability(ctx, b.cfg, b.rdb, getenv, b.log)
	if err != nil {
		return err
	}
	defer obs.shutdown()
	mp, metricsHandler, tp, meter := obs.mp, obs.metrics, obs.tracing.Provider, obs.meter
	penv := providers.Env{Logger: b.log.With("component", "provider"), Clock: clock, BrokerID: b.cfg.BrokerID, DataDir: b.cfg.DataDir, Getenv: getenv,
		Transport: obs.transport, TracerProvider: tp}
	// One egress proxy per broker process: the local provider serves each
	// workspace's listener with it (docs/egress.md).
	ecfg, err := b.cfg.egressConfig(b.log.With("component", "egress"), meter)
	if err != nil {
		return err
	}
	proxy, err := egress.New(ecfg)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	reg := b.kinds
	if reg == nil {
		reg = kinds(proxy)
	}
	rawProvs, err := reg.Open(ctx, b.cfg.providers, b.cfg.DefaultProvider, penv)
	if err != nil {
		return err
	}
	// The proxy's last counts go to the workspaces' records once the
	// providers have closed (deferred before their Close, so it runs after).
	var keepEgress func(context.Context)
	defer func() {
		if keepEgress != nil {
			kctx, kcancel := context.WithTimeout(context.Background(), egressKeepTimeout)
			defer kcancel()
			keepEgress(kctx)
		}
	}()
	defer func() {
		if err := rawProvs.Close(); err != nil {
			b.log.Warn("providers not closed cleanly", slog.Any(sandgate.KeyError, err))
		}
	}()
	// Every provider call is a span and a latency point (telemetry.Providers).
	provs, err := telemetry.Providers(rawProvs, tp, meter)
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}

	// The one wiring place: everything below is built once and shared.
	// Every script that admits work or moves money waits for the
	// replicas' acknowledgement (redis.wait, docs/scaling.md).
	durable := store.Durable(b.rdb, b.cfg.Redis.Wait.Replicas, b.cfg.Redis.Wait.Timeout)
	db := store.New(durable, store.Config{PendingTimeout: b.cfg.Admission.PendingTimeout})
	// A data directory another one holds stops the broker at once; a store
	// that cannot be asked yet (serve starts with Redis down) is asked again
	// in the background, below, and a refusal then stops it as well.
	claimLater := false
	if err := claimDataDirs(ctx, db, rawProvs, clock.Now()); errors.Is(err, errDataDirTaken) {
		return err
	} else if err != nil {
		b.log.Warn("local data directory not yet recorded in Redis; retrying", slog.Any(sandgate.KeyError, err))
		claimLater = true
	}
	bill := billing.New(db, billing.Config{Provider: providers.LegacyName, Log: b.log.With("component", "billing"), Meter: meter, Clock: clock,
		Webhook: billing.WebhookConfig{URL: b.cfg.Billing.Webhook.URL, Secret: b.cfg.webhookSecret, Timeout: b.cfg.Billing.Webhook.Timeout}})
	rates := map[admission.Class]admission.Rate{}
	for class, r := range b.cfg.Admission.RateLimits {
		rates[admission.Class(class)] = admission.Rate{PerSecond: r.PerSecond, Burst: r.Burst}
	}
	controls := admission.NewControlCache(db, clock)
	dc := db.Config()
	admit := admission.New(durable, admission.Standard(controls, admission.StandardConfig{
		IdempotencyTTL: dc.IdempotencyTTL, PendingTimeout: dc.PendingTimeout, Billing: bill.Checks(),
		Risk: admission.RiskDefaults{
			AcquiresPerMinute: b.cfg.Admission.Risk.AcquiresPerMinute,
			MaxOpenWorkspaces: b.cfg.Admission.Risk.MaxOpenWorkspaces,
			MaxSize:           b.cfg.Admission.Risk.MaxSize,
		},
	})...)
	term := termination.New(db, provs, clock, b.log.With("component", "termination"), 0)
	term.SetSettler(telemetry.Settlement(bill, tp))
	// A workspace's egress bytes go to its record every
	// egressKeepInterval while it runs (keepEgress), and what is left at
	// its end with its usage.
	term.SetEgressMeter(func(id string) termination.EgressCount {
		c := proxy.Forget(id)
		n := c.Unkept()
		return termination.EgressCount{Egress: store.Egress{Counter: c.Counter, Out: c.Total.BytesOut, In: c.Total.BytesIn},
			NewOut: n.BytesOut, NewIn: n.BytesIn, Exact: c.Exact}
	})
	keepEgress = func(ctx context.Context) {
		if err := proxy.Record(ctx, egressKeeper(db)); err != nil {
			b.log.Warn("egress bytes not recorded; kept for the next try", slog.Any(sandgate.KeyError, err))
		}
	}
	tadmit, err := telemetry.Admission(admit, tp, meter)
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	if err := telemetry.LiveWorkspaces(meter, provs.Names(), b.cfg.Admission.Timeout, func(ctx context.Context) ([]sandgate.Workspace, error) {
		return db.LiveWorkspaces(ctx, "", "", clock.Now())
	}); err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	limiter := admission.NewLimiter(b.rdb, rates)
	sg, err := saga.New(saga.Config{
		// A create must end well within the pending deadline, past which
		// the reaper ends the workspace under it.
		CreateTimeout: b.cfg.Admission.PendingTimeout * 3 / 4,
		AfterCreate:   pauseAfterCreate(b.cfg.testPauseAfterCreate),
	}, saga.Deps{DB: db, Providers: provs, Admission: tadmit, Holds: bill, Terminator: term, Limiter: limiter, Clock: clock, Log: b.log.With("component", "saga")})
	if err != nil {
		return err
	}
	gw, err := gateway.New(gateway.Config{TrustedProxies: proxies, Meter: mp.Meter("github.com/sandgate/sandgate/gateway"), Tracer: tp,
		// Counted per gateway process (README, admission.inflight).
		MaxInflightPerWorkspace: b.cfg.Admission.Inflight.PerWorkspace,
		MaxInflightPerInstance:  b.cfg.Admission.Inflight.PerInstance,
		InflightBytes:           b.cfg.Admission.Inflight.MaxBytes},
		gateway.Deps{DB: db, Saga: sg, Limiter: limiter,
			Controls: controls, Clock: clock, Log: b.log.With("component", "gateway"), Caches: []gateway.Cache{bill.Prices()}})
	if err != nil {
		return err
	}
	defaults := sandgate.Scope{
		Sizes: b.cfg.Defaults.Sizes, DefaultSize: b.cfg.Defaults.DefaultSize,
		Images: b.cfg.Defaults.Images, DefaultImage: b.cfg.Defaults.DefaultImage,
		Limits: b.cfg.Defaults.Limits.limits(),
	}
	// Every gateway process runs the reaper; one at a time leads (a Redis
	// lease), and its passes are idempotent all the same.
	rp := reaper.New(reaper.Config{Providers: provs, Owner: b.cfg.BrokerID + "/" + sandgate.NewID("reaper_"),
		Meter: mp.Meter("github.com/sandgate/sandgate/reaper"), Tracer: tp}, db, term, clock, b.log.With("component", "reaper"))
	adm, err := admin.New(admin.Config{Tokens: b.operators, Grace: b.cfg.Lease.GracePeriod, Defaults: defaults,
		Providers: provs, Terminator: term, Billing: bill}, db, clock, b.log.With("component", "admin"))
	if err != nil {
		return err
	}

	// Both servers see the connections of listen.go, so that every answer,
	// even those net/http gives by itself, is the envelope.
	const readHeaderTimeout = 10 * time.Second
	hl := newHealth(b.rdb, rawProvs)
	pub := &http.Server{Handler: withConnInfo(withHealth(gw.Handler(), hl)), ReadHeaderTimeout: readHeaderTimeout, ConnContext: connContext,
		ErrorLog: slog.NewLogLogger(b.log.Handler(), slog.LevelWarn)}
	ops := &http.Server{Handler: withMetrics(adm.Handler(), metricsHandler, hl), ReadHeaderTimeout: readHeaderTimeout,
		ErrorLog: slog.NewLogLogger(b.log.Handler(), slog.LevelWarn)}
	ops.Handler = withConsole(ops.Handler, adm.Handler(), clock, b.log.With("component", "console"))

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { gw.Run(runCtx) })
	wg.Go(func() { hl.run(runCtx) })
	rpCtx, rpCancel := context.WithCancel(runCtx)
	defer rpCancel()
	rpDone := make(chan struct{})
	wg.Go(func() { defer close(rpDone); rp.Run(rpCtx) })
	wg.Go(func() { bill.Run(runCtx, b.cfg.Billing.RepairInterval) })
	wg.Go(func() { bill.RunWebhooks(runCtx) })
	wg.Go(func() {
		t := time.NewTicker(egressKeepInterval)
		defer t.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
			}
			kctx, kcancel := context.WithTimeout(runCtx, egressKeepTimeout)
			keepEgress(kctx)
			kcancel()
		}
	})
	errc := make(chan error, 3)
	if claimLater {
		wg.Go(func() {
			for {
				select {
				case <-runCtx.Done():
					return
				case <-time.After(time.Second):
				}
				err := claimDataDirs(runCtx, db, rawProvs, clock.Now())
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
		if err := pub.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("public listener: %w", err)
		}
	})
	wg.Go(func() {
		if err := ops.Serve(plainListener{b.admin}); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("operator listener: %w", err)
		}
	})
	b.log.Info("sandgate listening", slog.String("listen", b.public.Addr().String()), slog.String("admin_listen", b.admin.Addr().String()), slog.String("broker_id", b.cfg.BrokerID))
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
	hl.drain()
	time.Sleep(b.cfg.DrainDelay)
	gw.Drain()
	rpCancel()
	<-rpDone
	sctx, scancel := context.WithTimeout(context.Background(), b.cfg.ShutdownTimeout)
	defer scancel()
	if err := pub.Shutdown(sctx); err != nil {
		b.log.Warn("requests still in flight at the shutdown bound were cut", slog.Any(sandgate.KeyError, err))
	}
	_ = ops.Shutdown(sctx)
	cancel()
	wg.Wait()
	return runErr
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

// isLoopback reports whether addr (host:port) binds only loopback.
func isLoopback(addr string) bool {
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

func serverTLS(cert tls.Certificate) *tls.Config {
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
