package telemetry

import (
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Transport returns base (http.DefaultTransport when nil) with a client
// span per vendor request ("vendor GET") and the W3C traceparent sent
// along. Its attributes are the method, the vendor's host and the status:
// not the URL, whose path and query carry vendor ids and, for some
// vendors, a command's argv, and which contrib otelhttp records whole
// (url.full).
func Transport(tp trace.TracerProvider, base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{base: base, tracer: tp.Tracer(ScopeName + "/vendor")}
}

type transport struct {
	base   http.RoundTripper
	tracer trace.Tracer
}

func (t *transport) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx, span := t.tracer.Start(r.Context(), "vendor "+r.Method, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("server.address", r.URL.Hostname())))
	r = r.Clone(ctx)
	Propagator.Inject(ctx, propagation.HeaderCarrier(r.Header))
	resp, err := t.base.RoundTrip(r)
	switch {
	case err != nil:
		outcome, _ := Outcome(err)
		span.SetAttributes(attribute.String("error.type", outcome))
		span.SetStatus(codes.Error, outcome)
	default:
		span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
		if resp.StatusCode >= 500 {
			span.SetStatus(codes.Error, strconv.Itoa(resp.StatusCode))
		}
	}
	span.End()
	return resp, err
}
