package client_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/internal/logbuf"
	"github.com/sandgate/sandgate/protocol"
)

const testToken = "sgt_planted-token-7c1e"

// seen is one request as the fake broker received it.
type seen struct {
	Method string
	Path   string
	Query  string
	Header http.Header
	Body   []byte
}

// broker is a fake broker that answers with h and records every request.
type broker struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []seen
}

// requests returns a copy of what the broker received so far.
func (b *broker) requests() []seen {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]seen(nil), b.reqs...)
}

// startBroker starts a TLS fake broker; h gets the 1-based number of the
// request.
func startBroker(tb testing.TB, h func(w http.ResponseWriter, r *http.Request, n int)) *broker {
	tb.Helper()
	b := &broker{}
	b.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		b.mu.Lock()
		b.reqs = append(b.reqs, seen{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Clone(), body})
		n := len(b.reqs)
		b.mu.Unlock()
		h(w, r, n)
	}))
	tb.Cleanup(b.Close)
	return b
}

// segment returns the i-th segment of r's path: 3 is the workspace id of
// /v1/workspaces/{id}/…, 5 a command identity.
func segment(r *http.Request, i int) string {
	parts := strings.Split(r.URL.Path, "/")
	if i < len(parts) {
		return parts[i]
	}
	return ""
}

// pool trusts the fake broker's certificate.
func pool(ts *httptest.Server) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ts.Certificate())
	return p
}

// waits records the client's backoff waits instead of spending them.
type waits struct {
	mu sync.Mutex
	d  []time.Duration
}

func (w *waits) sleep(ctx context.Context, d time.Duration) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.d = append(w.d, d)
	return ctx.Err()
}

func (w *waits) all() []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]time.Duration(nil), w.d...)
}

// newClient returns a client of b whose waits are recorded, not spent.
func newClient(tb testing.TB, b *broker, edit func(*client.Config)) (*client.Client, *waits) {
	tb.Helper()
	cfg := client.Config{
		Endpoint:    b.URL,
		Token:       testToken,
		RootCAs:     pool(b.Server),
		BaseBackoff: time.Millisecond,
	}
	if edit != nil {
		edit(&cfg)
	}
	c, err := client.New(cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	w := &waits{}
	client.SetSleep(c, w.sleep)
	return c, w
}

// envelope writes the protocol error envelope.
func envelope(w http.ResponseWriter, status int, code protocol.Code, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(protocol.Envelope{Error: protocol.EnvelopeError{
		Code: code, Message: msg, Retryable: code.Retryable(), Details: map[string]any{"reason": "test"},
	}})
}

// reply writes v as JSON with status.
func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// asError returns the *client.Error in err, failing the test without one.
func asError(tb testing.TB, err error) *client.Error {
	tb.Helper()
	var e *client.Error
	if !errors.As(err, &e) {
		tb.Fatalf("err = %v; want a *client.Error", err)
	}
	return e
}

var egress = &protocol.Egress{AllowedDomains: []string{}}

func TestNewEndpoint(t *testing.T) {
	tests := []struct {
		endpoint string
		ok       bool
	}{
		{"https://broker.example.com", true},
		{"https://broker.example.com/", true},
		{"https://broker.example.com:8443/prefix/", true},
		{"HTTPS://broker.example.com", true},
		{"http://broker.example.com", false},
		{"ftp://broker.example.com", false},
		{"broker.example.com", false},
		{"", false},
		{"https://", false},
		{"https://:443", false},
		{"https:opaque", false},
		{"https://user:hunter2@broker.example.com", false},
		{"https://user@broker.example.com", false},
		{"https://broker.example.com/?a=1", false},
		{"https://broker.example.com?", false},
		{"https://broker.example.com/#frag", false},
		{"https://broker.example.com#", false},
	}
	for _, tt := range tests {
		t.Run(tt.endpoint, func(t *testing.T) {
			_, err := client.New(client.Config{Endpoint: tt.endpoint, Token: testToken})
			if (err == nil) != tt.ok {
				t.Fatalf("New(%q) err = %v; want ok %v", tt.endpoint, err, tt.ok)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("New(%q) err = %q; quotes the password", tt.endpoint, err)
			}
		})
	}
}

func TestNewToken(t *testing.T) {
	for _, tok := range []sandgate.Secret{"", "  \n\t", "a\x00b"} {
		if _, err := client.New(client.Config{Endpoint: "https://b.example", Token: tok}); err == nil {
			t.Errorf("New(token %q) err = nil; want an error", string(tok))
		}
	}
	if _, err := client.New(client.Config{Endpoint: "https://b.example", Token: " tok \n"}); err != nil {
		t.Errorf("New(padded token) err = %v; want nil", err)
	}
}

func TestPathPrefix(t *testing.T) {
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		reply(w, http.StatusOK, protocol.LeaseResponse{})
	})
	c, _ := newClient(t, b, func(cfg *client.Config) { cfg.Endpoint = b.URL + "/broker/" })
	if _, err := c.Lease(t.Context()); err != nil {
		t.Fatalf("Lease: %v", err)
	}
	if got := b.requests()[0].Path; got != "/broker/v1/lease" {
		t.Errorf("path = %q; want /broker/v1/lease", got)
	}
}

