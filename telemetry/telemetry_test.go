package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/internal/fakeprovider"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/runner"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/telemetry"
)

func TestNewTracing(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    string // Exporter; "" off
		wantErr bool
	}{
		{name: "nothing set", env: nil, want: ""},
		{name: "endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, want: "otlp/http"},
		{name: "traces endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces"}, want: "otlp/http"},
		{name: "exporter otlp alone", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, want: "otlp/http"},
		{name: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, want: "otlp/grpc"},
		{name: "traces protocol wins", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
			"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, want: "otlp/http"},
		{name: "exporter none", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"}, want: ""},
		{name: "sdk disabled", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"}, want: ""},
		{name: "unknown exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: true},
		{name: "http/json", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := telemetry.NewTracing(context.Background(), func(k string) string { return tt.env[k] }, "v0", "b1")
			if tt.wantErr {
				if err == nil {
					t.Fatalf("NewTracing(%v) succeeded; want an error", tt.env)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewTracing(%v): %v", tt.env, err)
			}
			defer tr.Shutdown(context.Background())
			if tr.Exporter != tt.want || tr.Enabled != (tt.want != "") || tr.Provider == nil {
				t.Errorf("NewTracing(%v) = exporter %q enabled %v; want %q", tt.env, tr.Exporter, tr.Enabled, tt.want)
			}
		})
	}
}

func newRecorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rec
}

func newMeter(t *testing.T) (*sdkmetric.ManualReader, *sdkmetric.MeterProvider) {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return r, mp
}

func attrs(kvs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

// collect returns every data point's attributes and value, by metric name.
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string][]string {
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					out[m.Name] = append(out[m.Name], fmt.Sprintf("%s=%d", dp.Attributes.Encoded(attribute.DefaultEncoder()), dp.Value))
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					out[m.Name] = append(out[m.Name], fmt.Sprintf("%s=%d", dp.Attributes.Encoded(attribute.DefaultEncoder()), dp.Count))
				}
			}
		}
	}
	return out
}

