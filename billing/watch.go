package billing

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate/internal/tick"
)

// Metrics of WatchDrift, for the money-drift alert.
const (
	// MetricDriftAccounts is the number of accounts whose stored funds
	// disagreed with their ledgers at the last complete pass.
	MetricDriftAccounts = "sandgate.billing.reconcile.drift_accounts"
	// MetricReconcilePasses counts passes by outcome: ok, drift or failed.
	MetricReconcilePasses = "sandgate.billing.reconcile.passes"
)

// WatchDrift reconciles every account (as GET /admin/v1/billing/reconcile
// does) every interval while leading reports true, until ctx ends, and
// records the outcome in MetricDriftAccounts and MetricReconcilePasses:
// drift is found where an alert sees it, not only when someone asks. One
// gateway of many does the work (the reaper's leader), so the scans do not
// multiply with the gateways. A failed pass keeps the last complete one's
// count. interval 0 disables it.
func (b *Billing) WatchDrift(ctx context.Context, interval time.Duration, leading func() bool) {
	if interval <= 0 {
		return
	}
	var (
		mu     sync.Mutex
		drift  int64
		passed bool // a pass completed since this process leads
	)
	var passes metric.Int64Counter
	if m := b.cfg.Meter; m != nil {
		var err error
		passes, err = m.Int64Counter(MetricReconcilePasses, metric.WithUnit("{pass}"),
			metric.WithDescription("Reconciliation passes over every account's funds, by outcome (ok, drift, failed)."))
		if err != nil {
			b.log.Warn("billing metric not registered", slog.String("metric", MetricReconcilePasses), slog.Any("err", err))
		}
		_, err = m.Int64ObservableGauge(MetricDriftAccounts, metric.WithUnit("{account}"),
			metric.WithDescription("Accounts whose stored funds disagreed with their ledgers at the last reconciliation pass (on the reaper's leader)."),
			metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
				mu.Lock()
				defer mu.Unlock()
				if passed && leading() {
					o.Observe(drift)
				}
				return nil
			}))
		if err != nil {
			b.log.Warn("billing metric not registered", slog.String("metric", MetricDriftAccounts), slog.Any("err", err))
		}
	}
	count := func(outcome string) {
		if passes != nil {
			passes.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", outcome))))
		}
	}
	// Off the leader, look again soon: a gateway that takes the lead
	// reports within seconds, not an interval later.
	const followerPoll = 5 * time.Second
	for wait := time.Duration(0); tick.Sleep(ctx, wait) == nil; {
		if !leading() {
			mu.Lock()
			passed = false
			mu.Unlock()
			wait = min(interval, followerPoll)
			continue
		}
		wait = interval
		n, err := b.driftAccounts(ctx)
		if err != nil {
			if ctx.Err() == nil {
				b.log.Warn("reconciliation pass failed", slog.Any("err", err))
				count("failed")
			}
			continue
		}
		mu.Lock()
		drift, passed = n, true
		mu.Unlock()
		if n > 0 {
			b.log.Warn("reconciliation found drift", slog.Int64("accounts", n))
			count("drift")
			continue
		}
		count("ok")
	}
}

// driftAccounts reconciles every account and counts those with drift.
func (b *Billing) driftAccounts(ctx context.Context) (int64, error) {
	as, err := b.db.Accounts(ctx)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, a := range as {
		r, err := b.Reconcile(ctx, a.ID)
		if err != nil {
			return 0, err
		}
		if len(r.Drift) > 0 {
			n++
		}
	}
	return n, nil
}