func TestNoRedirect(t *testing.T) {
	other := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		reply(w, http.StatusOK, protocol.LeaseResponse{})
	})
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		http.Redirect(w, r, other.URL+r.URL.Path, http.StatusTemporaryRedirect)
	})
	c, w := newClient(t, b, func(cfg *client.Config) {
		// Trust both hosts, so that only the redirect policy stops the hop.
		p := pool(b.Server)
		p.AddCert(other.Certificate())
		cfg.RootCAs = p
	})
	_, err := c.Lease(t.Context())
	if e := asError(t, err); e.Status != http.StatusTemporaryRedirect || e.Code != "" {
		t.Errorf("Lease err = %v; want status 307 and no code", e)
	}
	if n := len(other.requests()); n != 0 {
		t.Errorf("second host got %d requests; want 0", n)
	}
	if n := len(b.requests()); n != 1 || len(w.all()) != 0 {
		t.Errorf("first host got %d requests, %d waits; want 1 request, no retry", n, len(w.all()))
	}
}

func TestTokenOnlyInHeader(t *testing.T) {
	const planted = "planted-contents-91f3"
	const plantedPath = "/planted/path-5d2a"
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/files/write"):
			w.WriteHeader(http.StatusNoContent)
		case strings.HasSuffix(r.URL.Path, "/files/read"):
			w.Header().Set(protocol.HeaderRequestID, "broker-req-1")
			envelope(w, http.StatusNotFound, protocol.FileNotFound, "No such file.")
		default:
			http.NotFound(w, r)
		}
	})
	logs := &logbuf.Buffer{}
	c, _ := newClient(t, b, func(cfg *client.Config) {
		cfg.Token = sandgate.Secret("  " + testToken + "\n")
		cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	if err := c.WriteFile(t.Context(), "ws_1", plantedPath, []byte(planted)); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	_, err := c.ReadFile(t.Context(), "ws_1", plantedPath)
	if err == nil {
		t.Fatal("ReadFile err = nil; want file_not_found")
	}
	for _, r := range b.requests() {
		if got := r.Header.Get("Authorization"); got != "Bearer "+testToken {
			t.Errorf("%s %s Authorization = %q; want the trimmed bearer token", r.Method, r.Path, got)
		}
		for name, vals := range r.Header {
			if name == "Authorization" {
				continue
			}
			if strings.Contains(strings.Join(vals, " "), testToken) {
				t.Errorf("header %s carries the token", name)
			}
		}
		if strings.Contains(r.Path+r.Query, testToken) || bytes.Contains(r.Body, []byte(testToken)) {
			t.Errorf("%s %s carries the token outside the Authorization header", r.Method, r.Path)
		}
	}
	for _, s := range []string{testToken, planted, base64.StdEncoding.EncodeToString([]byte(planted)), plantedPath} {
		if strings.Contains(logs.String(), s) {
			t.Errorf("logs contain %q:\n%s", s, logs)
		}
		if strings.Contains(err.Error(), s) {
			t.Errorf("error %q contains %q", err, s)
		}
	}
	// The logs name the route template and the broker's request id.
	for _, s := range []string{"/v1/workspaces/{id}/files/read", "broker-req-1", "file_not_found"} {
		if !strings.Contains(logs.String(), s) {
			t.Errorf("logs lack %q:\n%s", s, logs)
		}
	}
}

var requestIDGrammar = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

func TestAcquireRetriesWithSameKey(t *testing.T) {
	ws := protocol.Workspace{WorkspaceID: "ws_1", State: "running"}
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		switch n {
		case 1:
			envelope(w, http.StatusServiceUnavailable, protocol.AdmissionUnavailable, "Try again.")
		case 2:
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, "<html>bad gateway</html>")
		case 3:
			envelope(w, http.StatusConflict, protocol.IdempotencyInProgress, "Still running.")
		default:
			reply(w, http.StatusCreated, ws)
		}
	})
	c, w := newClient(t, b, func(cfg *client.Config) { cfg.BaseBackoff = 10 * time.Millisecond })
	got, created, err := c.Acquire(t.Context(), "acq-key:1", protocol.AcquireRequest{Label: "l", Egress: egress})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if got.WorkspaceID != "ws_1" || !created {
		t.Errorf("Acquire = %q, created %v; want ws_1, true", got.WorkspaceID, created)
	}
	reqs := b.requests()
	if len(reqs) != 4 {
		t.Fatalf("broker got %d requests; want 4", len(reqs))
	}
	for i, r := range reqs {
		if got := r.Header.Get(protocol.HeaderIdempotencyKey); got != "acq-key:1" {
			t.Errorf("attempt %d Idempotency-Key = %q; want acq-key:1", i+1, got)
		}
		id := r.Header.Get(protocol.HeaderRequestID)
		if !requestIDGrammar.MatchString(id) || id != reqs[0].Header.Get(protocol.HeaderRequestID) {
			t.Errorf("attempt %d X-Request-Id = %q; want one valid id for the whole call", i+1, id)
		}
		if !bytes.Equal(r.Body, reqs[0].Body) {
			t.Errorf("attempt %d body differs from the first", i+1)
		}
	}
	// Exponential backoff from BaseBackoff, with at most half again as jitter.
	d := w.all()
	if len(d) != 3 {
		t.Fatalf("waits = %v; want 3", d)
	}
	for i, base := range []time.Duration{10, 20, 40} {
		base *= time.Millisecond
		if d[i] < base || d[i] > base+base/2 {
			t.Errorf("wait %d = %v; want in [%v, %v]", i+1, d[i], base, base+base/2)
		}
	}

	// The spec's replay answer is 200: not created by this call.
	b2 := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) { reply(w, http.StatusOK, ws) })
	c2, _ := newClient(t, b2, nil)
	if _, created, err := c2.Acquire(t.Context(), "k", protocol.AcquireRequest{Label: "l", Egress: egress}); err != nil || created {
		t.Errorf("Acquire replay created = %v, err = %v; want false, nil", created, err)
	}
	if _, _, err := c2.Acquire(t.Context(), "", protocol.AcquireRequest{}); err == nil {
		t.Error("Acquire without a key err = nil; want an error")
	}
}

