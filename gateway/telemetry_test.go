package gateway_test

import (
	"context"
	"maps"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
)

// TestServerSpans: each request is a server span named after its route
// template that continues the caller's traceparent, with the status, the
// protocol code and the request id; an unknown path is "unmatched" and
// never named; the latency histogram has the same bounded route.
func TestServerSpans(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	h := sgtest.New(t, sgtest.Options{Gateway: gateway.Config{Tracer: tp, Meter: mp.Meter("t")}})
	in := h.NewInstance(adminapi.Scope{})
	hc := h.HTTPClient()
	const traceID, parentID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	get := func(path string, tok string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, h.URL()+path, nil)
		req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	ok := get("/v1/lease", in.Token.Reveal())
	get("/v1/lease", "")
	get("/v1/SECRET-PATH/x", in.Token.Reveal())
	_ = tp.ForceFlush(context.Background())

	type seen struct {
		attrs map[string]string
		sc    trace.SpanContext
		par   trace.SpanContext
	}
	var spans []seen
	names := map[string]int{}
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindServer {
			continue
		}
		m := map[string]string{}
		for _, kv := range s.Attributes() {
			m[string(kv.Key)] = kv.Value.String()
		}
		names[s.Name()]++
		spans = append(spans, seen{m, s.SpanContext(), s.Parent()})
		if strings.Contains(s.Name()+m["http.route"], "SECRET") {
			t.Errorf("a server span names the client's path: %s %v", s.Name(), m)
		}
		if s.Parent().TraceID().String() != traceID || s.Parent().SpanID().String() != parentID {
			t.Errorf("span %s has parent %v; want the caller's %s/%s", s.Name(), s.Parent(), traceID, parentID)
		}
	}
	if names["GET /v1/lease"] != 2 || names["unmatched"] != 1 {
		t.Fatalf("server spans = %v; want 2 GET /v1/lease and 1 unmatched", names)
	}
	if a := spans[0].attrs; a["http.response.status_code"] != "200" || a["http.route"] != "/v1/lease" ||
		a["sandgate.request_id"] != ok.Header.Get(protocol.HeaderRequestID) || a["sandgate.instance_id"] != in.ID {
		t.Errorf("the lease's span attributes = %v; want status 200, route, the response's request id, the instance", a)
	}
	if a := spans[1].attrs; a["http.response.status_code"] != "401" || a["error.code"] != string(protocol.Unauthenticated) {
		t.Errorf("the refused lease's span attributes = %v; want 401 unauthenticated", a)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	routes := map[string]uint64{}
	counts := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if hist, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == gateway.MetricRequestDuration {
				for _, dp := range hist.DataPoints {
					r, _ := dp.Attributes.Value(attribute.Key("route"))
					routes[r.AsString()] += dp.Count
				}
			}
			if m.Name != gateway.MetricRequests {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok || !sum.IsMonotonic || sum.Temporality != metricdata.CumulativeTemporality {
				t.Errorf("%s is a %T; want a monotonic cumulative sum (a counter)", m.Name, m.Data)
				continue
			}
			for _, dp := range sum.DataPoints {
				r, _ := dp.Attributes.Value(attribute.Key("route"))
				st, _ := dp.Attributes.Value(attribute.Key("status"))
				c, _ := dp.Attributes.Value(attribute.Key("code"))
				counts[r.AsString()+" "+st.String()+" "+c.AsString()] += dp.Value
			}
		}
	}
	if routes["GET /v1/lease"] != 2 || routes["unmatched"] != 1 {
		t.Errorf("%s by route = %v; want GET /v1/lease 2, unmatched 1", gateway.MetricRequestDuration, routes)
	}
	want := map[string]int64{"GET /v1/lease 200 ": 1, "GET /v1/lease 401 unauthenticated": 1, "unmatched 400 invalid_request": 1}
	if !maps.Equal(counts, want) {
		t.Errorf("%s = %v; want %v", gateway.MetricRequests, counts, want)
	}
}
