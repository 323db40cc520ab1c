// Package client is a Go client of the execution broker protocol v1 that
// follows the spec's client checklist: HTTPS only, no redirects, the token in
// the Authorization header only, per-call timeouts, and retries of idempotent
// calls with the same Idempotency-Key. The e2e tests and `sandgate
// conformance` drive a broker through it.
//
// The client is a convenience, not a control (spec §Trust model): it checks
// only what it needs to build a request, and leaves every limit and grammar
// rule to the broker, so that conformance can probe the broker's refusals.
package client

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate"
)

// Defaults of Config's zero fields.
const (
	// DefaultTimeout bounds each attempt of every call but Exec (spec §Client
	// checklist: "others 60 s").
	DefaultTimeout = 60 * time.Second
	// DefaultMaxAttempts and DefaultBaseBackoff are the spec's retry budget
	// (§Idempotency and retries: "starting at 1 s with jitter, at most 5
	// attempts").
	DefaultMaxAttempts = 5
	DefaultBaseBackoff = time.Second
	// DefaultUserAgent is sent when Config.UserAgent is empty.
	DefaultUserAgent = "sandgate-client/1"
)

// Config configures a Client. A zero field means the default noted beside it.
type Config struct {
	// Endpoint is the broker's base URL: https, with a host and no userinfo,
	// query or fragment; it may carry a path prefix. Required.
	Endpoint string
	// Token is the bearer token. It is trimmed and must not be empty; it is
	// sent only in the Authorization header. Required.
	Token sandgate.Secret
	// RootCAs verifies the broker's certificate; nil means the system pool.
	RootCAs *x509.CertPool
	// HTTPClient is for tests; nil means the client builds its own. It is
	// copied, never changed: the copy never follows redirects and has no
	// client-wide Timeout (each attempt has its own). When its Transport is
	// nil or an *http.Transport, the copy uses a clone that requires TLS 1.2
	// and, when RootCAs is set, trusts RootCAs. Any other RoundTripper is used
	// as is and owns its TLS settings.
	HTTPClient *http.Client
	// Timeout bounds each attempt of every call but Exec; 0 means 60s. Exec
	// waits timeout_seconds + 30s (spec §Client checklist).
	Timeout time.Duration
	// MaxAttempts bounds the attempts of a retried call; 0 means 5.
	MaxAttempts int
	// BaseBackoff is the first retry's backoff, doubled on each retry; 0
	// means 1s. Tests set it small.
	BaseBackoff time.Duration
	// UserAgent is sent as User-Agent; empty means DefaultUserAgent.
	UserAgent string
	// Logger receives one debug line per attempt and a warning per retry,
	// with only the method, route template, status, request id and error
	// code. nil means no logs.
	Logger *slog.Logger
}

// Client calls one broker with one token. It is safe for concurrent use.
type Client struct {
	base        string // scheme://host[/prefix], no trailing slash
	auth        string // "Bearer " + token; never logged or rendered
	hc          *http.Client
	timeout     time.Duration
	maxAttempts int
	baseBackoff time.Duration
	userAgent   string
	log         *slog.Logger

	// sleep waits between attempts; export_test.go replaces it so that
	// tests see the chosen waits without waiting.
	sleep func(ctx context.Context, d time.Duration) error

	mu sync.Mutex
	// execDefault is the lease's default_exec_timeout_seconds, cached by the
	// first successful Lease so that Exec derives its HTTP timeout without
	// a lease read per call.
	execDefault    int64
	execDefaultSet bool
}

// New validates c, fills its defaults and returns a ready Client. It makes
// no request; Lease is the connection test.
func New(c Config) (*Client, error) {
	base, err := parseEndpoint(c.Endpoint)
	if err != nil {
		return nil, err
	}
	// spec §Credential: trim, require non-empty, otherwise never parse. The
	// one exception is a control character, which net/http cannot send as a
	// header value; refusing it here fails once instead of on every call.
	token := strings.TrimSpace(c.Token.Reveal())
	if token == "" {
		return nil, errors.New("client: token is empty")
	}
	if strings.ContainsFunc(token, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return nil, errors.New("client: token contains a control character")
	}
	if c.Timeout < 0 || c.MaxAttempts < 0 || c.BaseBackoff < 0 {
		return nil, errors.New("client: timeout, max attempts and base backoff must not be negative")
	}
	cl := &Client{
		base:        base,
		auth:        "Bearer " + token,
		hc:          httpClient(c.HTTPClient, c.RootCAs),
		timeout:     cmp.Or(c.Timeout, DefaultTimeout),
		maxAttempts: cmp.Or(c.MaxAttempts, DefaultMaxAttempts),
		baseBackoff: cmp.Or(c.BaseBackoff, DefaultBaseBackoff),
		userAgent:   cmp.Or(c.UserAgent, DefaultUserAgent),
		log:         c.Logger,
		sleep:       sleepCtx,
	}
	if cl.log == nil {
		cl.log = slog.New(slog.DiscardHandler)
	}
	return cl, nil
}

// parseEndpoint checks the spec's base URL rules (§Conventions) and returns
// the URL that request paths are appended to. Its errors never quote the
// endpoint, which could carry a password in its userinfo.
func parseEndpoint(raw string) (string, error) {
	// A '?' or '#' can only start a query or fragment; checking the raw
	// string also catches an empty one ("https://h/?"), which url.URL drops.
	if strings.ContainsAny(raw, "?#") {
		return "", errors.New("client: endpoint must not carry a query or fragment")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", errors.New("client: endpoint is not a valid URL")
	}
	if u.Scheme != "https" {
		return "", errors.New("client: endpoint must be an https URL")
	}
	if u.User != nil {
		return "", errors.New("client: endpoint must not carry userinfo")
	}
	if u.Opaque != "" || u.Hostname() == "" {
		return "", errors.New("client: endpoint must have a host")
	}
	// The prefix keeps its escaping; a trailing slash is dropped so that
	// "/v1/…" joins without a double slash.
	return "https://" + u.Host + strings.TrimRight(u.EscapedPath(), "/"), nil
}

// httpClient returns a copy of hc (or a new client) that never follows a
// redirect, because a redirect could carry the Authorization header to a
// host the operator never configured (spec §Conventions).
func httpClient(hc *http.Client, roots *x509.CertPool) *http.Client {
	var out http.Client
	if hc != nil {
		out = *hc
	}
	switch t := out.Transport.(type) {
	case nil:
		base, ok := http.DefaultTransport.(*http.Transport)
		if !ok {
			base = &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true}
		}
		out.Transport = secureTransport(base, roots)
	case *http.Transport:
		out.Transport = secureTransport(t, roots)
	}
	out.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	// Each attempt carries its own deadline; a client-wide Timeout would cut
	// a long exec short.
	out.Timeout = 0
	// Requests are stateless: the token is the only credential.
	out.Jar = nil
	return &out
}

// secureTransport clones t with TLS 1.2 as the minimum and roots, when set,
// as the trusted CAs.
func secureTransport(t *http.Transport, roots *x509.CertPool) *http.Transport {
	t = t.Clone()
	tc := &tls.Config{}
	if t.TLSClientConfig != nil {
		tc = t.TLSClientConfig.Clone()
	}
	if tc.MinVersion < tls.VersionTLS12 {
		tc.MinVersion = tls.VersionTLS12
	}
	if roots != nil {
		tc.RootCAs = roots
	}
	t.TLSClientConfig = tc
	return t
}
