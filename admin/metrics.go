package admin

import (
	"context"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Names of the operator API's metrics.
const (
	// MetricRequests counts operator API requests by route ("METHOD
	// /admin/v1/template", or "unmatched") and status class ("2xx", …).
	MetricRequests = "sandgate.admin.requests"
	// MetricRequestDuration is their latency, in seconds, by the same
	// attributes.
	MetricRequestDuration = "sandgate.admin.request.duration"
	// MetricAuditWriteFailures counts audit entries that could not be
	// written (the action stood; see [Server.audit]).
	MetricAuditWriteFailures = "sandgate.audit.write_failures"
)

// adminBuckets are MetricRequestDuration's bucket bounds, in seconds.
var adminBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// metrics are the operator API's instruments.
type metrics struct {
	requests      metric.Int64Counter
	duration      metric.Float64Histogram
	auditFailures metric.Int64Counter
}

func newMetrics(m metric.Meter) (metrics, error) {
	if m == nil {
		m = noop.NewMeterProvider().Meter("admin")
	}
	var ms metrics
	var err error
	if ms.requests, err = m.Int64Counter(MetricRequests, metric.WithUnit("{request}"),
		metric.WithDescription("Operator API requests, by route template and status class.")); err != nil {
		return ms, err
	}
	if ms.duration, err = m.Float64Histogram(MetricRequestDuration, metric.WithUnit("s"),
		metric.WithDescription("Latency of operator API requests, by route template and status class."),
		metric.WithExplicitBucketBoundaries(adminBuckets...)); err != nil {
		return ms, err
	}
	if ms.auditFailures, err = m.Int64Counter(MetricAuditWriteFailures, metric.WithUnit("{entry}"),
		metric.WithDescription("Audit entries that could not be written.")); err != nil {
		return ms, err
	}
	// The series exists from the start, at 0: an alert on its increase
	// sees the first failure.
	ms.auditFailures.Add(context.Background(), 0)
	return ms, nil
}

// measure counts and times every operator request. Its route is the
// template the request matched, never its path: ids are unbounded.
func (s *Server) measure(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		status := c.Response().Status
		if err != nil {
			status = toProtocolError(err).Code.Status()
		}
		route := c.Request().Method + " " + c.Path()
		if _, ok := s.actions[route]; !ok {
			route = "unmatched"
		}
		set := metric.WithAttributeSet(attribute.NewSet(attribute.String("route", route),
			attribute.String("status_class", strconv.Itoa(status/100)+"xx")))
		ctx := context.WithoutCancel(c.Request().Context())
		s.metrics.requests.Add(ctx, 1, set)
		s.metrics.duration.Record(ctx, time.Since(start).Seconds(), set)
		return err
	}
}
