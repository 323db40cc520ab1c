package flysprites

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate"
)

// client speaks the Sprites REST API (fact sheet §1–§4, §6, §8). It never
// puts the token, a path, a body or an env value into an error.
type client struct {
	base    *url.URL // e.g. https://api.sprites.dev, no trailing slash
	token   sandgate.Secret
	hc      *http.Client
	timeout time.Duration // per REST call (sheet §1: sprites-go uses 30s)
	retries int           // how often a 429 is retried
	maxWait time.Duration // the longest retry_after_seconds honoured
}

// apiError is a status ≥ 400 with the vendor's error body (sheet §2) or,
// for the fs API, its own body {error, code, path}. Message is kept for
// logs only; it never reaches a client.
type apiError struct {
	Op         string
	Status     int
	Code       string // `error` of the general body, or `code` of the fs body
	RetryAfter time.Duration
}

func (e *apiError) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("sprites: %s: status %d (%s)", e.Op, e.Status, e.Code)
	}
	return fmt.Sprintf("sprites: %s: status %d", e.Op, e.Status)
}

// statusOf returns the HTTP status of an *apiError in err's chain, or 0.
func statusOf(err error) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

// errorBody is the general error body of sheet §2, with the fs API's
// `code` (sheet §2, fsError) beside it. `error` is a string in both.
type errorBody struct {
	Error             string `json:"error"`
	Code              string `json:"code"`
	Message           string `json:"message"`
	RetryAfterSeconds int    `json:"retry_after_seconds"`
}

// readError decodes a status ≥ 400. Only the machine code is kept: the
// message and a non-JSON body may quote what was sent.
func readError(op string, resp *http.Response) *apiError {
	e := &apiError{Op: op, Status: resp.StatusCode}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body errorBody
	if json.Unmarshal(b, &body) == nil {
		e.Code = body.Error
		if body.Code != "" {
			e.Code = body.Code
		}
		if body.RetryAfterSeconds > 0 {
			e.RetryAfter = time.Duration(body.RetryAfterSeconds) * time.Second
		}
	}
	if e.RetryAfter == 0 {
		// sheet §2: prefer retry_after_seconds, else Retry-After (seconds).
		if s, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && s > 0 {
			e.RetryAfter = time.Duration(s) * time.Second
		}
	}
	// A code is a short machine name; anything else (a message that may
	// quote a path) is not kept.
	if !machineCode(e.Code) {
		e.Code = ""
	}
	return e
}

