package reaper_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/reaper"
	"github.com/sandgate/sandgate/termination"
)

// TestCorrectionMetrics checks that every expired workspace the reaper ends
// is one sandgate.reaper.corrections{kind=expired}, and that the counter
// carries no attribute but kind.
func TestCorrectionMetrics(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const expired = 3
	for range expired {
		f.admit(10*time.Second, 0, true, true)
	}
	f.admit(time.Hour, time.Hour, true, true)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	term := termination.New(termination.Config{}, termination.Deps{DB: f.db, Providers: providers.Single(providers.LegacyName, f.prov), Clock: f.clock})
	r := reaper.New(reaper.Config{Owner: "m", Meter: mp.Meter("test")}, reaper.Deps{DB: f.db, Providers: providers.Single(providers.LegacyName, f.prov), Terminator: term, Clock: f.clock})
	f.clock.Advance(11 * time.Second)
	for range 2 { // the second pass has nothing left to correct
		if err := r.Pass(ctx); err != nil {
			t.Fatal(err)
		}
	}
	f.checkSlots(1)

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	sums := map[string]metricdata.Sum[int64]{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok {
				sums[m.Name] = s
			}
		}
	}
	if p := sums[reaper.MetricPasses]; len(p.DataPoints) != 1 || p.DataPoints[0].Value != 2 || !p.IsMonotonic {
		t.Errorf("%s = %+v; want one monotonic point of 2", reaper.MetricPasses, p)
	}
	byKind := map[string]int64{}
	for _, dp := range sums[reaper.MetricCorrections].DataPoints {
		if dp.Attributes.Len() != 1 {
			t.Errorf("%s point has attributes %v; want kind alone", reaper.MetricCorrections, dp.Attributes.ToSlice())
		}
		kind, _ := dp.Attributes.Value(attribute.Key(reaper.KindAttr))
		byKind[kind.AsString()] += dp.Value
	}
	if byKind["expired"] != expired {
		t.Errorf("corrections by kind = %v; want expired=%d", byKind, expired)
	}
	if r.Stats().Expired.Load() != expired {
		t.Errorf("Stats().Expired = %d; want %d", r.Stats().Expired.Load(), expired)
	}
}