func TestAcquireDropsAttributionOn400(t *testing.T) {
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			envelope(w, http.StatusBadRequest, protocol.InvalidRequest, "Unknown field agent.")
			return
		}
		reply(w, http.StatusCreated, protocol.Workspace{WorkspaceID: "ws_1"})
	})
	c, _ := newClient(t, b, nil)
	_, _, err := c.Acquire(t.Context(), "k", protocol.AcquireRequest{Label: "l", Egress: egress, Agent: "bot", RunID: "r"})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	reqs := b.requests()
	if len(reqs) != 2 {
		t.Fatalf("broker got %d requests; want 2", len(reqs))
	}
	var second map[string]any
	if err := json.Unmarshal(reqs[1].Body, &second); err != nil {
		t.Fatal(err)
	}
	if _, ok := second["agent"]; ok {
		t.Errorf("second body = %s; want no agent", reqs[1].Body)
	}
	if _, ok := second["run_id"]; ok {
		t.Errorf("second body = %s; want no run_id", reqs[1].Body)
	}
	if got := reqs[1].Header.Get(protocol.HeaderIdempotencyKey); got != "k" {
		t.Errorf("second Idempotency-Key = %q; want k", got)
	}
}

func TestExecNotRetried(t *testing.T) {
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		envelope(w, http.StatusBadGateway, protocol.UpstreamError, "Provider failed.")
	})
	c, w := newClient(t, b, nil)
	_, err := c.Exec(t.Context(), "ws_1", protocol.ExecRequest{Argv: []string{"true"}, TimeoutSeconds: 5})
	if got := client.CodeOf(err); got != protocol.UpstreamError {
		t.Errorf("Exec code = %q; want upstream_error", got)
	}
	if n := len(b.requests()); n != 1 || len(w.all()) != 0 {
		t.Errorf("Exec sent %d requests; want 1", n)
	}
	if errors.Is(err, client.ErrOutcomeUnknown) {
		t.Errorf("Exec err = %v; an answered 502 is not a transport error", err)
	}
}

