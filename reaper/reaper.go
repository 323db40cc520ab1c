// Package reaper carries out the broker's obligations in the background:
// it ends every workspace of a stopped or paused scope, and those whose
// sandbox the vendor no longer lists, keeps retrying those whose end the
// provider has not confirmed, and deletes snapshots at their TTL until
// the provider confirms.
package reaper

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/tick"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
)

// Config configures a Reaper. A zero field means the default noted beside it.
type Config struct {
	// Interval is the time between passes. 0 means 2 seconds.
	Interval time.Duration
	// Owner names this process in the leader lease. "" means a random id.
	Owner string
	// LeaseTTL is the leader lease's TTL: a new leader takes over at most
	// this long after the old one died. 0 means 5 seconds.
	LeaseTTL time.Duration
	// Meter records the reaper's metrics (MetricCorrections and
	// MetricPasses). nil means none are recorded.
	Meter metric.Meter
	// Tracer makes a span of every pass ("reaper pass"), the parent of
	// its store and provider calls. nil means no spans.
	Tracer trace.TracerProvider
	// BrokerID is this gateway's broker id (the label its providers put
	// on sandboxes), registered in the store so that whichever gateway
	// leads also lists this one's sandboxes. "" registers nothing.
	BrokerID string
	// ReconcileInterval is the least time between two comparisons of the
	// running workspaces with what each provider lists; a workspace
	// confirmed running at least this long before a listing that lacks
	// its sandbox is ended (failed). 0 means 30 seconds; < 0 means never.
	ReconcileInterval time.Duration
}

// Deps are what a Reaper works with.
type Deps struct {
	DB *store.DB
	// Providers are the broker's providers: each workspace and snapshot
	// is handled on the one it was created on, and every provider is
	// listed for unknown creates and orphans. nil skips the snapshot
	// sweep, unknown creates and orphans.
	Providers  *providers.Set
	Terminator *termination.Terminator
	Clock      sandgate.Clock
	Log        *slog.Logger // nil discards
}

// The reaper's metrics. Their only attribute is KindAttr, from the bounded
// set of Kind values: never an account, instance or workspace id, which
// would be unbounded and tenant data.
const (
	// MetricCorrections counts every correction, by kind.
	MetricCorrections = "sandgate.reaper.corrections"
	// MetricPasses counts passes run while leading.
	MetricPasses = "sandgate.reaper.passes"
	// KindAttr is the corrections counter's one attribute.
	KindAttr = "kind"
)

// Kinds of correction, the values of KindAttr. A workspace the reaper ends
// is counted under its termination reason (expired, idle, lease_revoked,
// paused, emergency_stopped, failed, orphaned).
const (
	KindRetried         = "retried"          // a termination the provider had not confirmed, now confirmed
	KindSlotFreed       = "slot_freed"       // a slot or reservation whose workspace is gone, freed
	KindSnapshotExpired = "snapshot_expired" // a snapshot past its TTL, marked for deletion
	KindSnapshotDeleted = "snapshot_deleted" // a snapshot's contents deleted at the provider
)

// Reaper runs passes while it holds the leader lease. Passes are
// idempotent and safe to run concurrently (every state change is a
// conditional script), so the lease is an economy, not the guard.
type Reaper struct {
	cfg         Config
	provs       *providers.Set
	db          *store.DB
	term        *termination.Terminator
	clock       sandgate.Clock
	log         *slog.Logger
	stats       Stats
	corrections metric.Int64Counter
	passes      metric.Int64Counter
	tracer      trace.Tracer
	fence       atomic.Int64 // the fencing token while leading, 0 otherwise
	lastTruth   atomic.Int64 // when running workspaces were last compared with the listings (unix ns)
}

// Stats counts what the reaper did, by kind; every count is also a log line.
type Stats struct {
	Passes, Expired, Idle, Revoked, Failed, Orphaned, Retried, SlotsFreed atomic.Int64
	// Vanished counts running workspaces ended because their provider no
	// longer lists their sandbox (also counted in the failed kind).
	Vanished atomic.Int64
}

