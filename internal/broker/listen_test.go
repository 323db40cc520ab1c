//go:build linux

package broker

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/sandgate/sandgate/protocol"
)

// TestEnvelopeFor checks which writes the connection rewrites: net/http's
// own error answers, in the exact shape net/http/server.go writes them, and
// nothing else.
func TestEnvelopeFor(t *testing.T) {
	const eh = netHTTPErrorHeaders
	tests := []struct {
		name   string
		write  string
		status int // 0: left as it is
	}{
		{"431", "HTTP/1.1 431 Request Header Fields Too Large" + eh + "431 Request Header Fields Too Large", 431},
		{"400", "HTTP/1.1 400 Bad Request" + eh + "400 Bad Request", 400},
		{"400 with a reason", "HTTP/1.1 400 Bad Request: missing required Host header" + eh + "400 Bad Request: missing required Host header", 400},
		{"501", "HTTP/1.1 501 Not Implemented" + eh + "Unsupported transfer encoding", 501},
		{"505", "HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version" + eh + "505 HTTP Version Not Supported", 505},
		{"417", "HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nDate: x\r\nContent-Length: 0\r\n\r\n", 417},
		{"a handler's answer", "HTTP/1.1 400 Bad Request\r\nCache-Control: no-store\r\nContent-Type: application/json\r\n\r\n{}", 0},
		{"a handler's text answer", "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nDate: x\r\n\r\nno", 0},
		{"a body chunk", "431 Request Header Fields Too Large" + eh, 0},
		{"a 200", "HTTP/1.1 200 OK" + eh + "ok", 0},
		{"HTTP/1.0", "HTTP/1.0 400 Bad Request" + eh + "x", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, ok := envelopeFor([]byte(tt.write))
			if ok != (tt.status != 0) {
				t.Fatalf("envelopeFor(%q) rewrote = %v; want %v", tt.write, ok, tt.status != 0)
			}
			if !ok {
				return
			}
			resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(out)), nil)
			if err != nil {
				t.Fatalf("envelopeFor(%q) = %q: not an HTTP answer: %v", tt.write, out, err)
			}
			body, _ := io.ReadAll(resp.Body)
			var env protocol.Envelope
			if err := json.Unmarshal(body, &env); err != nil || resp.StatusCode != tt.status || env.Error.Code != protocol.InvalidRequest {
				t.Errorf("envelopeFor(%q) = %d %q (%v); want %d invalid_request", tt.write, resp.StatusCode, body, err, tt.status)
			}
			if !resp.Close || resp.Header.Get("Cache-Control") != "no-store" {
				t.Errorf("envelopeFor(%q): close %v, Cache-Control %q; want close, no-store", tt.write, resp.Close, resp.Header.Get("Cache-Control"))
			}
		})
	}
}