func TestExecTransportErrorOutcomeUnknown(t *testing.T) {
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		// Drop the connection without an answer.
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	})
	c, w := newClient(t, b, nil)
	_, err := c.Exec(t.Context(), "ws_1", protocol.ExecRequest{Argv: []string{"true"}, TimeoutSeconds: 5})
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Errorf("Exec err = %v; want ErrOutcomeUnknown", err)
	}
	if n := len(b.requests()); n != 1 || len(w.all()) != 0 {
		t.Errorf("Exec sent %d requests; want 1", n)
	}

	// The same failure on an idempotent call is retried up to MaxAttempts.
	c3, w3 := newClient(t, b, func(cfg *client.Config) { cfg.MaxAttempts = 3 })
	before := len(b.requests())
	if _, err := c3.Workspace(t.Context(), "ws_1"); err == nil || client.CodeOf(err) != "" {
		t.Errorf("Workspace err = %v; want a transport error", err)
	}
	if n := len(b.requests()) - before; n != 3 || len(w3.all()) != 2 {
		t.Errorf("Workspace sent %d requests, waited %d times; want 3 and 2", n, len(w3.all()))
	}
}

func TestNotRetriedRefusals(t *testing.T) {
	tests := []struct {
		status int
		code   protocol.Code
	}{
		{http.StatusTooManyRequests, protocol.ConcurrencyLimit},
		{http.StatusTooManyRequests, protocol.RiskLimit},
		{http.StatusConflict, protocol.IdempotencyConflict},
		{http.StatusPaymentRequired, protocol.InsufficientFunds},
		{http.StatusInternalServerError, protocol.Internal},
	}
	for _, tt := range tests {
		t.Run(string(tt.code), func(t *testing.T) {
			b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
				w.Header().Set(protocol.HeaderRetryAfter, "1")
				envelope(w, tt.status, tt.code, "No.")
			})
			c, w := newClient(t, b, nil)
			_, _, err := c.Acquire(t.Context(), "k", protocol.AcquireRequest{Label: "l", Egress: egress})
			e := asError(t, err)
			if e.Status != tt.status || e.Code != tt.code || e.RetryAfter != time.Second {
				t.Errorf("Acquire err = %+v; want %d %s, Retry-After 1s", e, tt.status, tt.code)
			}
			if n := len(b.requests()); n != 1 || len(w.all()) != 0 {
				t.Errorf("Acquire sent %d requests; want 1", n)
			}
		})
	}
}

func TestRetryAfterHonoured(t *testing.T) {
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.Header().Set(protocol.HeaderRetryAfter, "2")
			envelope(w, http.StatusTooManyRequests, protocol.RateLimited, "Slow down.")
			return
		}
		reply(w, http.StatusOK, protocol.Workspace{WorkspaceID: "ws_1"})
	})
	c, w := newClient(t, b, nil)
	if _, err := c.Workspace(t.Context(), "ws_1"); err != nil {
		t.Fatalf("Workspace: %v", err)
	}
	if got := w.all(); len(got) != 1 || got[0] != 2*time.Second {
		t.Errorf("waits = %v; want [2s], the Retry-After over a 1ms backoff", got)
	}

	// A Retry-After far past what the client waits out by itself ends the
	// call, and the caller reads it from the error.
	b2 := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set(protocol.HeaderRetryAfter, "3600")
		envelope(w, http.StatusServiceUnavailable, protocol.Unavailable, "Draining.")
	})
	c2, w2 := newClient(t, b2, nil)
	_, err := c2.Workspace(t.Context(), "ws_1")
	if e := asError(t, err); e.RetryAfter != time.Hour {
		t.Errorf("RetryAfter = %v; want 1h", e.RetryAfter)
	}
	if n := len(b2.requests()); n != 1 || len(w2.all()) != 0 {
		t.Errorf("Workspace sent %d requests; want 1", n)
	}
}