// New returns a Reaper.
func New(cfg Config, d Deps) *Reaper {
	log := d.Log
	if cfg.Interval == 0 {
		cfg.Interval = 2 * time.Second
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 5 * time.Second
	}
	if cfg.ReconcileInterval == 0 {
		cfg.ReconcileInterval = 30 * time.Second
	}
	if cfg.Owner == "" {
		cfg.Owner = sandgate.NewID("reaper_")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Meter == nil {
		cfg.Meter = noop.NewMeterProvider().Meter("")
	}
	if cfg.Tracer == nil {
		cfg.Tracer = tracenoop.NewTracerProvider()
	}
	r := &Reaper{cfg: cfg, provs: d.Providers, db: d.DB, term: d.Terminator, clock: d.Clock, log: log, tracer: cfg.Tracer.Tracer("github.com/sandgate/sandgate/reaper")}
	var err error
	if r.corrections, err = cfg.Meter.Int64Counter(MetricCorrections, metric.WithUnit("{correction}"),
		metric.WithDescription("Corrections the reaper made, by kind.")); err != nil {
		log.Warn("reaper metric not registered", slog.String("metric", MetricCorrections), slog.Any(sandgate.KeyError, err))
	}
	// Every kind starts at 0, so a rate over the series works from the start.
	for _, kind := range []string{KindRetried, KindSlotFreed, KindSnapshotExpired, KindSnapshotDeleted,
		string(sandgate.ReasonExpired), string(sandgate.ReasonIdle), string(sandgate.ReasonLeaseRevoked), string(sandgate.ReasonPaused),
		string(sandgate.ReasonEmergencyStopped), string(sandgate.ReasonFailed), string(sandgate.ReasonOrphaned)} {
		if r.corrections != nil {
			r.corrections.Add(context.Background(), 0, metric.WithAttributeSet(attribute.NewSet(attribute.String(KindAttr, kind))))
		}
	}
	if r.passes, err = cfg.Meter.Int64Counter(MetricPasses, metric.WithUnit("{pass}"),
		metric.WithDescription("Reaper passes run.")); err != nil {
		log.Warn("reaper metric not registered", slog.String("metric", MetricPasses), slog.Any(sandgate.KeyError, err))
	}
	return r
}

// correct records n corrections of kind, one of the Kind values or a
// termination reason.
func (r *Reaper) correct(ctx context.Context, kind string, n int64) {
	if n <= 0 || r.corrections == nil {
		return
	}
	r.corrections.Add(ctx, n, metric.WithAttributeSet(attribute.NewSet(attribute.String(KindAttr, kind))))
}

// Stats returns the reaper's counters.
func (r *Reaper) Stats() *Stats { return &r.stats }

// Fence returns the fencing token of the lease this reaper holds, 0 when
// it does not lead.
func (r *Reaper) Fence() int64 { return r.fence.Load() }

// Run competes for the leader lease until ctx ends, and runs a pass every
// Interval while it leads. A pass stops as soon as a renewal fails. When
// ctx ends it gives the lease up, so another process takes over at once.
func (r *Reaper) Run(ctx context.Context) {
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if err := r.db.ReleaseLeader(rctx, r.cfg.Owner); err != nil {
			r.log.Warn("reaper lease not released", slog.Any("err", err))
		}
		r.fence.Store(0)
	}()
	retry := time.NewTicker(r.cfg.LeaseTTL / 5)
	defer retry.Stop()
	registered := r.cfg.BrokerID == ""
	for {
		if !registered {
			err := r.db.RegisterBroker(ctx, r.cfg.BrokerID, r.clock.Now())
			registered = err == nil
			if err != nil && ctx.Err() == nil {
				r.log.Warn("broker id not registered; the leader may miss this gateway's sandboxes", slog.Any(sandgate.KeyError, err))
			}
		}
		token, ok, err := r.db.AcquireLeader(ctx, r.cfg.Owner, r.cfg.LeaseTTL)
		if err != nil && ctx.Err() == nil {
			r.log.Warn("reaper lease unavailable", slog.Any("err", err))
		}
		if ok {
			r.lead(ctx, token)
		}
		select {
		case <-ctx.Done():
			return
		case <-retry.C:
		}
	}
}

