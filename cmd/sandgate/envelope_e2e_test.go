//go:build linux

package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
)

// TestEveryAnswerIsAnEnvelope sends `sandgate serve` what net/http would
// otherwise answer by itself, in plain text: plaintext HTTP on the TLS port,
// headers over the server's limit, a request line it cannot parse. Every
// answer must be the protocol's JSON envelope with the exact status and
// code, no-store and a request id; and the listener still serves TLS.
func TestEveryAnswerIsAnEnvelope(t *testing.T) {
	t.Parallel()
	gw := startServe(t, newServeConfig(t, startRedis(t).Addr, serveOptions{}))
	pub, err := url.Parse(gw.URL)
	if err != nil {
		t.Fatal(err)
	}
	adm, err := url.Parse(gw.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg := &tls.Config{RootCAs: gw.cfg.PKI.Roots, MinVersion: tls.VersionTLS12, ServerName: pub.Hostname()}
	// One header just over net/http's default limit (1 MiB, plus the 4 KiB
	// it allows for the request line): the rest of the request still fits
	// in the socket's buffers, so the client can read the answer.
	big := "X-Big: " + strings.Repeat("b", 1<<20+8<<10) + "\r\n"

	tests := []struct {
		name    string
		addr    string
		tls     bool
		request string
		status  int
		code    protocol.Code
	}{
		{"plaintext on the TLS port", pub.Host, false, "GET /v1/lease HTTP/1.1\r\nHost: x\r\n\r\n", 400, protocol.InvalidRequest},
		{"plaintext on the TLS port, claiming https", pub.Host, false,
			"GET /v1/lease HTTP/1.1\r\nHost: x\r\nX-Forwarded-Proto: https\r\n\r\n", 400, protocol.InvalidRequest},
		{"oversized headers over TLS", pub.Host, true, "GET /v1/lease HTTP/1.1\r\nHost: x\r\n" + big + "\r\n", 431, protocol.InvalidRequest},
		{"malformed request line over TLS", pub.Host, true, "NOT HTTP AT ALL\r\n\r\n", 400, protocol.InvalidRequest},
		{"no Host header over TLS", pub.Host, true, "GET /v1/lease HTTP/1.1\r\n\r\n", 400, protocol.InvalidRequest},
		{"unknown transfer coding over TLS", pub.Host, true,
			"POST /v1/workspaces HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: zip\r\n\r\n", 501, protocol.InvalidRequest},
		{"unknown Expect over TLS", pub.Host, true, "GET /v1/lease HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\n\r\n", 417, protocol.InvalidRequest},
		{"oversized headers on the operator port", adm.Host, false, "GET /admin/v1/status HTTP/1.1\r\nHost: x\r\n" + big + "\r\n", 431, protocol.InvalidRequest},
		{"malformed request line on the operator port", adm.Host, false, "NOT HTTP AT ALL\r\n\r\n", 400, protocol.InvalidRequest},
		// The listener tells TLS from plaintext, and still serves TLS.
		{"TLS without a token", pub.Host, true, "GET /v1/lease HTTP/1.1\r\nHost: x\r\n\r\n", 401, protocol.Unauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp, body := rawExchange(t, tt.addr, tlsCfg, tt.tls, tt.request)
			var env protocol.Envelope
			dec := json.NewDecoder(strings.NewReader(string(body)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&env); err != nil {
				t.Fatalf("answer %d %q is not the envelope: %v", resp.StatusCode, body, err)
			}
			if resp.StatusCode != tt.status || env.Error.Code != tt.code || env.Error.Message == "" || env.Error.Details == nil {
				t.Errorf("answer = %d %+v; want %d %s", resp.StatusCode, env.Error, tt.status, tt.code)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type = %q; want application/json", ct)
			}
			if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control = %q; want no-store", cc)
			}
			if id := resp.Header.Get(protocol.HeaderRequestID); !policy.ValidRequestID(id) {
				t.Errorf("X-Request-Id = %q; want a generated valid id", id)
			}
		})
	}
}

// rawExchange writes request on a fresh connection to addr, over TLS when
// useTLS, and reads one answer.
func rawExchange(t *testing.T, addr string, cfg *tls.Config, useTLS bool, request string) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if useTLS {
		tc := tls.Client(c, cfg.Clone())
		if err := tc.HandshakeContext(ctx); err != nil {
			t.Fatalf("TLS handshake: %v", err)
		}
		c = tc
	}
	// The server may answer before it has read all of a request it refuses;
	// the answer is read whatever happens to the rest of the write.
	go func() { _, _ = io.WriteString(c, request) }()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer's body: %v", err)
	}
	return resp, body
}
