package stripesync

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// metrics are the Syncer's instruments; their only attribute is outcome.
type metrics struct {
	events metric.Int64Counter
	lagG   metric.Float64Gauge
}

func newMetrics(m metric.Meter) (metrics, error) {
	if m == nil {
		m = noop.NewMeterProvider().Meter("stripesync")
	}
	ev, err := m.Int64Counter("sandgate.stripesync.events",
		metric.WithDescription("Usage ledger entries handled by the Stripe sync, by outcome: sent, skipped, failed (per attempt), dead_lettered."))
	if err != nil {
		return metrics{}, err
	}
	lag, err := m.Float64Gauge("sandgate.stripesync.lag", metric.WithUnit("s"),
		metric.WithDescription("Seconds since the oldest usage waiting to be sent to Stripe, the largest over the accounts of one pass."))
	if err != nil {
		return metrics{}, err
	}
	return metrics{events: ev, lagG: lag}, nil
}

// outcomes are the counter's attribute sets, built once.
var outcomes = func() map[string]metric.AddOption {
	m := map[string]metric.AddOption{}
	for _, o := range []string{"sent", "skipped", "failed", "dead_lettered"} {
		m[o] = metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", o)))
	}
	return m
}()

func (m metrics) count(ctx context.Context, outcome string, n int64) {
	m.events.Add(context.WithoutCancel(ctx), n, outcomes[outcome])
}

func (m metrics) lag(ctx context.Context, d time.Duration) {
	m.lagG.Record(context.WithoutCancel(ctx), d.Seconds())
}
