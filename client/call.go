package client

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/protocol"
)

const (
	// maxBackoff caps the exponential backoff, so a large MaxAttempts does
	// not grow waits without bound.
	maxBackoff = 30 * time.Second
	// maxRetryAfter is the longest Retry-After the client waits out by
	// itself. A broker asking for more gets its error returned instead:
	// sleeping less than asked only burns an attempt, and sleeping longer
	// holds the caller hostage; Error.RetryAfter lets the caller decide.
	maxRetryAfter = 60 * time.Second
	// maxResponse bounds a 2xx body: exec output is two streams of at most
	// max_output_bytes each, and a file at most max_file_bytes, all base64.
	maxResponse = 64 << 20
	// maxErrorBody bounds a non-2xx body; the envelope is small, and a proxy's
	// error page is never read whole.
	maxErrorBody = 64 << 10
)

// Log keys of this package beside the root's sandgate.Key* ones.
const (
	keyMethod  = "method"
	keyRoute   = "route"
	keyAttempt = "attempt"
	keyWait    = "wait"
)

// call describes one logical request: one or more attempts with the same
// X-Request-Id and Idempotency-Key.
type call struct {
	op      string        // for error text: "acquire"
	method  string        // GET, POST, …
	route   string        // the route template, the only form that is logged
	path    string        // the concrete path below the base, ids escaped
	query   url.Values    // nil for none
	body    any           // marshalled once; nil sends no body
	idemKey string        // Idempotency-Key; "" sends none
	retry   bool          // idempotent: retried per spec §Idempotency and retries
	timeout time.Duration // per attempt; 0 means Client.timeout
	ok      []int         // the 2xx statuses this call expects
	out     any           // decoded from a 2xx body when non-nil
}

// transportError marks a failure with no usable answer: the only kind that
// is retried without a status.
type transportError struct{ err error }

func (e *transportError) Error() string { return e.err.Error() }
func (e *transportError) Unwrap() error { return e.err }

// do runs k and returns the 2xx status it got. Errors are wrapped with the
// operation's name; a non-2xx answer is an *Error in the chain.
func (c *Client) do(ctx context.Context, k call) (int, error) {
	var payload []byte
	if k.body != nil {
		var err error
		if payload, err = json.Marshal(k.body); err != nil {
			return 0, fmt.Errorf("client: %s: encode request: %w", k.op, err)
		}
	}
	reqID := newRequestID()
	attempts := 1
	if k.retry {
		attempts = c.maxAttempts
	}
	for attempt := 1; ; attempt++ {
		status, err := c.attempt(ctx, k, payload, reqID, attempt)
		if err == nil {
			return status, nil
		}
		var te *transportError
		if !k.retry && errors.As(err, &te) {
			// spec §Operations, exec: on a transport error or timeout the
			// outcome is unknown; the caller reports it, never retries.
			return 0, fmt.Errorf("client: %s: %w: %w", k.op, ErrOutcomeUnknown, err)
		}
		if ctx.Err() != nil {
			// The caller gave up; its context error is already in err's
			// chain when the request was cut.
			return 0, fmt.Errorf("client: %s: %w", k.op, err)
		}
		wait, again := c.retryWait(err, attempt)
		if !k.retry || attempt >= attempts || !again {
			return 0, fmt.Errorf("client: %s: %w", k.op, err)
		}
		attrs := []slog.Attr{
			slog.String(keyMethod, k.method), slog.String(keyRoute, k.route),
			slog.Int(keyAttempt, attempt), slog.Duration(keyWait, wait),
		}
		if e := (*Error)(nil); errors.As(err, &e) {
			attrs = append(attrs, slog.Int(sandgate.KeyStatus, e.Status), slog.String(sandgate.KeyCode, string(e.Code)),
				slog.String(sandgate.KeyRequestID, e.RequestID))
		}
		c.log.LogAttrs(ctx, slog.LevelWarn, "broker call retrying", attrs...)
		if serr := c.sleep(ctx, wait); serr != nil {
			return 0, fmt.Errorf("client: %s: %w; last attempt: %w", k.op, serr, err)
		}
	}
}

// retryWait reports whether err may be retried (spec §Idempotency and
// retries: transport errors, 409 idempotency_in_progress, 429 rate_limited,
// 502 and 503), and how long to wait before the next attempt.
func (c *Client) retryWait(err error, attempt int) (time.Duration, bool) {
	var te *transportError
	if errors.As(err, &te) {
		return c.backoff(attempt), true
	}
	var e *Error
	if !errors.As(err, &e) {
		return 0, false // a decode error or a bad request: retrying cannot help
	}
	switch {
	case e.Status == http.StatusConflict && e.Code == protocol.IdempotencyInProgress,
		e.Status == http.StatusTooManyRequests && e.Code == protocol.RateLimited,
		e.Status == http.StatusBadGateway,
		e.Status == http.StatusServiceUnavailable:
	default:
		return 0, false
	}
	wait := c.backoff(attempt)
	if e.RetryAfter > wait {
		if e.RetryAfter > maxRetryAfter {
			return 0, false
		}
		wait = e.RetryAfter
	}
	return wait, true
}

