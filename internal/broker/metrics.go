package broker

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
)

// newMetrics returns the process's MeterProvider and the handler of
// GET /metrics, which exposes it (and the Go runtime's and the process's
// own metrics) in the Prometheus format. The registry is the process's
// own, not Prometheus's global one, and no OpenTelemetry global is set:
// whatever records a metric is handed a Meter.
func newMetrics(brokerID string) (*sdkmetric.MeterProvider, http.Handler, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewBuildInfoCollector())
	// Without the scope labels: every series would carry otel_scope_name
	// and its version, which say nothing an operator needs.
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(resource.NewSchemaless(
		attribute.String("service.name", "sandgate"), attribute.String("service.instance.id", brokerID))))
	return mp, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}

// withMetrics serves GET /metrics with m, GET /livez and GET /readyz
// (naming what is failing) with h, on the operator listener, and
// everything else with next (the operator API). They take no token: the
// listener is loopback-only, as Prometheus scrapes and probes expect.
func withMetrics(next, m http.Handler, h *health) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m)
	mux.HandleFunc("GET /livez", livez)
	mux.HandleFunc("GET /readyz", h.readyz)
	mux.Handle("/", next)
	return mux
}
