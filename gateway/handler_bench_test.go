package gateway_test

import (
	"crypto/tls"
	"net/http"
	"testing"

	"github.com/sandgate/sandgate/admission"
)

// BenchmarkLeaseHandler is the gateway's own share of a warm GET
// /v1/lease, wired as BenchmarkLeaseVsTLSFloor's (logging, metrics,
// tracing setup, the read limit on), called in process with no
// connection: the request as net/http hands it to the handler, and a
// response writer that keeps nothing. It has none of the TLS, socket and
// client noise of the floor comparison, so a change to the handler's
// cost shows in it plainly (compare two builds in one alternating run).
func BenchmarkLeaseHandler(b *testing.B) {
	read := admission.DefaultRates[admission.ClassRead]
	read.PerSecond = 1e9
	e := rtStart(b, rtOptions{rateLimited: true, rates: map[admission.Class]admission.Rate{admission.ClassRead: read}, production: true})
	req := benchRequest(b, e, http.MethodGet, "/v1/lease", "", nil)
	req.TLS, req.RequestURI, req.Body = &tls.ConnectionState{}, "/v1/lease", http.NoBody
	h := e.srv.Config.Handler
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		h.ServeHTTP(w, req)
		if w.status != http.StatusOK {
			b.Fatalf("GET /v1/lease = %d; want 200", w.status)
		}
	}
}

// discardWriter is a ResponseWriter that keeps only the status.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(status int)      { w.status = status }