func TestMaxAttempts(t *testing.T) {
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		envelope(w, http.StatusServiceUnavailable, protocol.AdmissionUnavailable, "Fail closed.")
	})
	c, w := newClient(t, b, nil)
	_, _, err := c.Snapshot(t.Context(), "ws_1", "snap-key", "/work")
	if got := client.CodeOf(err); got != protocol.AdmissionUnavailable {
		t.Errorf("Snapshot code = %q; want admission_unavailable", got)
	}
	if n := len(b.requests()); n != client.DefaultMaxAttempts || len(w.all()) != client.DefaultMaxAttempts-1 {
		t.Errorf("Snapshot sent %d requests, waited %d times; want %d and %d",
			n, len(w.all()), client.DefaultMaxAttempts, client.DefaultMaxAttempts-1)
	}
	for _, r := range b.requests() {
		if got := r.Header.Get(protocol.HeaderIdempotencyKey); got != "snap-key" {
			t.Errorf("Idempotency-Key = %q; want snap-key", got)
		}
	}
}

func TestContextCancelStopsRetries(t *testing.T) {
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		envelope(w, http.StatusServiceUnavailable, protocol.Unavailable, "Draining.")
	})
	c, _ := newClient(t, b, nil)
	ctx, cancel := context.WithCancel(t.Context())
	client.SetSleep(c, func(context.Context, time.Duration) error { cancel(); return context.Canceled })
	_, err := c.Lease(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Lease err = %v; want context.Canceled", err)
	}
	if n := len(b.requests()); n != 1 {
		t.Errorf("Lease sent %d requests; want 1", n)
	}
}

func TestReadFile(t *testing.T) {
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		switch segment(r, 3) {
		case "ws_missing":
			envelope(w, http.StatusNotFound, protocol.NotFound, "No such workspace.")
		case "ws_nofile":
			envelope(w, http.StatusNotFound, protocol.FileNotFound, "No such file.")
		default:
			reply(w, http.StatusOK, protocol.ReadFileResponse{ContentsB64: base64.StdEncoding.EncodeToString([]byte("hi\n")), SizeBytes: 3})
		}
	})
	c, _ := newClient(t, b, nil)

	_, err := c.ReadFile(t.Context(), "ws_nofile", "/nope")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadFile(missing file) err = %v; want fs.ErrNotExist", err)
	}
	_, err = c.ReadFile(t.Context(), "ws_missing", "/x")
	if errors.Is(err, fs.ErrNotExist) || client.CodeOf(err) != protocol.NotFound {
		t.Errorf("ReadFile(missing workspace) err = %v; want not_found, not fs.ErrNotExist", err)
	}
	got, err := c.ReadFile(t.Context(), "ws_1", "/etc/hostname")
	if err != nil || string(got) != "hi\n" {
		t.Errorf("ReadFile = %q, %v; want \"hi\\n\", nil", got, err)
	}
	last := b.requests()[len(b.requests())-1]
	var req protocol.ReadFileRequest
	if err := json.Unmarshal(last.Body, &req); err != nil || req.Path != "/etc/hostname" {
		t.Errorf("ReadFile body = %s; want the path in the body", last.Body)
	}
	if ct := last.Header.Get("Content-Type"); ct != "application/json; charset=utf-8" {
		t.Errorf("Content-Type = %q; want application/json; charset=utf-8", ct)
	}
}

