package admin

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
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token.Reveal())
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("operator API: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("operator API: read answer: %w", err)
	}
	if resp.StatusCode >= 300 {
		var env protocol.Envelope
		if json.Unmarshal(b, &env) == nil && env.Error.Code != "" {
			return &APIError{Status: resp.StatusCode, Code: env.Error.Code, Message: env.Error.Message}
		}
		return &APIError{Status: resp.StatusCode, Message: http.StatusText(resp.StatusCode)}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("operator API: decode answer: %w", err)
		}
	}
	return nil
}
