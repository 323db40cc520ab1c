package adminapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/protocol"
)

// Client calls the operator API. `sandgate admin` is built on it.
type Client struct {
	base  string
	token sandgate.Secret
	http  *http.Client
}

// NewClient returns a client of the operator API at baseURL (for example
// http://127.0.0.1:8444).
func NewClient(baseURL string, tok sandgate.Secret, hc *http.Client) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("admin URL must be http(s)://host[:port], got %q", baseURL)
	}
	if strings.TrimSpace(tok.Reveal()) == "" {
		return nil, fmt.Errorf("an operator token is required (--token or SANDGATE_ADMIN_TOKEN)")
	}
	if hc == nil {
		hc = &http.Client{Timeout: 60 * time.Second}
	}
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Client{base: strings.TrimRight(baseURL, "/") + "/admin/v1", token: tok, http: hc}, nil
}

// APIError is a refusal from the operator API.
type APIError struct {
	Status  int
	Code    protocol.Code
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s (%d %s)", e.Message, e.Status, e.Code)
}

// Do sends one request and decodes the answer into out (when non-nil).
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	resp, err := c.send(ctx, method, path, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("operator API: read answer: %w", err)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("operator API: decode answer: %w", err)
		}
	}
	return nil
}

// Stream sends a GET and copies the answer's body to w as it arrives, for
// answers of any length (the audit export).
func (c *Client) Stream(ctx context.Context, path string, w io.Writer) error {
	resp, err := c.send(ctx, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("operator API: read answer: %w", err)
	}
	return nil
}

// send sends one request. A refusal is returned as an *APIError, with the
// body closed; otherwise the caller closes the body.
func (c *Client) send(ctx context.Context, method, path string, in any) (*http.Response, error) {
	req, err := NewRequest(ctx, method, c.base+path, c.token, in)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", "sandgate-admin")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("operator API: %w", err)
	}
	if resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return nil, ParseError(resp.StatusCode, b)
}

// NewRequest returns a request of the operator API at url with the
// operator token tok and in, when non-nil, as its JSON body.
func NewRequest(ctx context.Context, method, url string, tok sandgate.Secret, in any) (*http.Request, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok.Reveal())
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

// ParseError returns the refusal an answer of status with body is: the
// error envelope's code and message, or the status text when body holds
// no envelope.
func ParseError(status int, body []byte) *APIError {
	var env protocol.Envelope
	if json.Unmarshal(body, &env) == nil && env.Error.Code != "" {
		return &APIError{Status: status, Code: env.Error.Code, Message: env.Error.Message}
	}
	return &APIError{Status: status, Message: http.StatusText(status)}
}
