package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate/providers"
)

const (
	// MetricPoolReady is the warm sandboxes ready in a provider's pool,
	// by provider, size and image.
	MetricPoolReady = "sandgate.pool.ready"
	// MetricPoolSeconds is how long warm sandboxes have existed unclaimed
	// (the pool's own cost, billed to no tenant), by provider, counted by
	// this broker process since it started; the record that every broker
	// shares and that outlives them is billing's (billing.PoolUsage).
	MetricPoolSeconds = "sandgate.pool.seconds"
	// MetricPoolTaken counts the creates a warm sandbox served, by
	// provider.
	MetricPoolTaken = "sandgate.pool.taken"
)

// Pools registers MetricPoolReady, MetricPoolSeconds and MetricPoolTaken
// for every provider of set that keeps a pool (providers.Pooler), read at
// each collection. Pass the providers as opened, before Providers wraps
// them: the wrapper hides the optional interface.
func Pools(set *providers.Set, m metric.Meter) error {
	type pooler struct {
		name string
		p    providers.Pooler
	}
	var ps []pooler
	for _, e := range set.All() {
		if p, ok := e.Provider.(providers.Pooler); ok {
			ps = append(ps, pooler{e.Name, p})
		}
	}
	if len(ps) == 0 {
		return nil
	}
	ready, err := m.Int64ObservableGauge(MetricPoolReady, metric.WithUnit("{sandbox}"),
		metric.WithDescription("Warm sandboxes ready in a provider's pool, by provider, size and image."))
	if err != nil {
		return err
	}
	secs, err := m.Float64ObservableCounter(MetricPoolSeconds, metric.WithUnit("s"),
		metric.WithDescription("Seconds warm sandboxes have existed unclaimed, summed, by provider: the pool's own cost."))
	if err != nil {
		return err
	}
	taken, err := m.Int64ObservableCounter(MetricPoolTaken, metric.WithUnit("{sandbox}"),
		metric.WithDescription("Creates served by a warm sandbox of a provider's pool, by provider."))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, p := range ps {
			st := p.p.PoolStats()
			prov := attribute.String("provider", p.name)
			for _, r := range st.Ready {
				o.ObserveInt64(ready, int64(r.Ready), metric.WithAttributeSet(attribute.NewSet(
					prov, attribute.String("size", r.Size), attribute.String("image", r.Image))))
			}
			o.ObserveFloat64(secs, st.Seconds, metric.WithAttributeSet(attribute.NewSet(prov)))
			o.ObserveInt64(taken, st.Taken, metric.WithAttributeSet(attribute.NewSet(prov)))
		}
		return nil
	}, ready, secs, taken)
	return err
}
