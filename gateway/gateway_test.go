package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/token"
)

// reply is one raw answer of the gateway.
type reply struct {
	Status int
	Header http.Header
	Body   []byte
}

// request is one raw request. Body is sent as is when it is a string,
// []byte or io.Reader, and as JSON otherwise; nil sends no body.
type request struct {
	Method string
	Path   string
	Token  sandgate.Secret // "" sends no Authorization header
	Body   any
	Header map[string]string // extra headers; "Authorization" overrides Token
	Plain  bool              // send to the plaintext server over the same handler
}

// send makes one raw request. It is safe to call from any goroutine.
func send(h *sgtest.Harness, hc *http.Client, r request) (reply, error) {
	var body io.Reader
	switch b := r.Body.(type) {
	case nil:
	case string:
		body = strings.NewReader(b)
	case []byte:
		body = bytes.NewReader(b)
	case io.Reader:
		body = b
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			return reply{}, err
		}
		body = bytes.NewReader(raw)
	}
	base := h.URL()
	if r.Plain {
		base = h.PlainServer().URL
	}
	req, err := http.NewRequest(r.Method, base+r.Path, body)
	if err != nil {
		return reply{}, err
	}
	if r.Token != "" {
		req.Header.Set("Authorization", "Bearer "+r.Token.Reveal())
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json; charset=utf-8")
	}
	for k, v := range r.Header {
		req.Header.Set(k, v)
	}
	if hc == nil {
		hc = h.HTTPClient()
		if r.Plain {
			hc = h.PlainServer().Client()
			hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// do makes one raw request and fails the test on a transport error.
func do(t testing.TB, h *sgtest.Harness, r request) reply {
	t.Helper()
	rep, err := send(h, nil, r)
	if err != nil {
		t.Fatalf("%s %s: %v", r.Method, r.Path, err)
	}
	checkAnswer(t, r, rep)
	return rep
}

// what names a request in failure messages, without its body.
func what(r request) string { return r.Method + " " + r.Path }

// wantError checks that rep is the error envelope with status and code,
// and carries cache-control: no-store. It returns the envelope's error.
func wantError(t testing.TB, label string, rep reply, status int, code protocol.Code) protocol.EnvelopeError {
	t.Helper()
	if got := rep.Header.Get("Cache-Control"); got != "no-store" {
		t.Errorf("%s: Cache-Control = %q; want %q", label, got, "no-store")
	}
	if rep.Status != status {
		t.Errorf("%s: status = %d; want %d (body %s)", label, rep.Status, status, rep.Body)
		if rep.Status < 400 {
			return protocol.EnvelopeError{}
		}
	}
	var raw struct {
		Error map[string]json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(rep.Body, &raw); err != nil {
		t.Errorf("%s: body is not the error envelope: %v; body %s", label, err, rep.Body)
		return protocol.EnvelopeError{}
	}
	for _, k := range []string{"code", "message", "retryable", "details"} {
		if _, ok := raw.Error[k]; !ok {
			t.Errorf("%s: envelope has no error.%s; body %s", label, k, rep.Body)
		}
	}
	var env protocol.Envelope
	_ = json.Unmarshal(rep.Body, &env)
	if env.Error.Code != code {
		t.Errorf("%s: error.code = %q; want %q (message %q)", label, env.Error.Code, code, env.Error.Message)
	}
	if env.Error.Message == "" {
		t.Errorf("%s: error.message = \"\"; want a message", label)
	}
	if env.Error.Details == nil {
		t.Errorf("%s: error.details = null; want an object", label)
	}
	if want := code.Retryable(); env.Error.Retryable != want {
		t.Errorf("%s: error.retryable = %v; want %v", label, env.Error.Retryable, want)
	}
	return env.Error
}

// wantOK checks a 2xx answer's status and its cache-control: no-store, and
// decodes its body into out when out is non-nil.
func wantOK(t testing.TB, label string, rep reply, status int, out any) {
	t.Helper()
	if rep.Status != status {
		t.Fatalf("%s: status = %d; want %d (body %s)", label, rep.Status, status, rep.Body)
	}
	if got := rep.Header.Get("Cache-Control"); got != "no-store" {
		t.Errorf("%s: Cache-Control = %q; want %q", label, got, "no-store")
	}
	if out != nil {
		if err := json.Unmarshal(rep.Body, out); err != nil {
			t.Fatalf("%s: decode %s: %v", label, rep.Body, err)
		}
	}
}

// acquireBody is a valid Acquire with no network.
func acquireBody(label string) protocol.AcquireRequest {
	return protocol.AcquireRequest{Label: label, Egress: &protocol.Egress{AllowedDomains: []string{}}}
}

func acquireReq(tok sandgate.Secret, key string, body any) request {
	r := request{Method: http.MethodPost, Path: "/v1/workspaces", Token: tok, Body: body}
	if key != "" {
		r.Header = map[string]string{protocol.HeaderIdempotencyKey: key}
	}
	return r
}

// acquire creates a workspace and requires 201.
func acquire(t testing.TB, h *sgtest.Harness, tok sandgate.Secret, key string) protocol.Workspace {
	t.Helper()
	var ws protocol.Workspace
	wantOK(t, "acquire "+key, do(t, h, acquireReq(tok, key, acquireBody("test"))), http.StatusCreated, &ws)
	return ws
}

func wsPath(id string, rest ...string) string {
	return "/v1/workspaces/" + id + strings.Join(rest, "")
}

// getWorkspace reads a workspace's status and requires 200.
func getWorkspace(t testing.TB, h *sgtest.Harness, tok sandgate.Secret, id string) protocol.Workspace {
	t.Helper()
	var ws protocol.Workspace
	wantOK(t, "GET "+id, do(t, h, request{Method: http.MethodGet, Path: wsPath(id), Token: tok}), http.StatusOK, &ws)
	return ws
}

// release releases a workspace and requires 200.
func release(t testing.TB, h *sgtest.Harness, tok sandgate.Secret, id string) protocol.Workspace {
	t.Helper()
	var ws protocol.Workspace
	wantOK(t, "DELETE "+id, do(t, h, request{Method: http.MethodDelete, Path: wsPath(id), Token: tok}), http.StatusOK, &ws)
	return ws
}

// listAll returns every workspace of the token's instance (state=all).
func listAll(t testing.TB, h *sgtest.Harness, tok sandgate.Secret) []protocol.Workspace {
	t.Helper()
	var l protocol.WorkspaceList
	wantOK(t, "list", do(t, h, request{Method: http.MethodGet, Path: "/v1/workspaces?state=all&limit=100", Token: tok}), http.StatusOK, &l)
	return l.Workspaces
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func wire(t time.Time) string { return t.UTC().Truncate(time.Second).Format(time.RFC3339) }

func parseWire(t testing.TB, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatalf("time %q: %v", s, err)
	}
	return v
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// gate blocks provider hooks until it is opened; opening twice is safe, and
// the test's cleanup opens it so that no request stays blocked.
type gate struct {
	once sync.Once
	ch   chan struct{}
}

func newGate(t testing.TB) *gate {
	g := &gate{ch: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

func (g *gate) wait() { <-g.ch }

// startBlockedAcquire sends the acquire r in the background with the
// provider's create held by a gate, and returns once the create has begun:
// the gate, the id of the starting workspace, and where the acquire's reply
// will arrive once the gate opens. what names the acquire in failures.
func startBlockedAcquire(t testing.TB, h *sgtest.Harness, what string, r request) (g *gate, id string, done <-chan reply) {
	t.Helper()
	g = newGate(t)
	entered := make(chan string, 1)
	h.Provider.OnCreate(func(ctx context.Context, spec providers.CreateSpec) error {
		entered <- spec.WorkspaceID
		g.wait()
		return nil
	})
	first := make(chan reply, 1)
	go func() {
		rep, err := send(h, nil, r)
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
		first <- rep
	}()
	return g, <-entered, first
}

// wantState checks a workspace's state; when names the moment in failures.
func wantState(t testing.TB, h *sgtest.Harness, tok sandgate.Secret, id, when, want string) {
	t.Helper()
	if got := getWorkspace(t, h, tok, id).State; got != want {
		t.Errorf("workspace state %s = %q; want %q", when, got, want)
	}
}

// twoAccounts returns two instances of one account and one of another,
// made in that order, each with the default scope.
func twoAccounts(h *sgtest.Harness) (x, sibling, stranger sgtest.Instance) {
	x = h.NewInstance(adminapi.Scope{})
	sibling = h.NewInstanceIn(x.AccountID, adminapi.Scope{})
	return x, sibling, h.NewInstance(adminapi.Scope{})
}

// workspaceOps returns one request per workspace operation on id, with
// valid bodies.
func workspaceOps(tok sandgate.Secret, id string) []request {
	return []request{
		{Method: http.MethodGet, Path: wsPath(id), Token: tok},
		{Method: http.MethodPost, Path: wsPath(id, "/exec"), Token: tok, Body: map[string]any{"argv": []string{"true"}}},
		{Method: http.MethodPost, Path: wsPath(id, "/files/read"), Token: tok, Body: map[string]any{"path": "/workspace/a"}},
		{Method: http.MethodPost, Path: wsPath(id, "/files/write"), Token: tok, Body: map[string]any{"path": "/workspace/a", "contents_b64": b64("x")}},
		{Method: http.MethodDelete, Path: wsPath(id), Token: tok},
	}
}

// allEndpoints returns one request per /v1 route, with valid bodies.
func allEndpoints(tok sandgate.Secret, id string) []request {
	return append([]request{
		{Method: http.MethodGet, Path: "/v1/lease", Token: tok},
		acquireReq(tok, "auth-probe", acquireBody("probe")),
		{Method: http.MethodGet, Path: "/v1/workspaces", Token: tok},
	}, workspaceOps(tok, id)...)
}

func TestConventionsBody(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxConcurrentWorkspaces: 5}})
	ws := acquire(t, h, in.Token, "conv-ws")

	valid := `{"label":"a","egress":{"allowed_domains":[]}}`
	tests := []struct {
		name string
		path string
		body string
	}{
		{"acquire unknown field", "/v1/workspaces", `{"label":"a","egress":{"allowed_domains":[]},"labl":"x"}`},
		{"acquire nested unknown field", "/v1/workspaces", `{"label":"a","egress":{"allowed_domains":[],"deny":[]}}`},
		{"acquire malformed", "/v1/workspaces", `{"label":`},
		{"acquire not JSON", "/v1/workspaces", `label=a`},
		{"acquire trailing object", "/v1/workspaces", valid + ` {"label":"b"}`},
		{"acquire trailing garbage", "/v1/workspaces", valid + `garbage`},
		{"acquire wrong type", "/v1/workspaces", `{"label":5,"egress":{"allowed_domains":[]}}`},
		{"acquire array", "/v1/workspaces", `[]`},
		{"acquire empty body", "/v1/workspaces", ``},
		{"exec unknown field", wsPath(ws.WorkspaceID, "/exec"), `{"argv":["true"],"shell":true}`},
		{"exec malformed", wsPath(ws.WorkspaceID, "/exec"), `{"argv":["true"]`},
		{"exec trailing", wsPath(ws.WorkspaceID, "/exec"), `{"argv":["true"]}{}`},
		{"read unknown field", wsPath(ws.WorkspaceID, "/files/read"), `{"path":"/a","follow":true}`},
		{"read trailing", wsPath(ws.WorkspaceID, "/files/read"), `{"path":"/a"} 1`},
		{"write unknown field", wsPath(ws.WorkspaceID, "/files/write"), `{"path":"/a","contents_b64":"","mode":420}`},
		{"write wrong type", wsPath(ws.WorkspaceID, "/files/write"), `{"path":"/a","contents_b64":5}`},
		// encoding/json would turn each of these into U+FFFD.
		{"acquire invalid UTF-8", "/v1/workspaces", "{\"label\":\"a\xff\",\"egress\":{\"allowed_domains\":[]}}"},
		{"acquire invalid UTF-8 in a key", "/v1/workspaces", "{\"label\":\"a\",\"egress\":{\"allowed_domains\":[]},\"env\":{\"A\xc3\":\"1\"}}"},
		{"exec invalid UTF-8", wsPath(ws.WorkspaceID, "/exec"), "{\"argv\":[\"echo\",\"\xe2\x82\"]}"},
		{"exec lone high surrogate", wsPath(ws.WorkspaceID, "/exec"), `{"argv":["echo","\ud83d"]}`},
		{"exec lone low surrogate", wsPath(ws.WorkspaceID, "/exec"), `{"argv":["echo","\ude00x"]}`},
		{"exec high surrogate then a letter", wsPath(ws.WorkspaceID, "/exec"), `{"argv":["echo","\ud83d\u0041"]}`},
		{"write invalid UTF-8 path", wsPath(ws.WorkspaceID, "/files/write"), "{\"path\":\"/workspace/\xff\",\"contents_b64\":\"\"}"},
		{"read overlong UTF-8 path", wsPath(ws.WorkspaceID, "/files/read"), "{\"path\":\"/\xc0\xaf\"}"},
		// A null is not a string: encoding/json would leave "".
		{"acquire label null", "/v1/workspaces", `{"label":null,"egress":{"allowed_domains":[]}}`},
		{"exec argv element null", wsPath(ws.WorkspaceID, "/exec"), `{"argv":["echo",null]}`},
		{"exec timeout null", wsPath(ws.WorkspaceID, "/exec"), `{"argv":["true"],"timeout_seconds":null}`},
		{"write contents null", wsPath(ws.WorkspaceID, "/files/write"), `{"path":"/a","contents_b64":null}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := request{Method: http.MethodPost, Path: tt.path, Token: in.Token, Body: tt.body,
				Header: map[string]string{protocol.HeaderIdempotencyKey: "conv-key"}}
			wantError(t, tt.name, do(t, h, r), http.StatusBadRequest, protocol.InvalidRequest)
		})
	}
	if got := len(h.Provider.Execs()); got != 0 {
		t.Errorf("provider execs after refused bodies = %d; want 0", got)
	}
	// spec §Idempotency: a 400 consumes no key.
	wantOK(t, "acquire after refusals", do(t, h, acquireReq(in.Token, "conv-key", valid)), http.StatusCreated, nil)
	// Whitespace after the object is not trailing data.
	wantOK(t, "acquire with trailing newline", do(t, h, acquireReq(in.Token, "conv-key-2", valid+"\n\t ")), http.StatusCreated, nil)
}

func TestBodyLimit(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{})

	// A Content-Length over the limit is refused before the body is sent:
	// the request goes out as headers alone, and the answer must come.
	conn, err := tls.Dial("tcp", h.Server.Listener.Addr().String(), &tls.Config{RootCAs: h.CertPool(), MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/workspaces HTTP/1.1\r\nHost: sandgate\r\nAuthorization: Bearer %s\r\n"+
		"Idempotency-Key: big\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		in.Token.Reveal(), protocol.MaxBodyBytes+1)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("read answer to a Content-Length over 12 MiB: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantError(t, "acquire with Content-Length over 12 MiB", reply{resp.StatusCode, resp.Header, b}, http.StatusRequestEntityTooLarge, protocol.PayloadTooLarge)

	// Without a Content-Length the limit is found while reading.
	over := "x" + strings.Repeat(" ", protocol.MaxBodyBytes)
	rep := do(t, h, request{Method: http.MethodPost, Path: "/v1/workspaces", Token: in.Token,
		Body:   io.MultiReader(strings.NewReader(over)),
		Header: map[string]string{protocol.HeaderIdempotencyKey: "big"}})
	wantError(t, "chunked acquire over 12 MiB", rep, http.StatusRequestEntityTooLarge, protocol.PayloadTooLarge)

	// Exactly 12 MiB is read whole: this body then fails as JSON, not as size.
	rep = do(t, h, request{Method: http.MethodPost, Path: "/v1/workspaces", Token: in.Token, Body: over[:protocol.MaxBodyBytes],
		Header: map[string]string{protocol.HeaderIdempotencyKey: "big"}})
	wantError(t, "acquire of exactly 12 MiB", rep, http.StatusBadRequest, protocol.InvalidRequest)

	if ws := listAll(t, h, in.Token); len(ws) != 0 {
		t.Errorf("workspaces after 413 = %d; want 0", len(ws))
	}
	// The 413s consumed no key.
	wantOK(t, "acquire after 413", do(t, h, acquireReq(in.Token, "big", acquireBody("big"))), http.StatusCreated, nil)
}

func TestUnknownRoute(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{})
	ws := acquire(t, h, in.Token, "route-ws")

	tests := []request{
		{Method: http.MethodGet, Path: "/"},
		{Method: http.MethodGet, Path: "/v2/lease", Token: in.Token},
		{Method: http.MethodGet, Path: "/healthz"},
		{Method: http.MethodGet, Path: "/v1/nope", Token: in.Token},
		{Method: http.MethodGet, Path: "/v1/lease/", Token: in.Token},
		{Method: http.MethodGet, Path: "/v1/lease/x", Token: in.Token},
		{Method: http.MethodPost, Path: wsPath(ws.WorkspaceID, "/nope"), Token: in.Token, Body: `{}`},
		{Method: http.MethodGet, Path: wsPath(ws.WorkspaceID, "/files/read/"), Token: in.Token},
	}
	for _, r := range tests {
		wantError(t, what(r), do(t, h, r), http.StatusBadRequest, protocol.InvalidRequest)
	}
}

func TestNoRedirects(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{})
	for _, r := range []request{
		{Method: http.MethodGet, Path: "/v1/lease/", Token: in.Token},
		{Method: http.MethodGet, Path: "/v1/workspaces/", Token: in.Token},
		{Method: http.MethodGet, Path: "//v1/lease", Token: in.Token},
		{Method: http.MethodGet, Path: "/v1//lease", Token: in.Token},
		{Method: http.MethodGet, Path: "/v1/./lease", Token: in.Token},
		{Method: http.MethodGet, Path: "/v1/x/../lease", Token: in.Token},
		{Method: http.MethodGet, Path: "/v1", Token: in.Token},
		{Method: http.MethodGet, Path: "/v1/", Token: in.Token},
		{Method: http.MethodPatch, Path: "/v1/lease", Token: in.Token},
		{Method: http.MethodPut, Path: "/v1/workspaces", Token: in.Token},
	} {
		rep := do(t, h, r)
		if rep.Status >= 300 && rep.Status < 400 {
			t.Errorf("%s: status = %d (Location %q); want no redirect", what(r), rep.Status, rep.Header.Get("Location"))
		}
		if rep.Status < 400 {
			t.Errorf("%s: status = %d; want an error", what(r), rep.Status)
		}
		if rep.Status >= 400 {
			var env protocol.Envelope
			if err := json.Unmarshal(rep.Body, &env); err != nil || env.Error.Code == "" {
				t.Errorf("%s: body = %s; want the error envelope", what(r), rep.Body)
			}
		}
		if got := rep.Header.Get("Cache-Control"); got != "no-store" {
			t.Errorf("%s: Cache-Control = %q; want %q", what(r), got, "no-store")
		}
	}
}

func TestRequestID(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{})

	valid := strings.Repeat("a", 60) + "Z.9_-"[:4]
	if len(valid) != 64 {
		t.Fatalf("test id has %d characters; want 64", len(valid))
	}
	lease := request{Method: http.MethodGet, Path: "/v1/lease", Token: in.Token}
	unauth := request{Method: http.MethodGet, Path: "/v1/lease"}
	unknown := request{Method: http.MethodGet, Path: "/nope"}
	tests := []struct {
		name string
		id   string // "" sends none
		echo bool
	}{
		{"valid", valid, true},
		{"short", "r-1", true},
		{"absent", "", false},
		{"65 characters", valid + "b", false},
		{"space", "abc def", false},
		{"slash", "abc/def", false},
		{"colon", "abc:def", false},
		{"non-ASCII", "r\u00e9q", false},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		for _, r := range []request{lease, unauth, unknown} {
			if tt.id != "" {
				r.Header = map[string]string{protocol.HeaderRequestID: tt.id}
			}
			rep := do(t, h, r)
			got := rep.Header.Get(protocol.HeaderRequestID)
			switch {
			case tt.echo && got != tt.id:
				t.Errorf("%s, %s: X-Request-Id = %q; want %q", tt.name, what(r), got, tt.id)
			case !tt.echo && (got == "" || got == tt.id || !policy.ValidRequestID(got)):
				t.Errorf("%s, %s: X-Request-Id = %q; want a generated valid id", tt.name, what(r), got)
			case !tt.echo && seen[got]:
				t.Errorf("%s, %s: X-Request-Id = %q was generated before; want a fresh one", tt.name, what(r), got)
			}
			if !tt.echo {
				seen[got] = true
			}
		}
	}
}

func TestPlaintextRefused(t *testing.T) {
	t.Parallel()
	lease := func(tok sandgate.Secret, xfp string) request {
		r := request{Method: http.MethodGet, Path: "/v1/lease", Token: tok, Plain: true}
		if xfp != "" {
			r.Header = map[string]string{"X-Forwarded-Proto": xfp}
		}
		return r
	}

	t.Run("no trusted proxy", func(t *testing.T) {
		t.Parallel()
		h := sgtest.New(t, sgtest.Options{})
		in := h.NewInstance(adminapi.Scope{})
		wantError(t, "plaintext", do(t, h, lease(in.Token, "")), http.StatusBadRequest, protocol.InvalidRequest)
		wantError(t, "plaintext claiming https", do(t, h, lease(in.Token, "https")), http.StatusBadRequest, protocol.InvalidRequest)
		wantError(t, "plaintext unknown route", do(t, h, request{Method: http.MethodGet, Path: "/nope", Plain: true}), http.StatusBadRequest, protocol.InvalidRequest)
	})
	t.Run("trusted proxy", func(t *testing.T) {
		t.Parallel()
		h := sgtest.New(t, sgtest.Options{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
		in := h.NewInstance(adminapi.Scope{})
		wantOK(t, "trusted proxy with https", do(t, h, lease(in.Token, "https")), http.StatusOK, nil)
		wantOK(t, "trusted proxy with HTTPS", do(t, h, lease(in.Token, "HTTPS")), http.StatusOK, nil)
		wantError(t, "trusted proxy with http", do(t, h, lease(in.Token, "http")), http.StatusBadRequest, protocol.InvalidRequest)
		wantError(t, "trusted proxy without the header", do(t, h, lease(in.Token, "")), http.StatusBadRequest, protocol.InvalidRequest)
	})
	t.Run("untrusted proxy", func(t *testing.T) {
		t.Parallel()
		h := sgtest.New(t, sgtest.Options{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
		in := h.NewInstance(adminapi.Scope{})
		wantError(t, "untrusted proxy with https", do(t, h, lease(in.Token, "https")), http.StatusBadRequest, protocol.InvalidRequest)
	})
}

func TestAuthRefused(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{})
	ws := acquire(t, h, in.Token, "auth-ws")

	tok := in.Token.Reveal()
	flipped := tok[:len(tok)-1] + "A" // a wrong checksum
	if tok[len(tok)-1] == 'A' {
		flipped = tok[:len(tok)-1] + "B"
	}
	tests := []struct {
		name   string
		header string // "" sends none
	}{
		{"missing", ""},
		{"empty bearer", "Bearer"},
		{"bearer and space", "Bearer "},
		{"wrong scheme", "Basic " + base64.StdEncoding.EncodeToString([]byte("user:"+tok))},
		{"token scheme", "Token " + tok},
		{"no scheme", tok},
		{"malformed", "Bearer sgt_short"},
		{"wrong prefix", "Bearer xyz_" + tok[len(token.Prefix):]},
		{"bad checksum", "Bearer " + flipped},
		{"two tokens", "Bearer " + tok + " " + tok},
		{"unknown well-formed", "Bearer " + token.New(token.Prefix).Reveal()},
	}
	for _, tt := range tests {
		for _, r := range allEndpoints("", ws.WorkspaceID) {
			if tt.header != "" {
				r.Header = map[string]string{"Authorization": tt.header}
				if r.Method == http.MethodPost && r.Path == "/v1/workspaces" {
					r.Header[protocol.HeaderIdempotencyKey] = "auth-probe"
				}
			}
			wantError(t, tt.name+": "+what(r), do(t, h, r), http.StatusUnauthorized, protocol.Unauthenticated)
		}
	}
	// The scheme is case-insensitive and surrounding space is trimmed.
	for _, hdr := range []string{"bearer " + tok, "BEARER " + tok, "  Bearer   " + tok + "  "} {
		r := request{Method: http.MethodGet, Path: "/v1/lease", Header: map[string]string{"Authorization": hdr}}
		wantOK(t, fmt.Sprintf("Authorization %q", strings.Replace(hdr, tok, "<token>", 1)), do(t, h, r), http.StatusOK, nil)
	}
	wantState(t, h, in.Token, ws.WorkspaceID, "after refused releases", "running")
	if ws := listAll(t, h, in.Token); len(ws) != 1 {
		t.Errorf("workspaces after refused acquires = %d; want 1", len(ws))
	}
}

func TestExpiredToken(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{})
	issued := h.IssueToken(in.ID, adminapi.IssueTokenRequest{TTLSeconds: 120})
	tok := sandgate.Secret(issued.Token)
	if want := wire(h.Clock.Now().Add(120 * time.Second)); deref(issued.ExpiresAt) != want {
		t.Fatalf("issued expires_at = %v; want %s", deref(issued.ExpiresAt), want)
	}
	ws := acquire(t, h, tok, "exp-ws")
	var lease protocol.LeaseResponse
	wantOK(t, "lease", do(t, h, request{Method: http.MethodGet, Path: "/v1/lease", Token: tok}), http.StatusOK, &lease)
	if got, want := deref(lease.Lease.ExpiresAt), any(deref(issued.ExpiresAt)); got != want {
		t.Errorf("lease.expires_at = %v; want %v", got, want)
	}

	h.Clock.Advance(119 * time.Second)
	wantOK(t, "lease a second before expiry", do(t, h, request{Method: http.MethodGet, Path: "/v1/lease", Token: tok}), http.StatusOK, nil)
	h.Clock.Advance(time.Second)
	for _, r := range allEndpoints(tok, ws.WorkspaceID) {
		wantError(t, "expired: "+what(r), do(t, h, r), http.StatusUnauthorized, protocol.LeaseExpired)
	}
	// The workspace runs on, and another token of the instance controls it.
	wantState(t, h, in.Token, ws.WorkspaceID, "after its token expired", "running")
	if got := release(t, h, in.Token, ws.WorkspaceID).State; got != "terminated" {
		t.Errorf("release with another token: state = %q; want terminated", got)
	}
}

func TestRotation(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxConcurrentWorkspaces: 5}})
	oldTok := in.Token
	lease := func(tok sandgate.Secret) protocol.LeaseResponse {
		t.Helper()
		var l protocol.LeaseResponse
		wantOK(t, "lease", do(t, h, request{Method: http.MethodGet, Path: "/v1/lease", Token: tok}), http.StatusOK, &l)
		return l
	}

	ws := acquire(t, h, oldTok, "rot-key")
	rotatedAt := h.Clock.Now()
	newTok := sandgate.Secret(h.RotateToken(in.ID, adminapi.IssueTokenRequest{GraceSeconds: 300}).Token)

	h.Clock.Advance(10 * time.Second)
	if l := lease(oldTok); l.Lease.State != "superseded" || deref(l.Lease.SupersededAt) != wire(rotatedAt) {
		t.Errorf("old lease state, superseded_at = %q, %v; want superseded, %s", l.Lease.State, deref(l.Lease.SupersededAt), wire(rotatedAt))
	}
	if l := lease(newTok); l.Lease.State != "active" || l.Lease.SupersededAt != nil || l.Lease.InstanceID != in.ID {
		t.Errorf("new lease state, superseded_at, instance = %q, %v, %q; want active, <nil>, %q", l.Lease.State, deref(l.Lease.SupersededAt), l.Lease.InstanceID, in.ID)
	}

	// Resources belong to the instance: the new token sees and replays
	// what the old one created.
	if got := getWorkspace(t, h, newTok, ws.WorkspaceID); got.State != "running" {
		t.Errorf("workspace under the new token: state = %q; want running", got.State)
	}
	var replay protocol.Workspace
	wantOK(t, "replay under the new token", do(t, h, acquireReq(newTok, "rot-key", acquireBody("test"))), http.StatusOK, &replay)
	if replay.WorkspaceID != ws.WorkspaceID {
		t.Errorf("replay under the new token: workspace_id = %q; want %q", replay.WorkspaceID, ws.WorkspaceID)
	}
	if l := listAll(t, h, newTok); len(l) != 1 || l[0].WorkspaceID != ws.WorkspaceID {
		t.Errorf("list under the new token = %v; want only %s", l, ws.WorkspaceID)
	}

	// During the grace period the old token still works, release included.
	ws2 := acquire(t, h, oldTok, "rot-key-2")
	if got := release(t, h, oldTok, ws2.WorkspaceID).State; got != "terminated" {
		t.Errorf("release by the superseded token: state = %q; want terminated", got)
	}

	// After the grace period it is refused everywhere.
	h.Clock.Advance(290 * time.Second)
	for _, r := range allEndpoints(oldTok, ws.WorkspaceID) {
		wantError(t, "after grace: "+what(r), do(t, h, r), http.StatusUnauthorized, protocol.LeaseSuperseded)
	}
	lease(newTok)

	// Ending the grace period early has the same effect at once.
	newest := sandgate.Secret(h.RotateToken(in.ID, adminapi.IssueTokenRequest{}).Token)
	if l := lease(newTok); l.Lease.State != "superseded" {
		t.Errorf("second token after another rotation: state = %q; want superseded", l.Lease.State)
	}
	if n := h.EndGrace(in.ID); n != 1 {
		t.Errorf("end-grace count = %d; want 1", n)
	}
	wantError(t, "after end-grace", do(t, h, request{Method: http.MethodGet, Path: "/v1/lease", Token: newTok}), http.StatusUnauthorized, protocol.LeaseSuperseded)
	wantError(t, "release after end-grace", do(t, h, request{Method: http.MethodDelete, Path: wsPath(ws.WorkspaceID), Token: newTok}), http.StatusUnauthorized, protocol.LeaseSuperseded)
	if got := release(t, h, newest, ws.WorkspaceID).State; got != "terminated" {
		t.Errorf("release by the newest token: state = %q; want terminated", got)
	}
}

func TestRevokeIsImmediate(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	// Repeat, so that a cache that is cleared only eventually is caught.
	for i := range 25 {
		in := h.NewInstance(adminapi.Scope{})
		lease := request{Method: http.MethodGet, Path: "/v1/lease", Token: in.Token}
		ws := acquire(t, h, in.Token, "rev-ws")
		wantOK(t, "lease before revoke", do(t, h, lease), http.StatusOK, nil)
		wantOK(t, "lease before revoke, cached", do(t, h, lease), http.StatusOK, nil)
		if n := h.RevokeTokens(in.ID); n != 1 {
			t.Fatalf("revoke count = %d; want 1", n)
		}
		wantError(t, fmt.Sprintf("round %d: first request after revoke", i), do(t, h, lease), http.StatusUnauthorized, protocol.LeaseRevoked)
		if i == 0 {
			for _, r := range allEndpoints(in.Token, ws.WorkspaceID) {
				wantError(t, "revoked: "+what(r), do(t, h, r), http.StatusUnauthorized, protocol.LeaseRevoked)
			}
			next := sandgate.Secret(h.IssueToken(in.ID, adminapi.IssueTokenRequest{}).Token)
			if got := getWorkspace(t, h, next, ws.WorkspaceID).WorkspaceID; got != ws.WorkspaceID {
				t.Errorf("workspace under a new token after revoke = %q; want %q", got, ws.WorkspaceID)
			}
		}
	}
}

// TestRevokeOneLease checks that revoking one token by its lease id is as
// immediate as revoking an instance's tokens, and touches nothing else: a
// leaked superseded token is cut off while its successor keeps working.
func TestRevokeOneLease(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	// Repeat, so that a cache that is cleared only eventually is caught.
	for i := range 25 {
		in := h.NewInstance(adminapi.Scope{})
		ws := acquire(t, h, in.Token, "rev-lease-ws")
		next := h.RotateToken(in.ID, adminapi.IssueTokenRequest{GraceSeconds: 3600})
		newTok := sandgate.Secret(next.Token)
		lease := func(tok sandgate.Secret) request {
			return request{Method: http.MethodGet, Path: "/v1/lease", Token: tok}
		}
		wantOK(t, "old lease before revoke", do(t, h, lease(in.Token)), http.StatusOK, nil)
		wantOK(t, "old lease before revoke, cached", do(t, h, lease(in.Token)), http.StatusOK, nil)
		wantOK(t, "new lease before revoke, cached", do(t, h, lease(newTok)), http.StatusOK, nil)

		if n := h.RevokeLease(in.LeaseID); n != 1 {
			t.Fatalf("revoke lease count = %d; want 1", n)
		}
		wantError(t, fmt.Sprintf("round %d: first request of the revoked token", i), do(t, h, lease(in.Token)), http.StatusUnauthorized, protocol.LeaseRevoked)
		var l protocol.LeaseResponse
		wantOK(t, fmt.Sprintf("round %d: the successor's lease", i), do(t, h, lease(newTok)), http.StatusOK, &l)
		if l.Lease.ID != next.LeaseID || l.Lease.State != "active" {
			t.Errorf("successor's lease id, state = %s, %s; want %s, active", l.Lease.ID, l.Lease.State, next.LeaseID)
		}
		if i > 0 {
			continue
		}
		for _, r := range allEndpoints(in.Token, ws.WorkspaceID) {
			wantError(t, "revoked lease: "+what(r), do(t, h, r), http.StatusUnauthorized, protocol.LeaseRevoked)
		}
		// The instance's workspaces are its, not the token's: they run on.
		wantRunning(t, h, newTok, ws.WorkspaceID)
		if n := h.RevokeLease(in.LeaseID); n != 0 {
			t.Errorf("second revoke of the same lease count = %d; want 0", n)
		}
		var tokens []adminapi.Lease
		h.AdminDo(http.MethodGet, "/instances/"+in.ID+"/tokens", nil, &tokens)
		states := map[string]string{}
		for _, tk := range tokens {
			states[tk.ID] = tk.State
		}
		if want := map[string]string{in.LeaseID: "revoked", next.LeaseID: "active"}; !maps.Equal(states, want) {
			t.Errorf("token states = %v; want %v", states, want)
		}
	}
}

func TestLeaseBody(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	d := sandgate.DefaultLimits
	defLimits := protocol.Limits{
		MaxConcurrentWorkspaces:   d.MaxConcurrentWorkspaces,
		MaxLifetimeSeconds:        int64(d.MaxLifetime / time.Second),
		IdleTimeoutSeconds:        int64(d.IdleTimeout / time.Second),
		MaxExecTimeoutSeconds:     int64(d.MaxExecTimeout / time.Second),
		DefaultExecTimeoutSeconds: int64(d.DefaultExecTimeout / time.Second),
		MaxSnapshots:              d.MaxSnapshots,
		MaxSnapshotBytes:          d.MaxSnapshotBytes,
		SnapshotTTLSeconds:        int64(d.SnapshotTTL / time.Second),
		MaxFileBytes:              d.MaxFileBytes,
		MaxOutputBytes:            d.MaxOutputBytes,
		MaxEnvEntries:             d.MaxEnvEntries,
		MaxEgressDomains:          d.MaxEgressDomains,
	}
	custom := protocol.Limits{
		MaxConcurrentWorkspaces:   7,
		MaxLifetimeSeconds:        1800,
		IdleTimeoutSeconds:        300,
		MaxExecTimeoutSeconds:     120,
		DefaultExecTimeoutSeconds: 15,
		MaxSnapshots:              4,
		MaxSnapshotBytes:          1 << 20,
		SnapshotTTLSeconds:        86400,
		MaxFileBytes:              1 << 20,
		MaxOutputBytes:            1 << 19,
		MaxEnvEntries:             8,
		MaxEgressDomains:          9,
	}
	size := func(name string) protocol.Size {
		s, _ := sandgate.LookupSize(name)
		return protocol.Size{Name: s.Name, CPUCores: s.CPUCores, MemoryMiB: s.MemoryMiB}
	}
	ceiling := []string{"github.com", "*.example.com"}
	tests := []struct {
		name        string
		scope       adminapi.Scope
		sizes       []protocol.Size
		defaultSize string
		images      protocol.Images
		ceiling     []string
		rawCeiling  string
		limits      protocol.Limits
	}{
		{
			name: "custom",
			scope: adminapi.Scope{Sizes: []string{"large", "small"}, DefaultSize: "large",
				Images: []string{"img-a", "img-b"}, DefaultImage: "img-a", EgressCeiling: &ceiling, Limits: custom},
			sizes:       []protocol.Size{size("small"), size("large")},
			defaultSize: "large",
			images:      protocol.Images{Default: "img-a", Allowed: []string{"img-a", "img-b"}},
			ceiling:     ceiling,
			rawCeiling:  `["github.com","*.example.com"]`,
			limits:      custom,
		},
		{
			name:        "defaults",
			scope:       adminapi.Scope{},
			sizes:       []protocol.Size{size("small"), size("standard"), size("large"), size("xlarge")},
			defaultSize: "standard",
			images:      protocol.Images{Default: sgtest.DefaultImage, Allowed: []string{sgtest.DefaultImage}},
			ceiling:     nil,
			rawCeiling:  `null`,
			limits:      defLimits,
		},
		{
			name:        "no network, no standard size",
			scope:       adminapi.Scope{Sizes: []string{"xlarge", "small"}, EgressCeiling: &[]string{}},
			sizes:       []protocol.Size{size("small"), size("xlarge")},
			defaultSize: "small",
			images:      protocol.Images{Default: sgtest.DefaultImage, Allowed: []string{sgtest.DefaultImage}},
			ceiling:     []string{},
			rawCeiling:  `[]`,
			limits:      defLimits,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := h.NewInstance(tt.scope)
			rep := do(t, h, request{Method: http.MethodGet, Path: "/v1/lease", Token: in.Token})
			var got protocol.LeaseResponse
			wantOK(t, "lease", rep, http.StatusOK, &got)
			want := protocol.LeaseResponse{
				APIVersion:   "execution-broker/v1",
				Lease:        protocol.LeaseInfo{ID: in.LeaseID, InstanceID: in.ID, State: "active"},
				Admission:    protocol.Admission{State: "open"},
				Capabilities: protocol.Capabilities{Shell: true, EgressControl: true, Snapshots: true, DurableCommands: true},
				Limits:       tt.limits,
				Sizes:        tt.sizes,
				DefaultSize:  tt.defaultSize,
				Images:       tt.images,
				Egress:       protocol.EgressInfo{Ceiling: tt.ceiling},
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("lease = %+v; want %+v", got, want)
			}
			var raw struct {
				Lease  map[string]json.RawMessage `json:"lease"`
				Egress map[string]json.RawMessage `json:"egress"`
			}
			if err := json.Unmarshal(rep.Body, &raw); err != nil {
				t.Fatalf("decode lease: %v", err)
			}
			if got := string(raw.Egress["ceiling"]); got != tt.rawCeiling {
				t.Errorf("egress.ceiling = %s; want %s", got, tt.rawCeiling)
			}
			for _, k := range []string{"expires_at", "superseded_at"} {
				if got := string(raw.Lease[k]); got != "null" {
					t.Errorf("lease.%s = %s; want null", k, got)
				}
			}
		})
	}
}

func TestAcquire(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	ceiling := []string{"github.com", "*.example.com"}
	in := h.NewInstance(adminapi.Scope{Sizes: []string{"small", "standard"}, Images: []string{sgtest.DefaultImage, "img-b"},
		EgressCeiling: &ceiling, Limits: protocol.Limits{MaxLifetimeSeconds: 600, IdleTimeoutSeconds: 120}})
	now := h.Clock.Now()

	var ws protocol.Workspace
	rep := do(t, h, acquireReq(in.Token, "acq-1", map[string]any{
		"label": "mesh-ws:1", "size": "small", "image": "img-b", "env": map[string]string{"HOME": "/root", "EMPTY": ""},
		"egress": map[string]any{"allowed_domains": []string{"github.com", "api.example.com", "github.com"}},
		"agent":  "ops-bot", "run_id": "6f1e0d4c-2b7a-4e3f-9c1d-8a5b6c7d8e9f",
	}))
	wantOK(t, "acquire", rep, http.StatusCreated, &ws)
	want := protocol.Workspace{
		WorkspaceID: ws.WorkspaceID, State: "running", Size: "small", Image: "img-b",
		CreatedAt: wire(now), ExpiresAt: wire(now.Add(600 * time.Second)), IdleTimeoutSeconds: 120,
	}
	if !reflect.DeepEqual(ws, want) {
		t.Errorf("acquire = %+v; want %+v", ws, want)
	}
	if !policy.ValidID(ws.WorkspaceID) {
		t.Errorf("workspace_id = %q; want a valid id", ws.WorkspaceID)
	}
	specs := h.Provider.CreateSpecs()
	if len(specs) != 1 {
		t.Fatalf("provider creates = %d; want 1", len(specs))
	}
	spec := specs[0]
	if spec.WorkspaceID != ws.WorkspaceID || spec.InstanceID != in.ID || spec.Size.Name != "small" || spec.Image != "img-b" {
		t.Errorf("create spec ids, size, image = %q, %q, %q, %q; want %q, %q, small, img-b",
			spec.WorkspaceID, spec.InstanceID, spec.Size.Name, spec.Image, ws.WorkspaceID, in.ID)
	}
	if want := map[string]string{"HOME": "/root", "EMPTY": ""}; !reflect.DeepEqual(spec.Env, want) {
		t.Errorf("create spec env = %v; want %v", spec.Env, want)
	}
	if want := []string{"github.com", "api.example.com"}; !reflect.DeepEqual(spec.Egress.AllowedDomains, want) {
		t.Errorf("create spec egress = %v; want %v", spec.Egress.AllowedDomains, want)
	}
	if !spec.ExpiresAt.Equal(now.Add(600*time.Second)) || spec.IdleTimeout != 120*time.Second {
		t.Errorf("create spec expires_at, idle = %v, %v; want %v, 2m0s", spec.ExpiresAt, spec.IdleTimeout, now.Add(600*time.Second))
	}

	// Defaults: size standard, the default image, and [] is no network.
	var def protocol.Workspace
	wantOK(t, "acquire with defaults", do(t, h, acquireReq(in.Token, "acq-2", acquireBody("x"))), http.StatusCreated, &def)
	if def.Size != "standard" || def.Image != sgtest.DefaultImage {
		t.Errorf("default size, image = %q, %q; want standard, %s", def.Size, def.Image, sgtest.DefaultImage)
	}
	if got := h.Provider.CreateSpecs()[1].Egress.AllowedDomains; got == nil || len(got) != 0 {
		t.Errorf("create spec egress for [] = %#v; want empty, non-nil", got)
	}
	if def.WorkspaceID == ws.WorkspaceID {
		t.Errorf("second workspace_id = first %q; want a new id", def.WorkspaceID)
	}
}

func TestAcquireRefusals(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	ceiling := []string{"github.com", "*.example.com"}
	scope := adminapi.Scope{Sizes: []string{"small", "standard"}, Images: []string{sgtest.DefaultImage, "img-b"},
		EgressCeiling: &ceiling, Limits: protocol.Limits{MaxEnvEntries: 2, MaxEgressDomains: 3}}
	egress := func(d ...string) map[string]any { return map[string]any{"allowed_domains": append([]string{}, d...)} }
	body := func(mod func(m map[string]any)) map[string]any {
		m := map[string]any{"label": "ok", "egress": egress()}
		mod(m)
		return m
	}
	tests := []struct {
		name   string
		key    string // "" sends no Idempotency-Key
		body   any
		status int
		code   protocol.Code
	}{
		{"missing label", "k", body(func(m map[string]any) { delete(m, "label") }), 400, protocol.InvalidRequest},
		{"empty label", "k", body(func(m map[string]any) { m["label"] = "" }), 400, protocol.InvalidRequest},
		{"bad label", "k", body(func(m map[string]any) { m["label"] = "has space" }), 400, protocol.InvalidRequest},
		{"long label", "k", body(func(m map[string]any) { m["label"] = strings.Repeat("l", 129) }), 400, protocol.InvalidRequest},
		{"bad agent", "k", body(func(m map[string]any) { m["agent"] = "Ops_Bot" }), 400, protocol.InvalidRequest},
		{"agent leading dash", "k", body(func(m map[string]any) { m["agent"] = "-bot" }), 400, protocol.InvalidRequest},
		{"bad run_id", "k", body(func(m map[string]any) { m["run_id"] = "run-1" }), 400, protocol.InvalidRequest},
		{"agent empty", "k", body(func(m map[string]any) { m["agent"] = "" }), 400, protocol.InvalidRequest},
		{"agent null", "k", body(func(m map[string]any) { m["agent"] = nil }), 400, protocol.InvalidRequest},
		{"run_id empty", "k", body(func(m map[string]any) { m["run_id"] = "" }), 400, protocol.InvalidRequest},
		{"env value null", "k", body(func(m map[string]any) { m["env"] = map[string]any{"A": nil} }), 400, protocol.InvalidRequest},
		{"env value null beside strings", "k", body(func(m map[string]any) { m["env"] = map[string]any{"A": "1", "B": nil} }), 400, protocol.InvalidRequest},
		{"size not allowed", "k", body(func(m map[string]any) { m["size"] = "xlarge" }), 422, protocol.SizeNotAllowed},
		{"unknown size", "k", body(func(m map[string]any) { m["size"] = "huge" }), 422, protocol.SizeNotAllowed},
		{"image not allowed", "k", body(func(m map[string]any) { m["image"] = "evil:latest" }), 422, protocol.ImageNotAllowed},
		{"egress missing", "k", body(func(m map[string]any) { delete(m, "egress") }), 422, protocol.EgressRequired},
		{"egress null", "k", body(func(m map[string]any) { m["egress"] = nil }), 422, protocol.EgressRequired},
		{"egress empty object", "k", body(func(m map[string]any) { m["egress"] = map[string]any{} }), 422, protocol.EgressRequired},
		{"egress domains null", "k", body(func(m map[string]any) { m["egress"] = map[string]any{"allowed_domains": nil} }), 422, protocol.EgressRequired},
		{"egress outside ceiling", "k", body(func(m map[string]any) { m["egress"] = egress("github.com", "evil.com") }), 422, protocol.EgressNotAllowed},
		{"egress base of wildcard", "k", body(func(m map[string]any) { m["egress"] = egress("example.com") }), 422, protocol.EgressNotAllowed},
		{"egress URL", "k", body(func(m map[string]any) { m["egress"] = egress("https://github.com") }), 400, protocol.InvalidRequest},
		{"egress bare star", "k", body(func(m map[string]any) { m["egress"] = egress("*") }), 400, protocol.InvalidRequest},
		{"egress IP", "k", body(func(m map[string]any) { m["egress"] = egress("10.0.0.1") }), 400, protocol.InvalidRequest},
		{"egress uppercase", "k", body(func(m map[string]any) { m["egress"] = egress("GitHub.com") }), 400, protocol.InvalidRequest},
		{"egress port", "k", body(func(m map[string]any) { m["egress"] = egress("github.com:443") }), 400, protocol.InvalidRequest},
		{"egress too many", "k", body(func(m map[string]any) {
			m["egress"] = egress("a.example.com", "b.example.com", "c.example.com", "d.example.com")
		}), 400, protocol.InvalidRequest},
		{"env too many", "k", body(func(m map[string]any) { m["env"] = map[string]string{"A": "1", "B": "2", "C": "3"} }), 400, protocol.InvalidRequest},
		{"env key digit", "k", body(func(m map[string]any) { m["env"] = map[string]string{"1X": "1"} }), 400, protocol.InvalidRequest},
		{"env key dash", "k", body(func(m map[string]any) { m["env"] = map[string]string{"A-B": "1"} }), 400, protocol.InvalidRequest},
		{"env key empty", "k", body(func(m map[string]any) { m["env"] = map[string]string{"": "1"} }), 400, protocol.InvalidRequest},
		{"env value NUL", "k", body(func(m map[string]any) { m["env"] = map[string]string{"A": "x\x00y"} }), 400, protocol.InvalidRequest},
		{"env value not a string", "k", body(func(m map[string]any) { m["env"] = map[string]any{"A": 1} }), 400, protocol.InvalidRequest},
		{"env too large", "k", body(func(m map[string]any) { m["env"] = map[string]string{"A": strings.Repeat("v", 33<<10)} }), 400, protocol.InvalidRequest},
		{"snapshot_id", "k", body(func(m map[string]any) { m["snapshot_id"] = "snap_0123456789abcdefghjkmnpqrs" }), 404, protocol.NotFound},
		// Malformed in the body is still 404, unlike in a path: the client
		// falls back to a cold start.
		{"snapshot_id malformed", "k", body(func(m map[string]any) { m["snapshot_id"] = "snap!0123" }), 404, protocol.NotFound},
		{"unknown field", "k", body(func(m map[string]any) { m["lable"] = "typo" }), 400, protocol.InvalidRequest},
		{"no Idempotency-Key", "", body(func(map[string]any) {}), 400, protocol.InvalidRequest},
		{"bad Idempotency-Key", "has space", body(func(map[string]any) {}), 400, protocol.InvalidRequest},
		{"long Idempotency-Key", strings.Repeat("k", 201), body(func(map[string]any) {}), 400, protocol.InvalidRequest},
		{"slash Idempotency-Key", "a/b", body(func(map[string]any) {}), 400, protocol.InvalidRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := h.NewInstance(scope)
			creates := len(h.Provider.CreateSpecs())
			r := acquireReq(in.Token, tt.key, tt.body)
			if tt.key == "" {
				r.Header = nil
			}
			wantError(t, tt.name, do(t, h, r), tt.status, tt.code)
			if ws := listAll(t, h, in.Token); len(ws) != 0 {
				t.Errorf("workspaces after refusal = %d; want 0", len(ws))
			}
			if n := h.LiveCount(in); n != 0 {
				t.Errorf("live slots after refusal = %d; want 0", n)
			}
			if n := len(h.Provider.CreateSpecs()); n != creates {
				t.Errorf("provider creates after refusal = %d; want %d", n, creates)
			}
			// spec §Idempotency: a refusal before any side effect does not
			// consume the key.
			key := tt.key
			if policy.ValidateIdempotencyKey(key) != nil {
				key = "retry"
			}
			var ws protocol.Workspace
			wantOK(t, "retry with a valid body", do(t, h, acquireReq(in.Token, key, acquireBody("ok"))), http.StatusCreated, &ws)
			if n := h.LiveCount(in); n != 1 {
				t.Errorf("live slots after retry = %d; want 1", n)
			}
		})
	}
}

func TestIdempotencyReplay(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxConcurrentWorkspaces: 5}})
	req := func(key string, body any) reply { return do(t, h, acquireReq(in.Token, key, body)) }
	body := map[string]any{"label": "x", "env": map[string]string{"A": "1", "B": "2"}, "egress": map[string]any{"allowed_domains": []string{"github.com"}}}

	var first, again protocol.Workspace
	wantOK(t, "acquire", req("idem-1", body), http.StatusCreated, &first)
	wantOK(t, "replay", req("idem-1", body), http.StatusOK, &again)
	if !reflect.DeepEqual(again, first) {
		t.Errorf("replay = %+v; want %+v", again, first)
	}
	// The same request with its fields in another order is the same request.
	reordered := `{"egress":{"allowed_domains":["github.com"]},"env":{"B":"2","A":"1"},"label":"x"}`
	wantOK(t, "replay reordered", req("idem-1", reordered), http.StatusOK, &again)
	if again.WorkspaceID != first.WorkspaceID {
		t.Errorf("reordered replay: workspace_id = %q; want %q", again.WorkspaceID, first.WorkspaceID)
	}
	if n := len(h.Provider.CreateSpecs()); n != 1 {
		t.Errorf("provider creates after replays = %d; want 1", n)
	}
	if n := h.LiveCount(in); n != 1 {
		t.Errorf("live slots after replays = %d; want 1", n)
	}

	conflicts := []struct {
		name string
		body any
	}{
		{"label", map[string]any{"label": "y", "env": map[string]string{"A": "1", "B": "2"}, "egress": map[string]any{"allowed_domains": []string{"github.com"}}}},
		{"env value only", map[string]any{"label": "x", "env": map[string]string{"A": "1", "B": "3"}, "egress": map[string]any{"allowed_domains": []string{"github.com"}}}},
		{"env key dropped", map[string]any{"label": "x", "env": map[string]string{"A": "1"}, "egress": map[string]any{"allowed_domains": []string{"github.com"}}}},
		{"egress", map[string]any{"label": "x", "env": map[string]string{"A": "1", "B": "2"}, "egress": map[string]any{"allowed_domains": []string{}}}},
		{"egress missing", map[string]any{"label": "x", "env": map[string]string{"A": "1", "B": "2"}}},
		{"size", map[string]any{"label": "x", "size": "small", "env": map[string]string{"A": "1", "B": "2"}, "egress": map[string]any{"allowed_domains": []string{"github.com"}}}},
	}
	for _, c := range conflicts {
		wantError(t, "conflict: "+c.name, req("idem-1", c.body), http.StatusConflict, protocol.IdempotencyConflict)
	}

	// After release the replay answers the same workspace, terminated.
	rel := release(t, h, in.Token, first.WorkspaceID)
	wantOK(t, "replay after release", req("idem-1", body), http.StatusOK, &again)
	if again.WorkspaceID != first.WorkspaceID || again.State != "terminated" {
		t.Errorf("replay after release: id, state = %q, %q; want %q, terminated", again.WorkspaceID, again.State, first.WorkspaceID)
	}
	if deref(again.TerminatedAt) != deref(rel.TerminatedAt) || deref(again.TerminationReason) != "released" {
		t.Errorf("replay after release: terminated_at, reason = %v, %v; want %v, released", deref(again.TerminatedAt), deref(again.TerminationReason), deref(rel.TerminatedAt))
	}
	if n := len(h.Provider.CreateSpecs()); n != 1 {
		t.Errorf("provider creates after replay of a released workspace = %d; want 1", n)
	}
	if n := h.LiveCount(in); n != 0 {
		t.Errorf("live slots after replay of a released workspace = %d; want 0", n)
	}
}

func TestIdempotencyInProgress(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{})
	g, id, first := startBlockedAcquire(t, h, "first acquire", acquireReq(in.Token, "slow", acquireBody("slow")))

	rep := do(t, h, acquireReq(in.Token, "slow", acquireBody("slow")))
	wantError(t, "replay while in progress", rep, http.StatusConflict, protocol.IdempotencyInProgress)
	if got := rep.Header.Get("Retry-After"); got == "" {
		t.Errorf("replay while in progress: Retry-After = %q; want seconds", got)
	} else if n, err := strconv.Atoi(got); err != nil || n < 1 {
		t.Errorf("replay while in progress: Retry-After = %q; want a positive integer", got)
	}
	wantError(t, "other body while in progress", do(t, h, acquireReq(in.Token, "slow", acquireBody("other"))), http.StatusConflict, protocol.IdempotencyConflict)

	// The starting workspace is listed and readable, but takes no commands.
	if got := getWorkspace(t, h, in.Token, id); got.State != "starting" || got.TerminatedAt != nil {
		t.Errorf("starting workspace: state, terminated_at = %q, %v; want starting, <nil>", got.State, deref(got.TerminatedAt))
	}
	var live protocol.WorkspaceList
	wantOK(t, "list live", do(t, h, request{Method: http.MethodGet, Path: "/v1/workspaces?state=live", Token: in.Token}), http.StatusOK, &live)
	if len(live.Workspaces) != 1 || live.Workspaces[0].WorkspaceID != id || live.Workspaces[0].State != "starting" {
		t.Errorf("live list while starting = %+v; want %s starting", live.Workspaces, id)
	}
	for _, r := range workspaceOps(in.Token, id)[1:4] {
		rep := do(t, h, r)
		wantError(t, "starting: "+what(r), rep, http.StatusConflict, protocol.WorkspaceNotReady)
	}
	if n := len(h.Provider.Execs()); n != 0 {
		t.Errorf("provider execs on a starting workspace = %d; want 0", n)
	}

	g.open()
	var ws protocol.Workspace
	wantOK(t, "first acquire", <-first, http.StatusCreated, &ws)
	if ws.WorkspaceID != id || ws.State != "running" {
		t.Errorf("first acquire: id, state = %q, %q; want %q, running", ws.WorkspaceID, ws.State, id)
	}
	wantOK(t, "replay after create", do(t, h, acquireReq(in.Token, "slow", acquireBody("slow"))), http.StatusOK, &ws)
	if ws.WorkspaceID != id {
		t.Errorf("replay after create: id = %q; want %q", ws.WorkspaceID, id)
	}
	wantOK(t, "exec once running", do(t, h, workspaceOps(in.Token, id)[1]), http.StatusOK, nil)
}

func TestReleaseWhileStarting(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{})
	g, id, first := startBlockedAcquire(t, h, "acquire", acquireReq(in.Token, "rws", acquireBody("x")))

	rel := release(t, h, in.Token, id)
	if rel.State != "terminating" || deref(rel.TerminationReason) != "released" {
		t.Errorf("release while starting: state, reason = %q, %v; want terminating, released", rel.State, deref(rel.TerminationReason))
	}
	if n := h.LiveCount(in); n != 0 {
		t.Errorf("live slots after release while starting = %d; want 0", n)
	}
	g.open()
	var ws protocol.Workspace
	wantOK(t, "acquire released while starting", <-first, http.StatusCreated, &ws)
	if ws.WorkspaceID != id || ws.State != "terminated" {
		t.Errorf("acquire released while starting: id, state = %q, %q; want %q, terminated", ws.WorkspaceID, ws.State, id)
	}
	if n := h.Provider.Live(); n != 0 {
		t.Errorf("provider sandboxes after release while starting = %d; want 0", n)
	}
	got := getWorkspace(t, h, in.Token, id)
	if got.State != "terminated" || deref(got.TerminationReason) != "released" || got.TerminatedAt == nil {
		t.Errorf("status: state, reason, terminated_at = %q, %v, %v; want terminated, released, a time", got.State, deref(got.TerminationReason), deref(got.TerminatedAt))
	}
	// The key named a workspace that no longer runs: a replay answers it,
	// terminated, and never claims the key is still in progress.
	var again protocol.Workspace
	wantOK(t, "replay after release while starting", do(t, h, acquireReq(in.Token, "rws", acquireBody("x"))), http.StatusOK, &again)
	if again.WorkspaceID != id || again.State != "terminated" {
		t.Errorf("replay: id, state = %q, %q; want %q, terminated", again.WorkspaceID, again.State, id)
	}
}

func TestIdempotencyKeysPerInstance(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	a, b, c := twoAccounts(h)
	ids := map[string]bool{}
	for _, in := range []sgtest.Instance{a, b, c} {
		ws := acquire(t, h, in.Token, "shared-key")
		if ids[ws.WorkspaceID] {
			t.Errorf("instance %s got workspace %s of another instance; want a new one", in.ID, ws.WorkspaceID)
		}
		ids[ws.WorkspaceID] = true
		if n := len(listAll(t, h, in.Token)); n != 1 {
			t.Errorf("instance %s workspaces = %d; want 1", in.ID, n)
		}
	}
}

func TestProviderCreateFailure(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxConcurrentWorkspaces: 1}})
	h.Provider.OnCreate(func(context.Context, providers.CreateSpec) error { return errors.New("vendor: out of capacity") })
	for range 3 {
		wantError(t, "acquire with a failing provider", do(t, h, acquireReq(in.Token, "pf", acquireBody("x"))), http.StatusBadGateway, protocol.UpstreamError)
	}
	if ws := listAll(t, h, in.Token); len(ws) != 0 {
		t.Errorf("workspaces after failed creates = %d; want 0", len(ws))
	}
	if n := h.LiveCount(in); n != 0 {
		t.Errorf("live slots after failed creates = %d; want 0", n)
	}
	h.Provider.OnCreate(nil)
	// The key was not consumed and the only slot is free.
	ws := acquire(t, h, in.Token, "pf")
	if ws.State != "running" {
		t.Errorf("acquire after recovery: state = %q; want running", ws.State)
	}
}

func TestConcurrencyLimit(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxConcurrentWorkspaces: 3}})
	const n = 100
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		created []string
		refused int
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep, err := send(h, nil, acquireReq(in.Token, fmt.Sprintf("conc-%d", i), acquireBody("c")))
			if err != nil {
				t.Errorf("acquire %d: %v", i, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			switch rep.Status {
			case http.StatusCreated:
				var ws protocol.Workspace
				if err := json.Unmarshal(rep.Body, &ws); err != nil {
					t.Errorf("acquire %d: decode: %v", i, err)
				}
				created = append(created, ws.WorkspaceID)
			case http.StatusTooManyRequests:
				wantError(t, fmt.Sprintf("acquire %d", i), rep, http.StatusTooManyRequests, protocol.ConcurrencyLimit)
				refused++
			default:
				t.Errorf("acquire %d: status = %d; want 201 or 429 (body %s)", i, rep.Status, rep.Body)
			}
		}()
	}
	wg.Wait()
	if len(created) != 3 || refused != n-3 {
		t.Fatalf("created, refused = %d, %d; want 3, %d", len(created), refused, n-3)
	}
	if got := h.LiveCount(in); got != 3 {
		t.Errorf("live slots = %d; want 3", got)
	}
	if got := len(listAll(t, h, in.Token)); got != 3 {
		t.Errorf("workspaces = %d; want 3", got)
	}
	wantError(t, "acquire when full", do(t, h, acquireReq(in.Token, "conc-next", acquireBody("c"))), http.StatusTooManyRequests, protocol.ConcurrencyLimit)

	release(t, h, in.Token, created[0])
	created = append(created[1:], acquire(t, h, in.Token, "conc-next").WorkspaceID)
	for _, id := range created {
		release(t, h, in.Token, id)
	}
	if got := h.LiveCount(in); got != 0 {
		t.Errorf("live slots after releasing all = %d; want 0", got)
	}
	if got := h.Provider.Live(); got != 0 {
		t.Errorf("provider sandboxes after releasing all = %d; want 0", got)
	}
}

func TestCrossInstance(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	a, sameAccount, otherAccount := twoAccounts(h)
	ws := acquire(t, h, a.Token, "mine")
	acquire(t, h, sameAccount.Token, "theirs")

	type answer struct {
		Status  int
		Code    protocol.Code
		Message string
	}
	answerOf := func(rep reply) answer {
		var env protocol.Envelope
		_ = json.Unmarshal(rep.Body, &env)
		return answer{rep.Status, env.Error.Code, env.Error.Message}
	}
	unknown := sandgate.NewID(sandgate.PrefixWorkspace)
	for _, other := range []sgtest.Instance{sameAccount, otherAccount} {
		foreign := workspaceOps(other.Token, ws.WorkspaceID)
		for i, r := range workspaceOps(other.Token, unknown) {
			wantAns := answerOf(wantErrorRep(t, "unknown id: "+what(r), do(t, h, r), http.StatusNotFound, protocol.NotFound))
			got := answerOf(do(t, h, foreign[i]))
			if got != wantAns {
				t.Errorf("%s by another instance = %+v; want %+v, as for an unknown id", what(foreign[i]), got, wantAns)
			}
		}
	}
	// A malformed id is 400 (spec §Errors: "bad id"), never the 404 a
	// client takes as "already released".
	for _, bad := range []string{"..", "a%20b", "ws_%2F", strings.Repeat("w", 65), "ws%00x", "%C3%A9"} {
		key := map[string]string{protocol.HeaderIdempotencyKey: "bad-id"}
		ops := append(workspaceOps(a.Token, bad),
			request{Method: http.MethodPost, Path: wsPath(bad, "/snapshots"), Token: a.Token, Header: key, Body: map[string]any{"path": "/workspace"}},
			request{Method: http.MethodGet, Path: wsPath(bad, "/commands/c1"), Token: a.Token},
			request{Method: http.MethodPost, Path: wsPath(bad, "/commands/c1/cancel"), Token: a.Token},
			request{Method: http.MethodDelete, Path: "/v1/snapshots/" + bad, Token: a.Token})
		for _, r := range ops {
			wantError(t, "invalid id: "+what(r), do(t, h, r), http.StatusBadRequest, protocol.InvalidRequest)
		}
	}
	wantState(t, h, a.Token, ws.WorkspaceID, "after other instances' requests", "running")
	if n := len(h.Provider.Execs()); n != 0 {
		t.Errorf("provider execs by other instances = %d; want 0", n)
	}
	if l := listAll(t, h, sameAccount.Token); len(l) != 1 || l[0].WorkspaceID == ws.WorkspaceID {
		t.Errorf("other instance's list = %+v; want only its own workspace", l)
	}
}

// wantErrorRep is wantError returning the reply, for chaining.
func wantErrorRep(t testing.TB, label string, rep reply, status int, code protocol.Code) reply {
	t.Helper()
	wantError(t, label, rep, status, code)
	return rep
}

func TestExecTimeout(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxExecTimeoutSeconds: 60, DefaultExecTimeoutSeconds: 10, MaxLifetimeSeconds: 3600}})
	ws := acquire(t, h, in.Token, "exec-timeout")
	start := h.Clock.Now()
	expires := parseWire(t, ws.ExpiresAt)

	tests := []struct {
		name    string
		body    string
		left    time.Duration // time left before expires_at; 0 means the clock at acquire
		want    time.Duration
		clamped bool
	}{
		{"omitted", `{"argv":["true"]}`, 0, 10 * time.Second, false},
		{"zero", `{"argv":["true"],"timeout_seconds":0}`, 0, 10 * time.Second, false},
		{"within max", `{"argv":["true"],"timeout_seconds":30}`, 0, 30 * time.Second, false},
		{"at max", `{"argv":["true"],"timeout_seconds":60}`, 0, 60 * time.Second, false},
		{"above max", `{"argv":["true"],"timeout_seconds":61}`, 0, 60 * time.Second, true},
		{"huge", `{"argv":["true"],"timeout_seconds":9223372036854775807}`, 0, 60 * time.Second, true},
		{"beyond expires_at", `{"argv":["true"],"timeout_seconds":30}`, 20 * time.Second, 20 * time.Second, true},
		{"default beyond expires_at", `{"argv":["true"]}`, 5 * time.Second, 5 * time.Second, true},
		{"up to expires_at", `{"argv":["true"],"timeout_seconds":20}`, 20 * time.Second, 20 * time.Second, false},
		{"above max and expires_at", `{"argv":["true"],"timeout_seconds":600}`, 45 * time.Second, 45 * time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.left == 0 {
				h.Clock.Set(start)
			} else {
				h.Clock.Set(expires.Add(-tt.left))
			}
			var res protocol.ExecResponse
			wantOK(t, "exec", do(t, h, request{Method: http.MethodPost, Path: wsPath(ws.WorkspaceID, "/exec"), Token: in.Token, Body: tt.body}), http.StatusOK, &res)
			if res.TimeoutClamped != tt.clamped {
				t.Errorf("timeout_clamped = %v; want %v", res.TimeoutClamped, tt.clamped)
			}
			execs := h.Provider.Execs()
			if got := execs[len(execs)-1].Timeout; got != tt.want {
				t.Errorf("provider timeout = %v; want %v", got, tt.want)
			}
		})
	}
	h.Clock.Set(start)
	n := len(h.Provider.Execs())
	for _, body := range []string{`{"argv":["true"],"timeout_seconds":-1}`, `{"argv":["true"],"timeout_seconds":-9223372036854775808}`, `{"argv":["true"],"timeout_seconds":1.5}`} {
		wantError(t, "exec with timeout "+body, do(t, h, request{Method: http.MethodPost, Path: wsPath(ws.WorkspaceID, "/exec"), Token: in.Token, Body: body}), http.StatusBadRequest, protocol.InvalidRequest)
	}
	if got := len(h.Provider.Execs()); got != n {
		t.Errorf("provider execs after refused timeouts = %d; want %d", got, n)
	}
}

func TestExec(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxFileBytes: 1024, MaxOutputBytes: 100}})
	ws := acquire(t, h, in.Token, "exec")
	path := wsPath(ws.WorkspaceID, "/exec")
	h.Provider.OnExec(func(spec providers.ExecSpec) (providers.ExecResult, error) {
		return providers.ExecResult{ExitCode: 137, Stdout: []byte("out"), Stderr: []byte("err\x00"), StdoutTruncated: true,
			StdoutBytes: 500, StderrBytes: 4, TimedOut: true}, nil
	})

	stdin := "in\x00put"
	var res protocol.ExecResponse
	wantOK(t, "exec", do(t, h, request{Method: http.MethodPost, Path: path, Token: in.Token,
		Body: protocol.ExecRequest{Argv: []string{"git", "status", ""}, Dir: "/workspace/repo", StdinB64: b64(stdin)}}), http.StatusOK, &res)
	want := protocol.ExecResponse{ExitCode: 137, StdoutB64: b64("out"), StderrB64: b64("err\x00"), StdoutTruncated: true,
		TimedOut: true, StdoutBytes: 500, StderrBytes: 4}
	if res != want {
		t.Errorf("exec = %+v; want %+v", res, want)
	}
	spec := h.Provider.Execs()[0]
	if !slices.Equal(spec.Argv, []string{"git", "status", ""}) || spec.Dir != "/workspace/repo" || string(spec.Stdin) != stdin || spec.MaxOutputBytes != 100 {
		t.Errorf("exec spec argv, dir, stdin, max output = %q, %q, %q, %d; want [git status \"\"], /workspace/repo, %q, 100",
			spec.Argv, spec.Dir, spec.Stdin, spec.MaxOutputBytes, stdin)
	}
	wantOK(t, "stdin of exactly max_file_bytes", do(t, h, request{Method: http.MethodPost, Path: path, Token: in.Token,
		Body: protocol.ExecRequest{Argv: []string{"cat"}, StdinB64: b64(strings.Repeat("s", 1024))}}), http.StatusOK, nil)
	// Valid UTF-8, and a surrogate pair escaped, pass through unchanged.
	wantOK(t, "exec with non-ASCII argv", do(t, h, request{Method: http.MethodPost, Path: path, Token: in.Token,
		Body: `{"argv":["echo","d\u00e9j\u00e0 ` + "\u00e9" + `","\ud83d\ude00 \\ud800"]}`}), http.StatusOK, nil)
	if got, want := h.Provider.Execs()[2].Argv, []string{"echo", "déjà é", "😀 \\ud800"}; !slices.Equal(got, want) {
		t.Errorf("exec argv = %q; want %q", got, want)
	}

	execs := len(h.Provider.Execs())
	tests := []struct {
		name   string
		body   string
		status int
		code   protocol.Code
	}{
		{"argv missing", `{}`, 400, protocol.InvalidRequest},
		{"argv null", `{"argv":null}`, 400, protocol.InvalidRequest},
		{"argv empty", `{"argv":[]}`, 400, protocol.InvalidRequest},
		{"argv[0] empty", `{"argv":[""]}`, 400, protocol.InvalidRequest},
		{"argv NUL", `{"argv":["a\u0000b"]}`, 400, protocol.InvalidRequest},
		{"argv not strings", `{"argv":[1]}`, 400, protocol.InvalidRequest},
		{"argv too many", `{"argv":[` + strings.TrimSuffix(strings.Repeat(`"a",`, policy.MaxArgs+1), ",") + `]}`, 400, protocol.InvalidRequest},
		{"argv too long", `{"argv":["` + strings.Repeat("a", policy.MaxArgvBytes+1) + `"]}`, 400, protocol.InvalidRequest},
		{"dir relative", `{"argv":["true"],"dir":"repo"}`, 400, protocol.InvalidRequest},
		{"dir NUL", `{"argv":["true"],"dir":"/a\u0000"}`, 400, protocol.InvalidRequest},
		{"stdin not base64", `{"argv":["true"],"stdin_b64":"not base64!"}`, 400, protocol.InvalidRequest},
		{"stdin unpadded", `{"argv":["true"],"stdin_b64":"YQ"}`, 400, protocol.InvalidRequest},
		{"stdin URL alphabet", `{"argv":["true"],"stdin_b64":"-_-_"}`, 400, protocol.InvalidRequest},
		{"stdin with a newline", `{"argv":["true"],"stdin_b64":"aGVs\nbG8K"}`, 400, protocol.InvalidRequest},
		{"stdin with CRLF at the end", `{"argv":["true"],"stdin_b64":"aGVsbG8K\r\n"}`, 400, protocol.InvalidRequest},
		{"stdin over max_file_bytes", `{"argv":["true"],"stdin_b64":"` + b64(strings.Repeat("s", 1025)) + `"}`, 413, protocol.PayloadTooLarge},
	}
	for _, tt := range tests {
		wantError(t, tt.name, do(t, h, request{Method: http.MethodPost, Path: path, Token: in.Token, Body: tt.body}), tt.status, tt.code)
	}
	if got := len(h.Provider.Execs()); got != execs {
		t.Errorf("provider execs after refusals = %d; want %d", got, execs)
	}

	h.Provider.OnExec(func(providers.ExecSpec) (providers.ExecResult, error) {
		return providers.ExecResult{}, errors.New("vendor: connection reset")
	})
	wantError(t, "exec with a failing provider", do(t, h, request{Method: http.MethodPost, Path: path, Token: in.Token, Body: `{"argv":["true"]}`}), http.StatusBadGateway, protocol.UpstreamError)
	h.Provider.OnExec(nil)

	// The sandbox vanished at the vendor.
	if err := h.Provider.Provider.Terminate(context.Background(), providers.Sandbox{Ref: ws.WorkspaceID}); err != nil {
		t.Fatalf("fake terminate: %v", err)
	}
	wantError(t, "exec on a vanished sandbox", do(t, h, request{Method: http.MethodPost, Path: path, Token: in.Token, Body: `{"argv":["true"]}`}), http.StatusGone, protocol.WorkspaceGone)
}

func TestExecAfterRelease(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{})
	ws := acquire(t, h, in.Token, "gone")
	release(t, h, in.Token, ws.WorkspaceID)
	n := len(h.Provider.Execs())
	for _, r := range workspaceOps(in.Token, ws.WorkspaceID)[1:4] {
		wantError(t, "released: "+what(r), do(t, h, r), http.StatusGone, protocol.WorkspaceGone)
	}
	if got := len(h.Provider.Execs()); got != n {
		t.Errorf("provider execs after release = %d; want %d", got, n)
	}
	wantState(t, h, in.Token, ws.WorkspaceID, "after release", "terminated")
}

func TestExecAfterExpiry(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxLifetimeSeconds: 600}})
	ws := acquire(t, h, in.Token, "expiring")
	expires := parseWire(t, ws.ExpiresAt)
	g := newGate(t)
	h.Provider.OnTerminate(func(context.Context, providers.Sandbox) error {
		g.wait()
		return nil
	})

	h.Clock.Set(expires.Add(-time.Second))
	wantOK(t, "exec a second before expires_at", do(t, h, workspaceOps(in.Token, ws.WorkspaceID)[1]), http.StatusOK, nil)
	h.Clock.Set(expires)
	for _, r := range workspaceOps(in.Token, ws.WorkspaceID)[1:4] {
		wantError(t, "expired: "+what(r), do(t, h, r), http.StatusGone, protocol.WorkspaceGone)
	}
	// Status answers 410 too (spec §Acquire), and release below; the
	// list still shows the workspace's end.
	wantError(t, "expired: status", do(t, h, request{Method: http.MethodGet, Path: wsPath(ws.WorkspaceID), Token: in.Token}), http.StatusGone, protocol.WorkspaceGone)
	listed := func() protocol.Workspace {
		for _, w := range listAll(t, h, in.Token) {
			if w.WorkspaceID == ws.WorkspaceID {
				return w
			}
		}
		t.Fatalf("workspace %s not listed", ws.WorkspaceID)
		return protocol.Workspace{}
	}
	got := listed()
	if got.State != "terminating" || deref(got.TerminationReason) != "expired" || got.TerminatedAt != nil {
		t.Errorf("listed at expires_at: state, reason, terminated_at = %q, %v, %v; want terminating, expired, <nil>",
			got.State, deref(got.TerminationReason), deref(got.TerminatedAt))
	}
	if n := h.LiveCount(in); n != 0 {
		t.Errorf("live slots at expires_at = %d; want 0", n)
	}
	g.open()
	sgtest.WaitFor(t, "the expired workspace to terminate", func() bool {
		return listed().State == "terminated"
	})
	got = listed()
	if deref(got.TerminationReason) != "expired" || deref(got.TerminatedAt) != wire(expires) {
		t.Errorf("terminated: reason, terminated_at = %v, %v; want expired, %s", deref(got.TerminationReason), deref(got.TerminatedAt), wire(expires))
	}
	if n := h.Provider.Live(); n != 0 {
		t.Errorf("provider sandboxes after expiry = %d; want 0", n)
	}
	wantError(t, "exec after termination", do(t, h, workspaceOps(in.Token, ws.WorkspaceID)[1]), http.StatusGone, protocol.WorkspaceGone)
	wantError(t, "release after expiry", do(t, h, request{Method: http.MethodDelete, Path: wsPath(ws.WorkspaceID), Token: in.Token}), http.StatusGone, protocol.WorkspaceGone)
}

func TestFiles(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxFileBytes: 1024}})
	ws := acquire(t, h, in.Token, "files")
	readPath, writePath := wsPath(ws.WorkspaceID, "/files/read"), wsPath(ws.WorkspaceID, "/files/write")
	write := func(path, contents string) reply {
		return do(t, h, request{Method: http.MethodPost, Path: writePath, Token: in.Token,
			Body: protocol.WriteFileRequest{Path: path, ContentsB64: b64(contents)}})
	}
	read := func(path string) reply {
		return do(t, h, request{Method: http.MethodPost, Path: readPath, Token: in.Token, Body: protocol.ReadFileRequest{Path: path}})
	}

	for _, contents := range []string{"hello\x00world", "", strings.Repeat("f", 1024)} {
		rep := write("/workspace/dir/f.txt", contents)
		wantOK(t, "write", rep, http.StatusNoContent, nil)
		if len(rep.Body) != 0 {
			t.Errorf("write: body = %q; want none", rep.Body)
		}
		var got protocol.ReadFileResponse
		wantOK(t, "read", read("/workspace/dir/f.txt"), http.StatusOK, &got)
		if want := (protocol.ReadFileResponse{ContentsB64: b64(contents), SizeBytes: int64(len(contents))}); got != want {
			t.Errorf("read after writing %d bytes = {%d bytes, size_bytes %d}; want {%d bytes, size_bytes %d}",
				len(contents), len(got.ContentsB64), got.SizeBytes, len(want.ContentsB64), want.SizeBytes)
		}
	}

	fileNotFound := wantError(t, "read missing", read("/workspace/missing"), http.StatusNotFound, protocol.FileNotFound)
	wsNotFound := wantError(t, "read in an unknown workspace", do(t, h, request{Method: http.MethodPost,
		Path: wsPath(sandgate.NewID(sandgate.PrefixWorkspace), "/files/read"), Token: in.Token, Body: protocol.ReadFileRequest{Path: "/workspace/dir/f.txt"}}),
		http.StatusNotFound, protocol.NotFound)
	if fileNotFound.Message == wsNotFound.Message {
		t.Errorf("file_not_found and not_found messages are both %q; want them told apart", wsNotFound.Message)
	}
	wantError(t, "read a directory", read("/workspace/dir"), http.StatusUnprocessableEntity, protocol.NotAFile)
	wantError(t, "write over max_file_bytes", write("/workspace/big", strings.Repeat("f", 1025)), http.StatusRequestEntityTooLarge, protocol.FileTooLarge)
	wantError(t, "read the file never written", read("/workspace/big"), http.StatusNotFound, protocol.FileNotFound)
	if err := providers.WriteFileBytes(context.Background(), h.Provider.Provider, providers.Sandbox{Ref: ws.WorkspaceID}, "/workspace/big", make([]byte, 1025)); err != nil {
		t.Fatalf("fake write: %v", err)
	}
	wantError(t, "read over max_file_bytes", read("/workspace/big"), http.StatusRequestEntityTooLarge, protocol.FileTooLarge)

	h.Provider.OnWriteFile(func(string) error { return providers.ErrNotAFile })
	wantError(t, "write under a file", write("/workspace/dir/f.txt/x", "x"), http.StatusUnprocessableEntity, protocol.NotAFile)
	// A path the sandbox cannot write is the client's mistake: a 4xx that is
	// not retried, never 502 (a provider failure, retried five times).
	h.Provider.OnWriteFile(func(string) error { return fmt.Errorf("execfile: write: %w", providers.ErrNotWritable) })
	for _, path := range []string{"/usr/x", "/proc/self/x", "/workspace/read-only/x"} {
		e := wantError(t, "write to "+path, write(path, "x"), http.StatusUnprocessableEntity, protocol.NotAFile)
		if e.Retryable || e.Details["reason"] != "not_writable" {
			t.Errorf("write to %s: retryable, details = %v, %v; want false, reason not_writable", path, e.Retryable, e.Details)
		}
	}
	h.Provider.OnWriteFile(func(string) error { return errors.New("vendor: disk on fire") })
	wantError(t, "write with a failing provider", write("/workspace/x", "x"), http.StatusBadGateway, protocol.UpstreamError)
	h.Provider.OnWriteFile(nil)

	badPaths := []struct {
		name string
		path string
	}{
		{"empty", ""},
		{"relative", "workspace/f"},
		{"dot relative", "./f"},
		{"NUL", "/workspace/a\x00b"},
		{"too long", "/" + strings.Repeat("p", policy.MaxPathBytes)},
	}
	for _, bp := range badPaths {
		wantError(t, "read path "+bp.name, read(bp.path), http.StatusBadRequest, protocol.InvalidRequest)
		wantError(t, "write path "+bp.name, write(bp.path, "x"), http.StatusBadRequest, protocol.InvalidRequest)
	}
	wantOK(t, "write path of exactly 4096 bytes", write("/"+strings.Repeat("p", policy.MaxPathBytes-1), "x"), http.StatusNoContent, nil)
	for _, body := range []string{`{"path":"/workspace/x","contents_b64":"not base64!"}`, `{"path":"/workspace/x","contents_b64":"YQ"}`, `{"path":"/`,
		`{"path":"/workspace/x","contents_b64":"aGVs\nbG8K"}`, `{"path":"/workspace/x","contents_b64":"\naGVsbG8K"}`, `{"path":"/workspace/x","contents_b64":"aGVsbG8K\r"}`} {
		wantError(t, "write body "+body, do(t, h, request{Method: http.MethodPost, Path: writePath, Token: in.Token, Body: body}), http.StatusBadRequest, protocol.InvalidRequest)
	}
	wantError(t, "read with no path field", do(t, h, request{Method: http.MethodPost, Path: readPath, Token: in.Token, Body: `{}`}), http.StatusBadRequest, protocol.InvalidRequest)
}

func TestList(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxConcurrentWorkspaces: 10}})
	other := h.NewInstanceIn(in.AccountID, adminapi.Scope{})
	acquire(t, h, other.Token, "other")

	var ids []string
	for i := range 5 {
		if i == 3 {
			h.Clock.Advance(time.Second) // two creation times: cursors cross equal and distinct scores
		}
		ids = append(ids, acquire(t, h, in.Token, fmt.Sprintf("list-%d", i)).WorkspaceID)
	}
	release(t, h, in.Token, ids[1])
	release(t, h, in.Token, ids[4])

	list := func(query string) protocol.WorkspaceList {
		t.Helper()
		var l protocol.WorkspaceList
		wantOK(t, "list "+query, do(t, h, request{Method: http.MethodGet, Path: "/v1/workspaces" + query, Token: in.Token}), http.StatusOK, &l)
		return l
	}
	idsOf := func(ws []protocol.Workspace) []string {
		var out []string
		for _, w := range ws {
			out = append(out, w.WorkspaceID)
		}
		slices.Sort(out)
		return out
	}
	sorted := func(s ...string) []string { s = slices.Clone(s); slices.Sort(s); return s }
	live := sorted(ids[0], ids[2], ids[3])
	for _, q := range []string{"", "?state=live", "?state=live&limit=100"} {
		l := list(q)
		if got := idsOf(l.Workspaces); !slices.Equal(got, live) || l.NextCursor != nil {
			t.Errorf("list %q = %v, next %v; want %v, <nil>", q, got, deref(l.NextCursor), live)
		}
		for _, w := range l.Workspaces {
			if w.State != "running" {
				t.Errorf("list %q: %s state = %q; want running", q, w.WorkspaceID, w.State)
			}
		}
	}
	all := list("?state=all")
	if got := idsOf(all.Workspaces); !slices.Equal(got, sorted(ids...)) {
		t.Errorf("list all = %v; want %v", got, sorted(ids...))
	}
	for _, w := range all.Workspaces {
		wantState := "running"
		if w.WorkspaceID == ids[1] || w.WorkspaceID == ids[4] {
			wantState = "terminated"
		}
		if w.State != wantState {
			t.Errorf("list all: %s state = %q; want %q", w.WorkspaceID, w.State, wantState)
		}
	}

	for _, state := range []string{"all", "live"} {
		seen := map[string]int{}
		cursor := ""
		pages := 0
		for {
			q := "?state=" + state + "&limit=2"
			if cursor != "" {
				q += "&cursor=" + cursor
			}
			l := list(q)
			pages++
			if len(l.Workspaces) > 2 {
				t.Errorf("page %d of %s: %d workspaces; want at most 2", pages, state, len(l.Workspaces))
			}
			for _, w := range l.Workspaces {
				seen[w.WorkspaceID]++
			}
			if l.NextCursor == nil {
				break
			}
			cursor = *l.NextCursor
			if pages > 10 {
				t.Fatalf("paging %s: more than 10 pages; want 3 or fewer", state)
			}
		}
		want := ids
		if state == "live" {
			want = live
		}
		if len(seen) != len(want) {
			t.Errorf("paging %s saw %d workspaces; want %d", state, len(seen), len(want))
		}
		for _, id := range want {
			if seen[id] != 1 {
				t.Errorf("paging %s saw %s %d times; want once", state, id, seen[id])
			}
		}
	}

	for _, q := range []string{
		"?state=dead", "?state=LIVE",
		"?limit=0", "?limit=101", "?limit=abc", "?limit=-1", "?limit=1.5",
		"?cursor=!!!", "?cursor=" + base64.RawURLEncoding.EncodeToString([]byte("nocolon")),
		"?cursor=" + base64.RawURLEncoding.EncodeToString([]byte("-5:ws_x")),
		"?cursor=" + base64.RawURLEncoding.EncodeToString([]byte("abc:ws_x")),
		"?cursor=" + base64.RawURLEncoding.EncodeToString([]byte("5:")),
		"?foo=1", "?State=live",
	} {
		wantError(t, "list "+q, do(t, h, request{Method: http.MethodGet, Path: "/v1/workspaces" + q, Token: in.Token}), http.StatusBadRequest, protocol.InvalidRequest)
	}
}

func TestRelease(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{})
	ws := acquire(t, h, in.Token, "rel")
	h.Clock.Advance(90 * time.Second)
	end := h.Clock.Now()

	first := release(t, h, in.Token, ws.WorkspaceID)
	if first.State != "terminated" || deref(first.TerminationReason) != "released" || deref(first.TerminatedAt) != wire(end) {
		t.Errorf("release: state, reason, terminated_at = %q, %v, %v; want terminated, released, %s",
			first.State, deref(first.TerminationReason), deref(first.TerminatedAt), wire(end))
	}
	if m := first.MeteredSeconds; m == nil || *m != 90 {
		t.Errorf("release: metered_seconds = %v; want 90 (the provider's start and the release, both on the test clock)", deref(m))
	}
	var raw map[string]json.RawMessage
	_ = json.Unmarshal(do(t, h, request{Method: http.MethodGet, Path: wsPath(ws.WorkspaceID), Token: in.Token}).Body, &raw)
	for _, k := range []string{"terminated_at", "termination_reason", "metered_seconds"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("status after release has no %s", k)
		}
	}

	h.Clock.Advance(time.Minute)
	second := release(t, h, in.Token, ws.WorkspaceID)
	if !reflect.DeepEqual(second, first) {
		t.Errorf("second release = %+v; want %+v", second, first)
	}
	if got := getWorkspace(t, h, in.Token, ws.WorkspaceID); !reflect.DeepEqual(got, first) {
		t.Errorf("status after release = %+v; want %+v", got, first)
	}
	if n := h.Provider.Terminates(); n != 1 {
		t.Errorf("provider terminates = %d; want 1", n)
	}
	if n := h.LiveCount(in); n != 0 {
		t.Errorf("live slots after release = %d; want 0", n)
	}
	unknown := sandgate.NewID(sandgate.PrefixWorkspace)
	wantError(t, "release of an unknown id", do(t, h, request{Method: http.MethodDelete, Path: wsPath(unknown), Token: in.Token}), http.StatusNotFound, protocol.NotFound)
	wantError(t, "release of a malformed id", do(t, h, request{Method: http.MethodDelete, Path: wsPath("not%20an%20id"), Token: in.Token}), http.StatusBadRequest, protocol.InvalidRequest)
}