func TestRelease(t *testing.T) {
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		switch strings.TrimPrefix(r.URL.Path, "/v1/workspaces/") {
		case "ws_gone":
			envelope(w, http.StatusNotFound, protocol.NotFound, "No such workspace.")
		case "ws_proxy":
			http.NotFound(w, r) // not the envelope: a wrong endpoint, not a release
		default:
			reply(w, http.StatusOK, protocol.Workspace{WorkspaceID: "ws_1", State: "terminated"})
		}
	})
	c, _ := newClient(t, b, nil)
	if ws, err := c.Release(t.Context(), "ws_gone"); ws != nil || err != nil {
		t.Errorf("Release(404 not_found) = %v, %v; want nil, nil", ws, err)
	}
	if _, err := c.Release(t.Context(), "ws_proxy"); err == nil {
		t.Error("Release(404 without envelope) err = nil; want an error")
	}
	ws, err := c.Release(t.Context(), "ws_1")
	if err != nil || ws.State != "terminated" {
		t.Errorf("Release = %+v, %v; want terminated", ws, err)
	}
	if m := b.requests()[0].Method; m != http.MethodDelete {
		t.Errorf("Release method = %s; want DELETE", m)
	}
	for _, id := range []string{"", ".", ".."} {
		if _, err := c.Release(t.Context(), id); err == nil {
			t.Errorf("Release(%q) err = nil; want an error", id)
		}
	}
}

func TestDeleteSnapshot(t *testing.T) {
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if strings.HasSuffix(r.URL.Path, "/snap_gone") {
			envelope(w, http.StatusNotFound, protocol.NotFound, "No such snapshot.")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	c, _ := newClient(t, b, nil)
	for _, id := range []string{"snap_1", "snap_gone"} {
		if err := c.DeleteSnapshot(t.Context(), id); err != nil {
			t.Errorf("DeleteSnapshot(%s) = %v; want nil", id, err)
		}
	}
	if p := b.requests()[0].Path; p != "/v1/snapshots/snap_1" {
		t.Errorf("DeleteSnapshot path = %q; want /v1/snapshots/snap_1", p)
	}
}

func TestErrorEnvelope(t *testing.T) {
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set(protocol.HeaderRequestID, "req-from-broker")
		envelope(w, http.StatusPaymentRequired, protocol.InsufficientFunds, "Add funds to resume execution.")
	})
	c, _ := newClient(t, b, nil)
	_, _, err := c.Acquire(t.Context(), "k", protocol.AcquireRequest{Label: "l", Egress: egress})
	e := asError(t, err)
	if e.Status != 402 || e.Code != protocol.InsufficientFunds || e.Message != "Add funds to resume execution." ||
		e.Retryable || e.Details["reason"] != "test" || e.RequestID != "req-from-broker" {
		t.Errorf("Error = %+v; want the envelope's fields", e)
	}
	for _, s := range []string{"402", "insufficient_funds", "Add funds", "req-from-broker"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("Error() = %q; want it to contain %q", err, s)
		}
	}
}

func TestNonEnvelopeError(t *testing.T) {
	const page = "<html><body>secret upstream diagnostics</body></html>"
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, page)
	})
	c, _ := newClient(t, b, func(cfg *client.Config) { cfg.MaxAttempts = 2 })
	_, err := c.Lease(t.Context())
	e := asError(t, err)
	if e.Status != http.StatusBadGateway || e.Code != "" || e.Message != "" || !e.Retryable {
		t.Errorf("Error = %+v; want status 502, no code, no message, retryable", e)
	}
	if client.CodeOf(err) != "" {
		t.Errorf("CodeOf = %q; want \"\"", client.CodeOf(err))
	}
	if strings.Contains(err.Error(), "secret") || !strings.Contains(err.Error(), "502") {
		t.Errorf("Error() = %q; want the status and none of the body", err)
	}
	// No X-Request-Id came back: the error carries the one the client sent.
	if sent := b.requests()[1].Header.Get(protocol.HeaderRequestID); e.RequestID != sent || sent == "" {
		t.Errorf("RequestID = %q; want the sent %q", e.RequestID, sent)
	}
	if n := len(b.requests()); n != 2 {
		t.Errorf("Lease sent %d requests; want 2 (502 is retried)", n)
	}
}

// deadlines records each request's context deadline, as seen by the transport.
type deadlines struct {
	base http.RoundTripper
	mu   sync.Mutex
	left map[string][]time.Duration // by path
}

func (d *deadlines) RoundTrip(r *http.Request) (*http.Response, error) {
	dl, ok := r.Context().Deadline()
	d.mu.Lock()
	if ok {
		d.left[r.URL.Path] = append(d.left[r.URL.Path], time.Until(dl))
	}
	d.mu.Unlock()
	return d.base.RoundTrip(r)
}

