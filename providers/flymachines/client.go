package flymachines

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sandgate/sandgate"
)

// DefaultBaseURL is the public Machines API; FLY_FLAPS_BASE_URL replaces it.
const DefaultBaseURL = "https://api.machines.dev"

// maxBody bounds what is read of any response but an exec's. Every
// Machine's config carries the agent (config.files, about 8 MB of base64)
// and Fly echoes it in each answer holding a config; lists ask for
// summaries, without configs (list.go).
const maxBody = 256 << 20

// APIError is a non-2xx answer of the Machines API. Its text carries the
// status, the vendor's status code and the request id, never the body's
// message, which may quote what was sent.
type APIError struct {
	Op         string // e.g. "create machine"
	StatusCode int
	Status     string // the ErrorResponse's "status", e.g. "name_taken"
	RequestID  string // the fly-request-id header
	// Message is the vendor's text (ErrorResponse error or message, or the
	// raw body when it is not JSON). It is for tests and never rendered.
	Message string
}

func (e *APIError) Error() string {
	s := fmt.Sprintf("fly: %s: HTTP %d", e.Op, e.StatusCode)
	if e.Status != "" {
		s += " " + e.Status
	}
	if e.RequestID != "" {
		s += " (fly-request-id " + e.RequestID + ")"
	}
	return s
}

// statusIs reports whether err is an *APIError with one of the codes.
func statusIs(err error, codes ...int) bool {
	var ae *APIError
	if !errors.As(err, &ae) {
		return false
	}
	for _, c := range codes {
		if ae.StatusCode == c {
			return true
		}
	}
	return false
}

// retryable reports whether a request that failed with err may be sent
// again as is: 408, 429, 5xx and insufficient_capacity (sheet §1.1, §1.8).
func retryable(err error) bool {
	var ae *APIError
	if !errors.As(err, &ae) {
		return false
	}
	return ae.StatusCode == http.StatusRequestTimeout || ae.StatusCode == http.StatusTooManyRequests ||
		ae.StatusCode >= 500 || ae.Status == "insufficient_capacity"
}

// client is a small REST client of the Machines API. Safe for concurrent use.
type client struct {
	base  string // without a trailing slash, without /v1
	auth  sandgate.Secret
	http  *http.Client
	log   *slog.Logger
	sleep func(context.Context, time.Duration) error
}

// authHeader builds the Authorization header as fly-go does (sheet §1.1):
// any FlyV1/Bearer scheme is stripped, the rest split on commas; macaroons
// (fm1r_, fm1a_, fm2_) go out as "FlyV1 m1,m2", and only when there is none
// do user tokens go out as "Bearer t1,t2".
func authHeader(token string) string {
	s := strings.TrimSpace(token)
	for {
		l := strings.ToLower(s)
		switch {
		case strings.HasPrefix(l, "flyv1 "):
			s = strings.TrimSpace(s[len("flyv1 "):])
			continue
		case strings.HasPrefix(l, "bearer "):
			s = strings.TrimSpace(s[len("bearer "):])
			continue
		}
		break
	}
	var macaroons, users []string
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		prefix, _, _ := strings.Cut(part, "_")
		switch prefix {
		case "fm1r", "fm1a", "fm2":
			macaroons = append(macaroons, part)
		default:
			users = append(users, part)
		}
	}
	if len(macaroons) > 0 {
		return "FlyV1 " + strings.Join(macaroons, ",")
	}
	return "Bearer " + strings.Join(users, ",")
}

// call sends one request to path (below /v1) with body as JSON (nil: none)
// and decodes a 2xx answer into out (nil: discarded). GETs are retried on
// transport errors and retryable statuses; nothing else is.
func (c *client) call(ctx context.Context, op, method, path string, query url.Values, body, out any) error {
	attempts := 1
	if method == http.MethodGet {
		attempts = 3
	}
	var err error
	for i := range attempts {
		if i > 0 {
			if serr := c.sleep(ctx, backoff(i)); serr != nil {
				return err
			}
		}
		err = c.do(ctx, op, method, path, query, body, out, maxBody)
		if err == nil || ctx.Err() != nil {
			return err
		}
		var ae *APIError
		if errors.As(err, &ae) && !retryable(err) {
			return err
		}
	}
	return err
}

// backoff is the pause before attempt i (1-based), with jitter.
func backoff(i int) time.Duration {
	d := time.Duration(200*(1<<(i-1))) * time.Millisecond
	return d/2 + time.Duration(rand.Int64N(int64(d)))
}

// do sends one request; limit bounds the body it reads.
func (c *client) do(ctx context.Context, op, method, path string, query url.Values, body, out any, limit int64) error {
	u := c.base + "/v1" + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("fly: %s: %w", op, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return fmt.Errorf("fly: %s: %w", op, err)
	}
	req.Header.Set("Authorization", c.auth.Reveal())
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		// The *url.Error names the URL, which holds no secret: ids only.
		return fmt.Errorf("fly: %s: %w", op, err)
	}
	defer resp.Body.Close()
	rid := resp.Header.Get("fly-request-id")
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return fmt.Errorf("fly: %s: read answer (fly-request-id %s): %w", op, rid, err)
	}
	if int64(len(data)) > limit {
		return fmt.Errorf("fly: %s: answer over %d bytes (fly-request-id %s)", op, limit, rid)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		ae := &APIError{Op: op, StatusCode: resp.StatusCode, RequestID: rid}
		var er ErrorResponse
		if json.Unmarshal(data, &er) == nil && (er.Error != "" || er.Message != "" || er.Status != "") {
			ae.Status, ae.Message = er.Status, er.Error
			if ae.Message == "" {
				ae.Message = er.Message
			}
		} else {
			ae.Message = string(data) // not JSON: keep the raw text
		}
		c.log.Debug("fly api error", "op", op, "http_status", resp.StatusCode, "fly_status", ae.Status, "fly_request_id", rid)
		return ae
	}
	if out == nil || len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	if raw, ok := out.(*rawAnswer); ok {
		raw.contentType, raw.body = resp.Header.Get("Content-Type"), data
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		// Not the decoder's message: it may quote the body.
		return fmt.Errorf("fly: %s: undecodable answer (fly-request-id %s)", op, rid)
	}
	return nil
}

// rawAnswer receives a 2xx body as it came, with its Content-Type.
type rawAnswer struct {
	contentType string
	body        []byte
}
