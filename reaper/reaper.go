// Package reaper carries out the broker's obligations in the background:
// it ends every workspace of a stopped or paused scope, keeps retrying
// those whose end the provider has not confirmed, and deletes snapshots at
// their TTL until the provider confirms.
package reaper

import (
	"context"
	"log/slog"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
)

// Config configures a Reaper. A zero field means the default noted beside it.
type Config struct {
	// Interval is the time between passes. 0 means 2 seconds.
	Interval time.Duration
	// Snapshots deletes expired and deleted snapshots' contents (the
	// provider). nil skips the snapshot sweep.
	Snapshots SnapshotDeleter
}

// Reaper runs passes until its context ends. Passes are idempotent, so
// several gateway processes may run one each.
type Reaper struct {
	cfg   Config
	db    *store.DB
	term  *termination.Terminator
	clock sandgate.Clock
	log   *slog.Logger
}

// New returns a Reaper.
func New(cfg Config, db *store.DB, term *termination.Terminator, clock sandgate.Clock, log *slog.Logger) *Reaper {
	if cfg.Interval == 0 {
		cfg.Interval = 2 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Reaper{cfg: cfg, db: db, term: term, clock: clock, log: log}
}

// Run runs a pass every Interval until ctx ends.
func (r *Reaper) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if err := r.Pass(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("reaper pass incomplete", slog.Any("err", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Pass deletes expired snapshots (sweepSnapshots) and ends every live
// workspace of a stopped or paused scope with the control's reason, once.
func (r *Reaper) Pass(ctx context.Context) error {
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
		return nil // everything is stopped; nothing narrower to do
	}
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
	if res.Terminated+res.Failed > 0 {
		r.log.Info("swept stopped scope", slog.String(sandgate.KeyAccountID, sc.AccountID),
			slog.String(sandgate.KeyInstanceID, sc.InstanceID), slog.String("reason", string(reason)),
			slog.Int("terminated", res.Terminated), slog.Int("failed", res.Failed))
	}
}
