//go:build linux

package main

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an in-test OTLP/HTTP trace receiver: it keeps every
// export's raw bytes (to scan for secrets) and its spans decoded.
type otlpReceiver struct {
	srv *httptest.Server

	mu    sync.Mutex
	raw   bytes.Buffer
	spans []recvSpan
}

// recvSpan is one received span, its attributes as strings.
type recvSpan struct {
	TraceID, SpanID, ParentID string
	Name                      string
	Kind                      string
	Attrs                     map[string]string
	Events                    int
	StatusCode                string
}

func startOTLP(t testing.TB) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

// Env points a broker's OTLP exporter at the receiver, flushing quickly.
func (r *otlpReceiver) Env() []string {
	return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + r.srv.URL, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_BSP_SCHEDULE_DELAY=200", "OTEL_SERVICE_NAME=sandgate-e2e"}
}

func (r *otlpReceiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != "/v1/traces" {
		http.NotFound(w, req)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var ex coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &ex); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.raw.Write(b)
	for _, rs := range ex.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				rsp := recvSpan{TraceID: hex.EncodeToString(s.TraceId), SpanID: hex.EncodeToString(s.SpanId),
					ParentID: hex.EncodeToString(s.ParentSpanId), Name: s.Name, Kind: s.Kind.String(),
					Attrs: attrMap(s.Attributes), Events: len(s.Events), StatusCode: s.GetStatus().GetCode().String()}
				r.spans = append(r.spans, rsp)
			}
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func attrMap(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.Key] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.Key] = fmt.Sprint(x.IntValue)
		case *commonpb.AnyValue_BoolValue:
			m[kv.Key] = fmt.Sprint(x.BoolValue)
		case *commonpb.AnyValue_DoubleValue:
			m[kv.Key] = fmt.Sprint(x.DoubleValue)
		default:
			m[kv.Key] = v.String()
		}
	}
	return m
}

// Raw returns every export's bytes, concatenated.
func (r *otlpReceiver) Raw() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.raw.String()
}

// Spans returns the spans received so far.
func (r *otlpReceiver) Spans() []recvSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recvSpan(nil), r.spans...)
}