func TestExecTimeoutFromLease(t *testing.T) {
	const def = 600 // seconds; far above the 60s of other calls
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.URL.Path == "/v1/lease" {
			reply(w, http.StatusOK, protocol.LeaseResponse{Limits: protocol.Limits{DefaultExecTimeoutSeconds: def}})
			return
		}
		reply(w, http.StatusOK, protocol.ExecResponse{ExitCode: 3, StdoutB64: "aGk="})
	})
	rec := &deadlines{base: b.Client().Transport, left: map[string][]time.Duration{}}
	c, _ := newClient(t, b, func(cfg *client.Config) { cfg.HTTPClient = &http.Client{Transport: rec} })

	for range 2 {
		res, err := c.Exec(t.Context(), "ws_1", protocol.ExecRequest{Argv: []string{"sh", "-c", "exit 3"}})
		if err != nil || res.ExitCode != 3 {
			t.Fatalf("Exec = %+v, %v; want exit code 3", res, err)
		}
	}
	if _, err := c.Exec(t.Context(), "ws_1", protocol.ExecRequest{Argv: []string{"true"}, TimeoutSeconds: 900}); err != nil {
		t.Fatalf("Exec: %v", err)
	}

	rec.mu.Lock()
	defer rec.mu.Unlock()
	if n := len(rec.left["/v1/lease"]); n != 1 {
		t.Errorf("lease read %d times; want once, then cached", n)
	}
	if l := rec.left["/v1/lease"]; len(l) == 1 && l[0] > client.DefaultTimeout {
		t.Errorf("lease deadline in %v; want at most %v", l[0], client.DefaultTimeout)
	}
	// The bounds are the timeouts themselves: an exec's deadline is past
	// the lease default yet no later than default + 30s.
	want := []struct{ lo, hi time.Duration }{
		{def * time.Second, (def + 30) * time.Second},
		{def * time.Second, (def + 30) * time.Second},
		{900 * time.Second, 930 * time.Second},
	}
	got := rec.left["/v1/workspaces/ws_1/exec"]
	if len(got) != len(want) {
		t.Fatalf("exec deadlines = %v; want %d", got, len(want))
	}
	for i, w := range want {
		if got[i] <= w.lo || got[i] > w.hi {
			t.Errorf("exec %d deadline in %v; want in (%v, %v]", i+1, got[i], w.lo, w.hi)
		}
	}
}