func TestReleaseTerminateFailure(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxConcurrentWorkspaces: 1}})
	ws := acquire(t, h, in.Token, "tf")
	h.Provider.OnTerminate(func(context.Context, providers.Sandbox) error { return errors.New("vendor: timeout") })

	got := release(t, h, in.Token, ws.WorkspaceID)
	if got.State != "terminating" || deref(got.TerminationReason) != "released" || got.TerminatedAt != nil || got.MeteredSeconds != nil {
		t.Errorf("release with a failing provider: state, reason, terminated_at, metered = %q, %v, %v, %v; want terminating, released, <nil>, <nil>",
			got.State, deref(got.TerminationReason), deref(got.TerminatedAt), deref(got.MeteredSeconds))
	}
	wantState(t, h, in.Token, ws.WorkspaceID, "after failed terminate", "terminating")
	if n := h.LiveCount(in); n != 0 {
		t.Errorf("live slots while terminating = %d; want 0", n)
	}
	wantError(t, "exec while terminating", do(t, h, workspaceOps(in.Token, ws.WorkspaceID)[1]), http.StatusGone, protocol.WorkspaceGone)
	// The slot was freed at release: another workspace fits.
	other := acquire(t, h, in.Token, "tf-2")

	h.Provider.OnTerminate(nil)
	got = release(t, h, in.Token, ws.WorkspaceID)
	if got.State != "terminated" || deref(got.TerminationReason) != "released" || got.TerminatedAt == nil {
		t.Errorf("release retried: state, reason, terminated_at = %q, %v, %v; want terminated, released, a time",
			got.State, deref(got.TerminationReason), deref(got.TerminatedAt))
	}
	release(t, h, in.Token, other.WorkspaceID)
	if n := h.Provider.Live(); n != 0 {
		t.Errorf("provider sandboxes = %d; want 0", n)
	}
}