// lead runs passes until ctx ends or the lease is lost.
func (r *Reaper) lead(ctx context.Context, token int64) {
	r.fence.Store(token)
	defer r.fence.Store(0)
	r.log.Info("reaper leading", slog.Int64("fence", token))
	lctx, lost := context.WithCancel(ctx)
	defer lost()
	go tick.Every(lctx, r.cfg.LeaseTTL/3, func() bool {
		n, ok, err := r.db.AcquireLeader(lctx, r.cfg.Owner, r.cfg.LeaseTTL)
		if err != nil || !ok || n != token {
			if lctx.Err() == nil {
				r.log.Warn("reaper lease lost", slog.Int64("fence", token), slog.Any("err", err))
			}
			lost()
			return false
		}
		return true
	})
	tick.NowAndEvery(lctx, r.cfg.Interval, func() {
		if err := r.Pass(lctx); err != nil && lctx.Err() == nil {
			r.log.Warn("reaper pass incomplete", slog.Any("err", err))
		}
	})
}

// Pass carries out every obligation once: it deletes expired snapshots
// (sweepSnapshots), ends every live workspace of a stopped or paused scope
// with the control's reason, and then (sweepWorkspaces) ends expired,
// idle and revoked workspaces, resolves unknown creates, terminates
// orphans and frees stale slots. Every step is idempotent.
func (r *Reaper) Pass(ctx context.Context) (err error) {
	ctx, span := r.tracer.Start(ctx, "reaper pass")
	defer func() {
		if err != nil {
			span.SetStatus(codes.Error, "pass incomplete")
		}
		span.End()
	}()
	r.stats.Passes.Add(1)
	if r.passes != nil {
		r.passes.Add(ctx, 1)
	}
	// Snapshots expire whatever the stop and pause state.
	if err := r.sweepSnapshots(ctx); err != nil {
		r.log.Warn("snapshot sweep incomplete", slog.Any("err", err))
	}
	now := r.clock.Now()
	stop, err := r.db.GlobalStop(ctx)
	if err != nil {
		return err
	}
	if stop.ActiveAt(now) {
		r.sweep(ctx, termination.Scope{}, sandgate.ReasonEmergencyStopped)
	} else if err := r.sweepControls(ctx, now); err != nil {
		return err
	}
	return r.sweepWorkspaces(ctx)
}

// sweepControls ends every live workspace of a paused or stopped account
// or instance with the control's reason.
func (r *Reaper) sweepControls(ctx context.Context, now time.Time) error {
	controls, err := r.db.AllControls(ctx)
	if err != nil {
		return err
	}
	for _, c := range controls {
		if !c.Control.ActiveAt(now) {
			continue
		}
		reason := sandgate.ReasonPaused
		if c.Kind == store.FieldStop {
			reason = sandgate.ReasonEmergencyStopped
		}
		r.sweep(ctx, termination.Scope{AccountID: c.AccountID, InstanceID: c.InstanceID}, reason)
	}
	return nil
}

func (r *Reaper) sweep(ctx context.Context, sc termination.Scope, reason sandgate.TerminationReason) {
	res, err := r.term.Sweep(ctx, sc, reason)
	if err != nil {
		r.log.Warn("sweep failed", slog.String(sandgate.KeyAccountID, sc.AccountID), slog.Any("err", err))
		return
	}
	r.correct(ctx, string(reason), int64(res.Terminated))
	if res.Terminated+res.Failed > 0 {
		r.log.Info("swept stopped scope", slog.String(sandgate.KeyAccountID, sc.AccountID),
			slog.String(sandgate.KeyInstanceID, sc.InstanceID), slog.String("reason", string(reason)),
			slog.Int("terminated", res.Terminated), slog.Int("failed", res.Failed))
	}
}