// backoff returns the wait after the attempt-th attempt: BaseBackoff doubled
// per retry, capped, plus up to half again as jitter so that clients
// refused together do not come back together.
func (c *Client) backoff(attempt int) time.Duration {
	limit := max(maxBackoff, c.baseBackoff)
	d := c.baseBackoff
	for i := 1; i < attempt && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	return d + mrand.N(d/2+1)
}

// attempt sends k once, under its own timeout.
func (c *Client) attempt(ctx context.Context, k call, payload []byte, reqID string, n int) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(k.timeout, c.timeout))
	defer cancel()

	target := c.base + k.path
	if len(k.query) > 0 {
		target += "?" + k.query.Encode()
	}
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, k.method, target, body)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", c.auth)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.userAgent)
	req.Header.Set(protocol.HeaderRequestID, reqID)
	if payload != nil {
		req.Header.Set("Content-Type", "application/json; charset=utf-8")
	}
	if k.idemKey != "" {
		req.Header.Set(protocol.HeaderIdempotencyKey, k.idemKey)
	}

	attrs := []slog.Attr{
		slog.String(keyMethod, k.method), slog.String(keyRoute, k.route), slog.Int(keyAttempt, n),
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		// The error text is not logged: it holds the URL, and the rule is
		// method, route, status, request id and code only.
		c.log.LogAttrs(ctx, slog.LevelDebug, "broker call failed",
			append(attrs, slog.String(sandgate.KeyRequestID, reqID),
				slog.Bool("timeout", errors.Is(err, context.DeadlineExceeded)))...)
		return 0, &transportError{err}
	}
	defer resp.Body.Close()

	respID := cmp.Or(resp.Header.Get(protocol.HeaderRequestID), reqID)
	attrs = append(attrs, slog.Int(sandgate.KeyStatus, resp.StatusCode), slog.String(sandgate.KeyRequestID, respID))

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := readError(resp, respID)
		c.log.LogAttrs(ctx, slog.LevelDebug, "broker call refused", append(attrs, slog.String(sandgate.KeyCode, string(e.Code)))...)
		return resp.StatusCode, e
	}
	c.log.LogAttrs(ctx, slog.LevelDebug, "broker call", attrs...)

	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		// The answer was cut; an idempotent call may ask again.
		return 0, &transportError{fmt.Errorf("read response: %w", err)}
	}
	if len(raw) > maxResponse {
		return 0, fmt.Errorf("response over %d bytes (request %s)", maxResponse, respID)
	}
	if !slices.Contains(k.ok, resp.StatusCode) {
		return 0, fmt.Errorf("unexpected status %d (request %s)", resp.StatusCode, respID)
	}
	if k.out != nil && resp.StatusCode != http.StatusNoContent {
		if err := json.Unmarshal(raw, k.out); err != nil {
			// The JSON error quotes no more than an offset and a type.
			return 0, fmt.Errorf("decode %d response (request %s): %w", resp.StatusCode, respID, err)
		}
	}
	return resp.StatusCode, nil
}

// readError turns a non-2xx answer into an *Error. A 3xx is one too: the
// client never follows a redirect (spec §Conventions).
func readError(resp *http.Response, reqID string) *Error {
	e := &Error{
		Status:     resp.StatusCode,
		RequestID:  reqID,
		RetryAfter: parseRetryAfter(resp.Header.Get(protocol.HeaderRetryAfter)),
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		e.Message = "redirect not followed"
		return e
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var env protocol.Envelope
	if json.Unmarshal(raw, &env) == nil && env.Error.Code != "" {
		e.Code = env.Error.Code
		e.Message = capMessage(env.Error.Message)
		e.Retryable = env.Error.Retryable
		e.Details = env.Error.Details
		return e
	}
	// spec §Errors: not the envelope, still an error, keyed by status; the
	// body itself is never kept.
	e.Retryable = resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusServiceUnavailable
	return e
}

// parseRetryAfter reads delay-seconds or an HTTP date; 0 when absent or
// unreadable.
func parseRetryAfter(v string) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		// Anything past a day is as good as a day, and cannot overflow.
		return time.Duration(min(n, 86400)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return min(d, 24*time.Hour)
		}
	}
	return 0
}

// newRequestID returns an X-Request-Id of the spec's grammar
// ([A-Za-z0-9._-], at most 64): "sgc-" and 32 hex digits.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "sgc-" + hex.EncodeToString(b[:])
}

// sleepCtx waits d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// pathID escapes a broker-minted id as one path segment. Ids are opaque
// (spec §Identifiers), so the client checks only what would change the
// route: empty, "." and "..".
func pathID(what, id string) (string, error) {
	if id == "" || id == "." || id == ".." {
		return "", fmt.Errorf("client: invalid %s", what)
	}
	return url.PathEscape(id), nil
}