func TestTLS12Required(t *testing.T) {
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, protocol.LeaseResponse{})
	}))
	// The server must offer TLS 1.0 and 1.1 itself: Go servers refuse them
	// by default, which would pass this test whatever the client does.
	ts.TLS = &tls.Config{MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}
	ts.Config.ErrorLog = log.New(io.Discard, "", 0)
	ts.StartTLS()
	t.Cleanup(ts.Close)
	// Even a caller's transport that allows TLS 1.0 is raised to 1.2.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS10, RootCAs: pool(ts)}}}
	c, err := client.New(client.Config{Endpoint: ts.URL, Token: testToken, HTTPClient: hc, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lease(t.Context()); err == nil {
		t.Error("Lease over TLS 1.1 err = nil; want a handshake error")
	}
}

func TestCommands(t *testing.T) {
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		switch {
		case r.Method == http.MethodPut && segment(r, 5) == "bad":
			envelope(w, http.StatusUnprocessableEntity, protocol.CommandNotStarted, "Preflight failed.")
		case r.Method == http.MethodPut && segment(r, 5) == "flaky":
			envelope(w, http.StatusServiceUnavailable, protocol.Unavailable, "Draining.")
		case r.Method == http.MethodPut:
			reply(w, http.StatusAccepted, protocol.CommandStatus{State: protocol.CommandStarting})
		case r.Method == http.MethodPost:
			w.WriteHeader(http.StatusAccepted)
		case segment(r, 3) == "ws_gone":
			envelope(w, http.StatusGone, protocol.WorkspaceGone, "Gone.")
		default:
			code := 7
			reply(w, http.StatusOK, protocol.CommandStatus{State: protocol.CommandCompleted, ExitCode: &code})
		}
	})
	c, w := newClient(t, b, nil)
	ctx := t.Context()
	req := protocol.ExecRequest{Argv: []string{"make"}}

	st, launched, err := c.StartCommand(ctx, "ws_1", "call:1", req)
	if err != nil || !launched || st.State != protocol.CommandStarting {
		t.Errorf("StartCommand = %+v, %v, %v; want starting, launched", st, launched, err)
	}
	if _, _, err := c.StartCommand(ctx, "ws_1", "bad", req); !errors.Is(err, client.ErrCommandNotStarted) {
		t.Errorf("StartCommand(422) err = %v; want ErrCommandNotStarted", err)
	}
	before := len(b.requests())
	if _, _, err := c.StartCommand(ctx, "ws_1", "flaky", req); client.CodeOf(err) != protocol.Unavailable {
		t.Errorf("StartCommand(503) err = %v; want unavailable", err)
	}
	if n := len(b.requests()) - before; n != 1 || len(w.all()) != 0 {
		t.Errorf("StartCommand(503) sent %d requests; want 1, never retried", n)
	}
	st, err = c.ReadCommand(ctx, "ws_1", "call:1")
	if err != nil || st.State != protocol.CommandCompleted || st.ExitCode == nil || *st.ExitCode != 7 {
		t.Errorf("ReadCommand = %+v, %v; want completed with exit code 7", st, err)
	}
	st, err = c.ReadCommand(ctx, "ws_gone", "call:1")
	if err != nil || st.State != protocol.CommandUnknown {
		t.Errorf("ReadCommand(410) = %+v, %v; want state unknown, nil", st, err)
	}
	if err := c.CancelCommand(ctx, "ws_1", "call:1"); err != nil {
		t.Errorf("CancelCommand: %v", err)
	}
	last := b.requests()[len(b.requests())-1]
	if last.Method != http.MethodPost || last.Path != "/v1/workspaces/ws_1/commands/call:1/cancel" {
		t.Errorf("CancelCommand sent %s %s", last.Method, last.Path)
	}
}

func TestSnapshot(t *testing.T) {
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			envelope(w, http.StatusBadGateway, protocol.UpstreamError, "Provider failed.")
			return
		}
		reply(w, http.StatusCreated, protocol.Snapshot{SnapshotID: "snap_1", ExpiresAt: "2026-10-27T21:04:05Z"})
	})
	c, _ := newClient(t, b, nil)
	snap, created, err := c.Snapshot(t.Context(), "ws_1", "nonce-1", "/work/repo")
	if err != nil || !created || snap.SnapshotID != "snap_1" {
		t.Fatalf("Snapshot = %+v, %v, %v; want snap_1 created", snap, created, err)
	}
	reqs := b.requests()
	if len(reqs) != 2 || reqs[1].Header.Get(protocol.HeaderIdempotencyKey) != "nonce-1" ||
		string(reqs[1].Body) != `{"dir":"/work/repo"}` {
		t.Errorf("Snapshot requests = %d, last key %q body %s", len(reqs),
			reqs[len(reqs)-1].Header.Get(protocol.HeaderIdempotencyKey), reqs[len(reqs)-1].Body)
	}
}

func TestListWorkspaces(t *testing.T) {
	next := "c2"
	b := startBroker(t, func(w http.ResponseWriter, r *http.Request, n int) {
		reply(w, http.StatusOK, protocol.WorkspaceList{Workspaces: []protocol.Workspace{{WorkspaceID: "ws_1"}}, NextCursor: &next})
	})
	c, _ := newClient(t, b, nil)
	l, err := c.ListWorkspaces(t.Context(), "all", "c1/+", 10)
	if err != nil || len(l.Workspaces) != 1 || l.NextCursor == nil || *l.NextCursor != "c2" {
		t.Fatalf("ListWorkspaces = %+v, %v", l, err)
	}
	if got, want := b.requests()[0].Query, "cursor=c1%2F%2B&limit=10&state=all"; got != want {
		t.Errorf("query = %q; want %q", got, want)
	}
	if _, err := c.ListWorkspaces(t.Context(), "", "", 0); err != nil {
		t.Fatal(err)
	}
	if got := b.requests()[1].Query; got != "" {
		t.Errorf("query = %q; want none", got)
	}
}
