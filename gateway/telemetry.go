package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/protocol"
)

// MetricRequestDuration is the latency of requests to the v1 API, in
// seconds, by route (as MetricRequests) and status.
const MetricRequestDuration = "sandgate.http.request.duration"

// requestBuckets are MetricRequestDuration's bucket bounds, in seconds.
var requestBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// serverTelemetry is the Server's tracer and latency histogram.
type serverTelemetry struct {
	tracer   trace.Tracer            // nil when tracing is off: no span is started
	duration metric.Float64Histogram // nil when it could not be registered
}

func newServerTelemetry(cfg Config, log *slog.Logger) serverTelemetry {
	var t serverTelemetry
	switch cfg.Tracer.(type) {
	case nil, noop.TracerProvider, *noop.TracerProvider:
		// Tracing is off (no exporter configured): a no-op span would be
		// started, given attributes and ended for nothing on every request.
	default:
		t.tracer = cfg.Tracer.Tracer("github.com/sandgate/sandgate/gateway")
	}
	if cfg.Meter == nil {
		return t
	}
	var err error
	if t.duration, err = cfg.Meter.Float64Histogram(MetricRequestDuration, metric.WithUnit("s"),
		metric.WithDescription("Latency of requests to the v1 API, by route and status."),
		metric.WithExplicitBucketBoundaries(requestBuckets...)); err != nil {
		log.Warn("gateway metric not registered", slog.String("metric", MetricRequestDuration), slog.Any(sandgate.KeyError, err))
	}
	return t
}

// routeKey is a route as echo names it: its method and template.
type routeKey struct{ method, path string }

// routeInfo is one route's label ("METHOD /template", or "unmatched")
// and the measurements of its successes, the answer most requests get.
type routeInfo struct {
	label string
	ok    atomic.Pointer[measureOpts] // status 200, no code; nil until the first
}

// route is the request's route: its method and template, or "unmatched":
// the method and path of an unknown route are the client's, unbounded.
func (s *Server) route(c echo.Context) *routeInfo {
	if r, ok := s.routeInfos[routeKey{c.Request().Method, c.Path()}]; ok {
		return r
	}
	return s.unmatched
}

// measuresOf is measures of a request to r.
func (s *Server) measuresOf(r *routeInfo, status int, code protocol.Code) *measureOpts {
	if status != http.StatusOK || code != "" {
		return s.measures(r.label, status, code)
	}
	if m := r.ok.Load(); m != nil {
		return m
	}
	m := s.measures(r.label, status, code)
	r.ok.Store(m)
	return m
}

// measureKey is the attributes of one request's measurements.
type measureKey struct {
	route  string // routeLabel
	status int
	code   protocol.Code
}

// measureOpts are one measureKey's count of requests and attribute sets,
// built once: a request's measurements look them up instead of building
// and sorting their attributes every time.
type measureOpts struct {
	// n counts MetricRequests of the key, reported by observeRequests
	// when the metrics are read: an atomic add per request where the
	// metric SDK's counter would look its attribute set up in its own map.
	n        atomic.Int64
	count    []metric.ObserveOption // MetricRequests: route, status, code
	duration []metric.RecordOption  // MetricRequestDuration: route, status

	// pending are latencies of the key not yet recorded in
	// MetricRequestDuration (durationBatch). One Record on a request's
	// path costs a walk through the metric SDK's structures, cold by the
	// time the next request comes; appending a value costs a cache line,
	// and a batch is recorded in one hot loop. observeRequests records
	// what is pending before every collection, so a collection sees every
	// request answered before it, as if each had been recorded at once.
	mu      sync.Mutex
	pending []float64
}

// durationBatch is how many latencies of one key wait before the request
// that fills the batch records them.
const durationBatch = 64

