package gateway

import (
	"log/slog"
	"time"

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

// ctxCode is the echo.Context key under which accessLog leaves the
// request's protocol code for the server span.
const ctxCode = "sandgate_code"

// requestBuckets are MetricRequestDuration's bucket bounds, in seconds.
var requestBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// serverTelemetry is the Server's tracer and latency histogram.
type serverTelemetry struct {
	tracer   trace.Tracer
	duration metric.Float64Histogram // nil when it could not be registered
}

func newServerTelemetry(cfg Config, log *slog.Logger) serverTelemetry {
	tp := cfg.Tracer
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	t := serverTelemetry{tracer: tp.Tracer("github.com/sandgate/sandgate/gateway")}
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

// routeLabel is the request's method and route template, or "unmatched": the
// method and path of an unknown route are the client's, unbounded.
func (s *Server) routeLabel(c echo.Context) string {
	route := c.Request().Method + " " + c.Path()
	if !s.routeSet[route] {
		return "unmatched"
	}
	return route
}

// telemetry makes the request's server span, a child of the caller's W3C
// traceparent when it sent one, named after the route template, with the
// status, the protocol code and the request id; and records its latency
// in MetricRequestDuration. No query, header value, body or token is an
// attribute.
func (s *Server) telemetry(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		r := c.Request()
		ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		route := s.routeLabel(c)
		attrs := []attribute.KeyValue{attribute.String("http.request.method", r.Method)}
		if route != "unmatched" {
			attrs = append(attrs, attribute.String("http.route", c.Path())) // never an unknown path: the client's
		}
		ctx, span := s.tel.tracer.Start(ctx, route, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
		c.SetRequest(r.WithContext(ctx))
		err := next(c)
		status := c.Response().Status
		attrs = []attribute.KeyValue{attribute.Int("http.response.status_code", status),
			attribute.String("sandgate.request_id", requestID(c))}
		if code, _ := c.Get(ctxCode).(protocol.Code); code != "" {
			attrs = append(attrs, attribute.String("error.code", string(code)))
			if status >= 500 {
				span.SetStatus(codes.Error, string(code))
			}
		}
		if a := authFrom(c); a.Lease.ID != "" {
			attrs = append(attrs, attribute.String("sandgate.instance_id", a.Lease.InstanceID))
		}
		span.SetAttributes(attrs...)
		span.End()
		if s.tel.duration != nil {
			s.tel.duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributeSet(attribute.NewSet(
				attribute.String("route", route), attribute.Int(sandgate.KeyStatus, status))))
		}
		return err
	}
}

// Draining reports whether Drain was called: the gateway refuses new
// requests, and readiness says so.
func (s *Server) Draining() bool { return s.draining.Load() }
