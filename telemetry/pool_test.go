package telemetry_test

import (
	"slices"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/noop"
	"github.com/sandgate/sandgate/telemetry"
)

// pooled is a provider with a pool of fixed stats.
type pooled struct {
	*noop.Provider
	st providers.PoolStats
}

func (p pooled) PoolStats() providers.PoolStats { return p.st }

// TestPools: a provider's pool is scraped as sandgate_pool_ready by
// provider, size and image, and its cost as sandgate_pool_seconds_total
// and its takes as sandgate_pool_taken_total by provider; a provider
// without a pool reports nothing.
func TestPools(t *testing.T) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { mp.Shutdown(t.Context()) })
	set, err := providers.NewSet("warm",
		providers.Entry{Name: "warm", Kind: "local", AcceptNew: true, Provider: pooled{noop.New("warm"), providers.PoolStats{
			Ready:   []providers.PoolReady{{Size: "small", Image: "host", Ready: 3}, {Size: "medium", Image: "host", Ready: 0}},
			Seconds: 90.5, Taken: 7,
		}}},
		providers.Entry{Name: "cold", Kind: "noop", AcceptNew: true, Provider: noop.New("cold")})
	if err != nil {
		t.Fatal(err)
	}
	if err := telemetry.Pools(set, mp.Meter("test")); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			s := f.GetType().String()
			for _, l := range m.GetLabel() {
				s += " " + l.GetName() + "=" + l.GetValue()
			}
			switch {
			case m.GetGauge() != nil:
				s += " " + ftoa(m.GetGauge().GetValue())
			case m.GetCounter() != nil:
				s += " " + ftoa(m.GetCounter().GetValue())
			}
			got[f.GetName()] = append(got[f.GetName()], s)
		}
	}
	want := map[string][]string{
		"sandgate_pool_ready":         {"GAUGE image=host provider=warm size=medium 0", "GAUGE image=host provider=warm size=small 3"},
		"sandgate_pool_seconds_total": {"COUNTER provider=warm 90.5"},
		"sandgate_pool_taken_total":   {"COUNTER provider=warm 7"},
	}
	for name, w := range want {
		if g := got[name]; !equal(g, w) {
			t.Errorf("%s = %q; want %q", name, g, w)
		}
	}
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func equal(a, b []string) bool {
	slices.Sort(a)
	return slices.Equal(a, b)
}