// recordDuration records d seconds of a request of m in
// MetricRequestDuration. A request in a sampled span is recorded at once,
// with its context, so that an exemplar can name its trace; without one
// the SDK's default (trace-based) exemplar filter keeps no exemplar, and
// the latency waits in m's batch.
func (s *Server) recordDuration(ctx context.Context, m *measureOpts, d float64) {
	if trace.SpanContextFromContext(ctx).IsSampled() {
		s.tel.duration.Record(ctx, d, m.duration...)
		return
	}
	m.mu.Lock()
	if m.pending == nil {
		m.pending = make([]float64, 0, durationBatch)
	}
	m.pending = append(m.pending, d)
	var full []float64
	if len(m.pending) == durationBatch {
		full, m.pending = m.pending, nil
	}
	m.mu.Unlock()
	s.recordPending(full, m)
}

// flushDurations records m's pending latencies.
func (s *Server) flushDurations(m *measureOpts) {
	m.mu.Lock()
	full := m.pending
	m.pending = nil
	m.mu.Unlock()
	s.recordPending(full, m)
}

func (s *Server) recordPending(vals []float64, m *measureOpts) {
	for _, d := range vals {
		s.tel.duration.Record(context.Background(), d, m.duration...)
	}
}

// measures returns the measurements of a request's key, made on its
// first request. Routes (the route table's, or "unmatched"), statuses
// (the gateway's own answers) and codes (the protocol's) are bounded,
// and so are the keys kept.
func (s *Server) measures(route string, status int, code protocol.Code) *measureOpts {
	k := measureKey{route, status, code}
	if m, ok := s.measureSets.Load(k); ok {
		return m.(*measureOpts)
	}
	m := &measureOpts{
		count: []metric.ObserveOption{metric.WithAttributeSet(attribute.NewSet(
			attribute.String("route", route), attribute.Int(sandgate.KeyStatus, status), attribute.String(sandgate.KeyCode, string(code))))},
		duration: []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(
			attribute.String("route", route), attribute.Int(sandgate.KeyStatus, status)))},
	}
	v, _ := s.measureSets.LoadOrStore(k, m)
	return v.(*measureOpts)
}

// observeRequests reports MetricRequests: every key's count so far. It
// runs before each collection reads the instruments (the metric SDK runs
// callbacks first), so it also records every key's pending latencies in
// MetricRequestDuration (recordDuration).
func (s *Server) observeRequests(_ context.Context, o metric.Int64Observer) error {
	s.measureSets.Range(func(_, v any) bool {
		m := v.(*measureOpts)
		if s.tel.duration != nil {
			s.flushDurations(m)
		}
		if n := m.n.Load(); n > 0 {
			o.Observe(n, m.count...)
		}
		return true
	})
	return nil
}

// startSpan starts the request's server span, a child of the caller's
// W3C traceparent when it sent one, named after the route template, and
// makes its context the request's. With tracing off it starts no span at
// all (nil) and returns the request's context.
func (s *Server) startSpan(c echo.Context) (context.Context, trace.Span) {
	r := c.Request()
	if s.tel.tracer == nil {
		return r.Context(), nil
	}
	ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	route := s.route(c).label
	attrs := []attribute.KeyValue{attribute.String("http.request.method", r.Method)}
	if route != "unmatched" {
		attrs = append(attrs, attribute.String("http.route", c.Path())) // never an unknown path: the client's
	}
	ctx, span := s.tel.tracer.Start(ctx, route, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
	c.SetRequest(r.WithContext(ctx))
	return ctx, span
}

// endSpan ends span (nil: none) with the status, the protocol code and
// the request id. No query, header value, body or token is an attribute.
func (s *Server) endSpan(span trace.Span, c *reqContext, code protocol.Code) {
	if span == nil {
		return
	}
	if span.IsRecording() {
		status := c.Response().Status
		attrs := []attribute.KeyValue{attribute.Int("http.response.status_code", status),
			attribute.String("sandgate.request_id", c.id)}
		if code != "" {
			attrs = append(attrs, attribute.String("error.code", string(code)))
			if status >= 500 {
				span.SetStatus(codes.Error, string(code))
			}
		}
		if a := c.auth; a != nil && a.Lease.ID != "" {
			attrs = append(attrs, attribute.String("sandgate.instance_id", a.Lease.InstanceID))
		}
		span.SetAttributes(attrs...)
	}
	span.End()
}

// Draining reports whether Drain was called: the gateway refuses new
// requests, and readiness says so.
func (s *Server) Draining() bool { return s.draining.Load() }
