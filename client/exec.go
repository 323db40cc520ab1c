package client

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"time"

	"github.com/sandgate/sandgate/protocol"
)

// execGrace is added to an exec's timeout_seconds for its HTTP timeout (spec
// §Client checklist), so the broker's own timeout answers first.
const execGrace = 30 * time.Second

// maxExecSeconds keeps timeout_seconds + 30s inside a time.Duration; the
// broker clamps far below it anyway.
const maxExecSeconds = 1 << 32

// Exec runs req.Argv in a workspace with POST /v1/workspaces/{id}/exec. A
// non-zero exit code is a result, not an error.
//
// Exec is never retried: on a transport error or timeout the outcome is
// unknown, and the error matches ErrOutcomeUnknown. Its HTTP timeout is
// req.TimeoutSeconds + 30s; when req.TimeoutSeconds is 0 the lease's
// default_exec_timeout_seconds counts instead, read once with Lease and
// cached.
func (c *Client) Exec(ctx context.Context, id string, req protocol.ExecRequest) (*protocol.ExecResponse, error) {
	seg, err := pathID("workspace id", id)
	if err != nil {
		return nil, err
	}
	timeout, err := c.execTimeout(ctx, req.TimeoutSeconds)
	if err != nil {
		return nil, err
	}
	var out protocol.ExecResponse
	_, err = c.do(ctx, call{
		op: "exec", method: http.MethodPost, route: "/v1/workspaces/{id}/exec", path: "/v1/workspaces/" + seg + "/exec",
		body: req, timeout: timeout, ok: []int{http.StatusOK}, out: &out,
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// execTimeout returns the HTTP timeout of an exec with timeout_seconds secs.
// A negative value is sent as is for the broker to refuse, and waits like
// an omitted one.
func (c *Client) execTimeout(ctx context.Context, secs int64) (time.Duration, error) {
	if secs <= 0 {
		c.mu.Lock()
		def, ok := c.execDefault, c.execDefaultSet
		c.mu.Unlock()
		if !ok {
			// Concurrent first Execs may each read the lease; that is
			// cheaper than making them wait on one another.
			if _, err := c.Lease(ctx); err != nil {
				return 0, fmt.Errorf("client: exec: read default timeout: %w", err)
			}
			c.mu.Lock()
			def = c.execDefault
			c.mu.Unlock()
		}
		secs = max(def, 0)
	}
	return time.Duration(min(secs, maxExecSeconds))*time.Second + execGrace, nil
}

// ReadFile reads a file with POST /v1/workspaces/{id}/files/read; the path
// travels in the body so that it never reaches an access log. A missing
// file (404 file_not_found) is an error matching fs.ErrNotExist; 404
// not_found is the workspace.
func (c *Client) ReadFile(ctx context.Context, id, path string) ([]byte, error) {
	seg, err := pathID("workspace id", id)
	if err != nil {
		return nil, err
	}
	var out protocol.ReadFileResponse
	_, err = c.do(ctx, call{
		op: "read file", method: http.MethodPost, route: "/v1/workspaces/{id}/files/read",
		path: "/v1/workspaces/" + seg + "/files/read", body: protocol.ReadFileRequest{Path: path},
		retry: true, ok: []int{http.StatusOK}, out: &out,
	})
	if err != nil {
		return nil, err
	}
	data, err := base64.StdEncoding.DecodeString(out.ContentsB64)
	if err != nil {
		return nil, fmt.Errorf("client: read file: contents_b64 is not base64: %w", err)
	}
	return data, nil
}

// WriteFile creates or replaces a file, and its parent directories, with
// POST /v1/workspaces/{id}/files/write. It is naturally idempotent, so it is
// retried.
func (c *Client) WriteFile(ctx context.Context, id, path string, data []byte) error {
	seg, err := pathID("workspace id", id)
	if err != nil {
		return err
	}
	_, err = c.do(ctx, call{
		op: "write file", method: http.MethodPost, route: "/v1/workspaces/{id}/files/write",
		path:  "/v1/workspaces/" + seg + "/files/write",
		body:  protocol.WriteFileRequest{Path: path, ContentsB64: base64.StdEncoding.EncodeToString(data)},
		retry: true, ok: []int{http.StatusNoContent},
	})
	return err
}