func TestLogsHoldNoSecrets(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxFileBytes: 1024}})
	tok := in.Token
	const (
		argv    = "SECRET-ARGV-xyz"
		env     = "SECRET-ENV-xyz"
		stdin   = "SECRET-STDIN-xyz"
		stdout  = "SECRET-STDOUT-xyz"
		stderr  = "SECRET-STDERR-xyz"
		dir     = "/workspace/SECRET-PATH-xyz"
		content = "SECRET-CONTENT-xyz"
		field   = "SECRET-FIELD-xyz"
		query   = "SECRET-QUERY-xyz"
		route   = "SECRET-ROUTE-xyz"
		label   = "SECRET-LABEL-xyz"
	)
	unknownTok := token.New(token.Prefix)
	secrets := []string{tok.Reveal(), unknownTok.Reveal(), "sgt_SECRET-TOKEN-xyz", argv, env, stdin, stdout, stderr, dir, content, field, query, route, "SECRET-KEY-xyz", "SECRET-PATH-xyz", b64(content), b64(stdin)}

	h.Provider.OnExec(func(spec providers.ExecSpec) (providers.ExecResult, error) {
		return providers.ExecResult{Stdout: []byte(stdout), Stderr: []byte(stderr), StdoutBytes: int64(len(stdout))}, nil
	})
	cl := h.Client(tok)
	ctx := context.Background()
	ws, _, err := cl.Acquire(ctx, "logs-1", protocol.AcquireRequest{Label: label, Env: map[string]string{"API_KEY": env},
		Egress: &protocol.Egress{AllowedDomains: []string{}}, Agent: "ops-bot"})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	id := ws.WorkspaceID
	if _, err := cl.Exec(ctx, id, protocol.ExecRequest{Argv: []string{"sh", "-c", "echo " + argv}, Dir: dir, StdinB64: b64(stdin)}); err != nil {
		t.Fatalf("exec: %v", err)
	}
	if err := cl.WriteFile(ctx, id, dir+"/f", []byte(content)); err != nil {
		t.Fatalf("write: %v", err)
	}
	if b, err := cl.ReadFile(ctx, id, dir+"/f"); err != nil || string(b) != content {
		t.Fatalf("read = %q, %v; want %q, nil", b, err, content)
	}

	// Error paths, each with content in the request.
	post := func(path string, body any) reply {
		return do(t, h, request{Method: http.MethodPost, Path: path, Token: tok, Body: body})
	}
	wantError(t, "read missing", post(wsPath(id, "/files/read"), protocol.ReadFileRequest{Path: dir + "/missing"}), http.StatusNotFound, protocol.FileNotFound)
	wantError(t, "read NUL", post(wsPath(id, "/files/read"), protocol.ReadFileRequest{Path: dir + "\x00"}), http.StatusBadRequest, protocol.InvalidRequest)
	wantError(t, "write relative", post(wsPath(id, "/files/write"), protocol.WriteFileRequest{Path: "SECRET-PATH-xyz", ContentsB64: b64(content)}), http.StatusBadRequest, protocol.InvalidRequest)
	wantError(t, "write too large", post(wsPath(id, "/files/write"), protocol.WriteFileRequest{Path: dir, ContentsB64: b64(content + strings.Repeat("x", 1024))}), http.StatusRequestEntityTooLarge, protocol.FileTooLarge)
	wantError(t, "exec NUL", post(wsPath(id, "/exec"), protocol.ExecRequest{Argv: []string{argv + "\x00"}}), http.StatusBadRequest, protocol.InvalidRequest)
	wantError(t, "exec relative dir", post(wsPath(id, "/exec"), protocol.ExecRequest{Argv: []string{argv}, Dir: "SECRET-PATH-xyz"}), http.StatusBadRequest, protocol.InvalidRequest)
	wantError(t, "exec bad stdin", post(wsPath(id, "/exec"), `{"argv":["`+argv+`"],"stdin_b64":"`+stdin+`"}`), http.StatusBadRequest, protocol.InvalidRequest)
	wantError(t, "exec unknown field", post(wsPath(id, "/exec"), `{"argv":["`+argv+`"],"`+field+`":1}`), http.StatusBadRequest, protocol.InvalidRequest)
	wantError(t, "acquire bad env key", do(t, h, acquireReq(tok, "logs-2", map[string]any{"label": "x", "env": map[string]string{"SECRET-KEY-xyz": env}, "egress": map[string]any{"allowed_domains": []string{}}})), http.StatusBadRequest, protocol.InvalidRequest)
	wantError(t, "acquire conflict", do(t, h, acquireReq(tok, "logs-1", map[string]any{"label": label, "env": map[string]string{"API_KEY": env + "2"}, "egress": map[string]any{"allowed_domains": []string{}}})), http.StatusConflict, protocol.IdempotencyConflict)
	wantError(t, "list with secret query", do(t, h, request{Method: http.MethodGet, Path: "/v1/workspaces?" + query + "=1", Token: tok}), http.StatusBadRequest, protocol.InvalidRequest)
	wantError(t, "unknown route", do(t, h, request{Method: http.MethodGet, Path: "/v1/" + route, Token: tok}), http.StatusBadRequest, protocol.InvalidRequest)
	wantError(t, "malformed token", do(t, h, request{Method: http.MethodGet, Path: "/v1/lease", Header: map[string]string{"Authorization": "Bearer sgt_SECRET-TOKEN-xyz"}}), http.StatusUnauthorized, protocol.Unauthenticated)
	wantError(t, "unknown token", do(t, h, request{Method: http.MethodGet, Path: "/v1/lease", Token: unknownTok}), http.StatusUnauthorized, protocol.Unauthenticated)

	// Provider failures log at error level with their cause.
	h.Provider.OnExec(func(providers.ExecSpec) (providers.ExecResult, error) {
		return providers.ExecResult{}, errors.New("vendor: broken")
	})
	wantError(t, "exec failing", post(wsPath(id, "/exec"), protocol.ExecRequest{Argv: []string{argv}, StdinB64: b64(stdin), Dir: dir}), http.StatusBadGateway, protocol.UpstreamError)
	h.Provider.OnWriteFile(func(string) error { return errors.New("vendor: broken") })
	wantError(t, "write failing", post(wsPath(id, "/files/write"), protocol.WriteFileRequest{Path: dir + "/g", ContentsB64: b64(content)}), http.StatusBadGateway, protocol.UpstreamError)
	h.Provider.OnCreate(func(context.Context, providers.CreateSpec) error { return errors.New("vendor: broken") })
	wantError(t, "create failing", do(t, h, acquireReq(tok, "logs-3", map[string]any{"label": label, "env": map[string]string{"API_KEY": env}, "egress": map[string]any{"allowed_domains": []string{}}})), http.StatusBadGateway, protocol.UpstreamError)
	h.Provider.OnTerminate(func(context.Context, providers.Sandbox) error { return errors.New("vendor: broken") })
	release(t, h, tok, id)
	h.Provider.OnTerminate(nil)
	release(t, h, tok, id)
	h.RevokeTokens(in.ID)
	wantError(t, "revoked", do(t, h, request{Method: http.MethodGet, Path: "/v1/lease", Token: tok}), http.StatusUnauthorized, protocol.LeaseRevoked)

	logs := h.Logs.String()
	for _, want := range []string{`"msg":"request"`, `"code":"upstream_error"`, `"level":"ERROR"`, `"code":"lease_revoked"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs hold no %s; want the flow logged", want)
		}
	}
	for _, s := range secrets {
		if i := strings.Index(logs, s); i >= 0 {
			line := logs[strings.LastIndexByte(logs[:i], '\n')+1:]
			if j := strings.IndexByte(line, '\n'); j >= 0 {
				line = line[:j]
			}
			t.Errorf("logs hold the secret %q in %s; want it nowhere", s, line)
		}
	}
}

// TestFieldNamesAreExact: encoding/json would accept "LABEL" for "label";
// the spec wants an unknown (mis-cased) field to fail with 400.
func TestFieldNamesAreExact(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	tok := h.NewInstance(adminapi.Scope{}).Token
	for _, body := range []string{
		`{"LABEL":"x","egress":{"allowed_domains":[]}}`,
		`{"label":"x","Egress":{"allowed_domains":[]}}`,
		`{"label":"x","egress":{"Allowed_Domains":[]}}`,
	} {
		req, _ := http.NewRequest(http.MethodPost, h.URL()+"/v1/workspaces", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok.Reveal())
		req.Header.Set("Idempotency-Key", "exact-"+strconv.Itoa(len(body)))
		resp, err := h.HTTPClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST %s = %d; want 400", body, resp.StatusCode)
		}
	}
}

// TestExpiryAnswersAgree: a workspace released at its expires_at ended
// because it expired, and every answer says so: the release and a status
// read are 410 with reason expired, and the list shows reason expired.
// One whose release began before its deadline was released, whatever
// its provider took: after the deadline its status read and a second
// release agree (200, reason released).
func TestExpiryAnswersAgree(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxLifetimeSeconds: 600}})
	late := acquire(t, h, in.Token, "late")
	early := acquire(t, h, in.Token, "early")

	h.Provider.OnTerminate(func(context.Context, providers.Sandbox) error { return errors.New("vendor: timeout") })
	if got := release(t, h, in.Token, early.WorkspaceID); got.State != "terminating" {
		t.Fatalf("release with a failing provider = %q; want terminating", got.State)
	}
	h.Provider.OnTerminate(nil)

	h.Clock.Advance(600 * time.Second) // at expires_at
	for _, r := range []request{
		{Method: http.MethodDelete, Path: wsPath(late.WorkspaceID), Token: in.Token},
		{Method: http.MethodGet, Path: wsPath(late.WorkspaceID), Token: in.Token},
		{Method: http.MethodDelete, Path: wsPath(late.WorkspaceID), Token: in.Token},
	} {
		if e := wantError(t, what(r)+" at expires_at", do(t, h, r), http.StatusGone, protocol.WorkspaceGone); e.Details["reason"] != "expired" {
			t.Errorf("%s at expires_at: details %v; want reason expired", what(r), e.Details)
		}
	}

	got := getWorkspace(t, h, in.Token, early.WorkspaceID)
	again := release(t, h, in.Token, early.WorkspaceID)
	for _, w := range []protocol.Workspace{got, again} {
		if deref(w.TerminationReason) != "released" {
			t.Errorf("a workspace released before its deadline, after it: reason %v; want released", deref(w.TerminationReason))
		}
	}
	for _, w := range listAll(t, h, in.Token) {
		want := map[string]string{late.WorkspaceID: "expired", early.WorkspaceID: "released"}[w.WorkspaceID]
		if deref(w.TerminationReason) != want {
			t.Errorf("listed %s: reason %v; want %s", w.WorkspaceID, deref(w.TerminationReason), want)
		}
	}
}