func machineCode(s string) bool {
	if len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// request is one REST call.
type request struct {
	op     string // for errors: "create", "get", …
	method string
	path   string // already escaped, under /v1/
	query  url.Values
	json   any    // a JSON body, or nil
	raw    []byte // a raw body (fs write), when json is nil
	accept []int  // the success statuses
	// stream: the caller reads resp.Body (and closes it); no call timeout.
	stream bool
}

func (c *client) url(path string, q url.Values) string {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawPath = ""
	if len(q) > 0 {
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// do runs r, retrying a 429 after the time the vendor asks for (sheet §2)
// up to c.retries times, and returns the response of an accepted status.
// concurrent_sprite_limit_exceeded is not retried: waiting does not clear it.
func (c *client) do(ctx context.Context, r request) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		resp, cancel, err := c.once(ctx, r)
		if err == nil {
			// The caller reads the body (within the call's timeout,
			// unless it streams); closing it ends the call.
			resp.Body = cancelOnClose{resp.Body, cancel}
			return resp, nil
		}
		cancel()
		var ae *apiError
		if !errors.As(err, &ae) || ae.Status != http.StatusTooManyRequests ||
			ae.Code == "concurrent_sprite_limit_exceeded" || attempt >= c.retries {
			return nil, err
		}
		wait := ae.RetryAfter
		if wait <= 0 {
			wait = time.Second
		}
		if wait > c.maxWait {
			return nil, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("sprites: %s: %w", r.op, context.Cause(ctx))
		case <-t.C:
		}
	}
}

func (c *client) once(ctx context.Context, r request) (*http.Response, context.CancelFunc, error) {
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if !r.stream {
		cctx, cancel = context.WithTimeout(ctx, c.timeout)
	}
	var body io.Reader
	ctype := ""
	switch {
	case r.json != nil:
		b, err := json.Marshal(r.json)
		if err != nil {
			return nil, cancel, fmt.Errorf("sprites: %s: %w", r.op, err)
		}
		body, ctype = bytes.NewReader(b), "application/json"
	case r.raw != nil:
		body, ctype = bytes.NewReader(r.raw), "application/octet-stream"
	}
	req, err := http.NewRequestWithContext(cctx, r.method, c.url(r.path, r.query), body)
	if err != nil {
		return nil, cancel, fmt.Errorf("sprites: %s: %w", r.op, err)
	}
	if r.raw != nil {
		req.ContentLength = int64(len(r.raw))
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	req.Header.Set("Authorization", "Bearer "+c.token.Reveal())
	resp, err := c.hc.Do(req)
	if err != nil {
		// *url.Error quotes the URL, which holds paths: keep the cause only.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, cancel, fmt.Errorf("sprites: %s: %w", r.op, err)
	}
	for _, s := range r.accept {
		if resp.StatusCode == s {
			return resp, cancel, nil
		}
	}
	defer resp.Body.Close()
	if resp.StatusCode < 400 {
		return nil, cancel, &apiError{Op: r.op, Status: resp.StatusCode}
	}
	return nil, cancel, readError(r.op, resp)
}

// cancelOnClose ends a call's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// call runs r and decodes a JSON answer into out (nil: the body is dropped).
func (c *client) call(ctx context.Context, r request, out any) error {
	resp, err := c.do(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(out); err != nil {
		return fmt.Errorf("sprites: %s: decode the answer: %w", r.op, err)
	}
	return nil
}

// spritePath is /v1/sprites/{name}[suffix].
func spritePath(name, suffix string) string {
	return "/v1/sprites/" + url.PathEscape(name) + suffix
}

// Wire types of sheet §4 and §8.

// spriteConfig is CreateSpriteRequest.config and SpriteInfo.config.
type spriteConfig struct {
	RAMMB     int    `json:"ram_mb,omitempty"`
	CPUs      int    `json:"cpus,omitempty"`
	Region    string `json:"region,omitempty"`
	StorageGB int    `json:"storage_gb,omitempty"`
}

type createRequest struct {
	Name        string            `json:"name"`
	Config      *spriteConfig     `json:"config,omitempty"`
	Environment map[string]string `json:"environment,omitempty"`
	Labels      []string          `json:"labels,omitempty"` // an array of strings, not a map
}

type spriteInfo struct {
	ID        string        `json:"id"`
	Name      string        `json:"name"`
	Status    string        `json:"status"`
	Config    *spriteConfig `json:"config,omitempty"`
	CreatedAt time.Time     `json:"created_at"`
	Labels    []string      `json:"labels,omitempty"`
}

type listResponse struct {
	Sprites               []spriteInfo `json:"sprites"`
	HasMore               bool         `json:"has_more"`
	NextContinuationToken string       `json:"next_continuation_token"`
}

type rule struct {
	Domain  string `json:"domain,omitempty"`
	Action  string `json:"action,omitempty"`
	Include string `json:"include,omitempty"`
}

type networkPolicy struct {
	Rules []rule `json:"rules"`
}

func (c *client) create(ctx context.Context, req createRequest) error {
	return c.call(ctx, request{op: "create", method: http.MethodPost, path: "/v1/sprites", json: req,
		accept: []int{http.StatusCreated}}, nil)
}

func (c *client) get(ctx context.Context, name string) (spriteInfo, error) {
	var info spriteInfo
	err := c.call(ctx, request{op: "get", method: http.MethodGet, path: spritePath(name, ""),
		accept: []int{http.StatusOK}}, &info)
	return info, err
}

// delete removes the sprite and its checkpoints; 404 is "already gone".
func (c *client) delete(ctx context.Context, name string) error {
	err := c.call(ctx, request{op: "delete", method: http.MethodDelete, path: spritePath(name, ""),
		accept: []int{http.StatusOK, http.StatusNoContent}}, nil)
	if statusOf(err) == http.StatusNotFound {
		return nil
	}
	return err
}

// listPageSize is 50: sprites-go asks for 100, the docs say 1–50 (sheet
// §4, UNCERTAIN), so the size both readings accept.
const listPageSize = 50

// list returns every sprite whose name starts with prefix, following the
// continuation tokens until has_more is false or the token is empty.
func (c *client) list(ctx context.Context, prefix string) ([]spriteInfo, error) {
	var all []spriteInfo
	token := ""
	for page := 0; ; page++ {
		if page > 10000 {
			return nil, errors.New("sprites: list: too many pages")
		}
		q := url.Values{"prefix": {prefix}, "max_results": {strconv.Itoa(listPageSize)}}
		if token != "" {
			q.Set("continuation_token", token)
		}
		var resp listResponse
		if err := c.call(ctx, request{op: "list", method: http.MethodGet, path: "/v1/sprites", query: q,
			accept: []int{http.StatusOK}}, &resp); err != nil {
			return nil, err
		}
		all = append(all, resp.Sprites...)
		if !resp.HasMore || resp.NextContinuationToken == "" {
			return all, nil
		}
		token = resp.NextContinuationToken
	}
}

// setPolicy replaces the sprite's network policy. sprites-go requires 204,
// the docs say 200 with the rules echoed: both are accepted (sheet §8).
func (c *client) setPolicy(ctx context.Context, name string, p networkPolicy) error {
	return c.call(ctx, request{op: "set network policy", method: http.MethodPost, path: spritePath(name, "/policy/network"),
		json: p, accept: []int{http.StatusOK, http.StatusNoContent}}, nil)
}

func (c *client) getPolicy(ctx context.Context, name string) (networkPolicy, error) {
	var p networkPolicy
	err := c.call(ctx, request{op: "get network policy", method: http.MethodGet, path: spritePath(name, "/policy/network"),
		accept: []int{http.StatusOK}}, &p)
	return p, err
}

// killSession signals an exec session (sheet §3, §5.4); 410 means it had
// already exited, which is success here.
func (c *client) killSession(ctx context.Context, name, session, signal string) error {
	q := url.Values{"signal": {signal}, "timeout": {"0s"}}
	err := c.call(ctx, request{op: "kill session", method: http.MethodPost,
		path: spritePath(name, "/exec/"+url.PathEscape(session)+"/kill"), query: q,
		accept: []int{http.StatusOK}}, nil)
	if statusOf(err) == http.StatusGone {
		return nil
	}
	return err
}