// TestProviders: each call is a span and a latency point with the
// provider, operation and outcome; an error's text never is; a provider's
// own Commander stays visible through the wrapper, and one without keeps
// the generic runner.
func TestProviders(t *testing.T) {
	ctx := context.Background()
	tp, rec := newRecorder(t)
	reader, mp := newMeter(t)
	fake := fakeprovider.New()
	plain := struct{ providers.Provider }{fakeprovider.New()} // no Commander
	set, err := providers.NewSet("a", providers.Entry{Name: "a", Kind: "fake", Provider: fake, AcceptNew: true},
		providers.Entry{Name: "b", Kind: "fake", Provider: plain})
	if err != nil {
		t.Fatal(err)
	}
	wrapped, err := telemetry.Providers(set, tp, mp.Meter("t"))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := wrapped.Get("a")
	b, _ := wrapped.Get("b")
	if _, ok := a.Provider.(providers.Commander); !ok {
		t.Errorf("the wrapped provider a is no Commander; its inner one is")
	}
	if _, ok := runner.For(b.Provider).(*runner.Runner); !ok {
		t.Errorf("runner.For(wrapped b) is not the generic runner")
	}
	if b.AcceptNew || !a.AcceptNew || wrapped.Default() != "a" {
		t.Errorf("the wrapped set lost its entries' settings")
	}

	const secret = "SECRET-PATH"
	sb, err := a.Provider.Create(ctx, providers.CreateSpec{WorkspaceID: "ws_1", Env: map[string]string{"K": secret}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Provider.Exec(ctx, sb, providers.ExecSpec{Argv: []string{"echo", secret}}); err != nil {
		t.Fatal(err)
	}
	if _, err := providers.ReadFileBytes(ctx, a.Provider, sb, "/"+secret, 10); !errors.Is(err, providers.ErrFileNotFound) {
		t.Fatalf("ReadFile = %v; want ErrFileNotFound through the wrapper", err)
	}
	fake.TerminateErr = fmt.Errorf("vendor said %s", secret)
	if err := a.Provider.Terminate(ctx, sb); err == nil {
		t.Fatal("Terminate succeeded; want the fake's error")
	}

	want := map[string]string{"provider create": "ok", "provider exec": "ok", "provider read_file": "file_not_found", "provider terminate": "error"}
	got := map[string]string{}
	for _, s := range rec.Ended() {
		m := attrs(s.Attributes())
		got[s.Name()] = m[telemetry.AttrOutcome]
		if m[telemetry.AttrProvider] != "a" {
			t.Errorf("span %s has provider %q; want a", s.Name(), m[telemetry.AttrProvider])
		}
		all := fmt.Sprint(s.Name(), s.Attributes(), s.Events(), s.Status())
		if strings.Contains(all, secret) {
			t.Errorf("span %s carries the secret: %s", s.Name(), all)
		}
	}
	for name, outcome := range want {
		if got[name] != outcome {
			t.Errorf("span %q outcome = %q; want %q (spans: %v)", name, got[name], outcome, got)
		}
	}
	m := collect(t, reader)
	if n := len(m[telemetry.MetricProviderDuration]); n != 4 {
		t.Errorf("%s has %d series; want 4 (one per operation): %v", telemetry.MetricProviderDuration, n, m[telemetry.MetricProviderDuration])
	}
	errs := strings.Join(m[telemetry.MetricProviderErrors], " ")
	if !strings.Contains(errs, "sandgate.provider.outcome=error") || !strings.Contains(errs, "sandgate.provider.outcome=file_not_found") {
		t.Errorf("%s = %s; want the terminate error and the missing file", telemetry.MetricProviderErrors, errs)
	}
}

// TestRedisHook: a command in a trace is a span named after the command,
// with no key or argument; a command outside any trace makes none.
func TestRedisHook(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	tp, rec := newRecorder(t)
	rdb.AddHook(telemetry.RedisHook(tp))
	ctx := context.Background()
	rdb.Set(ctx, "untraced-key", "v", 0)
	if n := len(rec.Ended()); n != 0 {
		t.Fatalf("a command outside a trace made %d spans; want 0", n)
	}
	pctx, parent := tp.Tracer("t").Start(ctx, "parent")
	rdb.Set(pctx, "SECRET-KEY", "SECRET-VALUE", 0)
	if err := rdb.Get(pctx, "missing").Err(); !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	pipe := rdb.Pipeline()
	pipe.Get(pctx, "SECRET-KEY")
	pipe.Incr(pctx, "n")
	if _, err := pipe.Exec(pctx); err != nil {
		t.Fatal(err)
	}
	parent.End()
	names := map[string]bool{}
	for _, s := range rec.Ended() {
		names[s.Name()] = true
		all := fmt.Sprint(s.Attributes(), s.Events(), s.Status())
		if strings.Contains(all, "SECRET") {
			t.Errorf("span %s carries a key or value: %s", s.Name(), all)
		}
		if s.Name() == "redis GET" && s.Status().Code.String() == "Error" {
			t.Errorf("a miss (redis.Nil) is an error on its span")
		}
	}
	for _, want := range []string{"redis SET", "redis GET", "redis PIPELINE"} {
		if !names[want] {
			t.Errorf("no span %q among %v", want, names)
		}
	}
}

type fakeAdmitter struct{ err error }

func (f fakeAdmitter) Admit(_ context.Context, r *admission.Request) error {
	r.Workspace.Price = sandgate.Price{Currency: "EUR", HoldMicros: 1000}
	return f.err
}

// TestAdmission: every decision is a span and a point of
// sandgate.admission.decisions by outcome; an admitted hold counts by currency.
func TestAdmission(t *testing.T) {
	tp, rec := newRecorder(t)
	reader, mp := newMeter(t)
	for _, err := range []error{nil, &admission.Replay{Record: store.IdemRecord{}},
		protocol.E(protocol.ConcurrencyLimit, "full"), &protocol.Error{Code: protocol.AdmissionUnavailable, Err: errors.New("SECRET")}} {
		a, aerr := telemetry.Admission(fakeAdmitter{err: err}, tp, mp.Meter("t"))
		if aerr != nil {
			t.Fatal(aerr)
		}
		if got := a.Admit(context.Background(), &admission.Request{}); got != err {
			t.Errorf("Admit = %v; want %v passed through", got, err)
		}
	}
	var outcomes []string
	for _, s := range rec.Ended() {
		outcomes = append(outcomes, attrs(s.Attributes())["sandgate.admission.outcome"])
		if strings.Contains(fmt.Sprint(s.Attributes(), s.Status()), "SECRET") {
			t.Errorf("the admission span carries the error's text")
		}
	}
	if got := strings.Join(outcomes, ","); got != "admitted,replay,concurrency_limit,admission_unavailable" {
		t.Errorf("admission outcomes = %s", got)
	}
	m := collect(t, reader)
	if got := strings.Join(m[telemetry.MetricHeld], ","); got != "currency=EUR=1000" {
		t.Errorf("%s = %s; want the admitted hold alone", telemetry.MetricHeld, got)
	}
	if n := len(m[telemetry.MetricAdmissionDecisions]); n != 4 {
		t.Errorf("%s has %d series; want 4", telemetry.MetricAdmissionDecisions, n)
	}
}

// TestTransport: a vendor request is a client span with the host and the
// status, not the path or query, and carries the traceparent.
func TestTransport(t *testing.T) {
	var got string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Get("traceparent")
		w.WriteHeader(http.StatusTeapot)
	}))
	defer srv.Close()
	tp, rec := newRecorder(t)
	ctx, parent := tp.Tracer("t").Start(context.Background(), "parent")
	hc := &http.Client{Transport: telemetry.Transport(tp, nil)}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/sandboxes/SECRET-ID/exec?cmd=SECRET-ARGV", nil)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	parent.End()
	if !strings.Contains(got, parent.SpanContext().TraceID().String()) {
		t.Errorf("the vendor got traceparent %q; want the caller's trace", got)
	}
	for _, s := range rec.Ended() {
		if s.Name() != "vendor POST" {
			continue
		}
		m := attrs(s.Attributes())
		if m["http.response.status_code"] != "418" || m["server.address"] != "127.0.0.1" {
			t.Errorf("vendor span attributes = %v", m)
		}
		if strings.Contains(fmt.Sprint(s.Attributes()), "SECRET") {
			t.Errorf("the vendor span carries the URL's path or query: %v", m)
		}
		return
	}
	t.Errorf("no vendor POST span")
}
