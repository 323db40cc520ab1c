package client

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"

	"github.com/sandgate/sandgate/protocol"
)

// Lease reads the token's grant, limits and admission state with GET
// /v1/lease; it is the connection test and creates nothing. It also caches
// the lease's default exec timeout for Exec.
func (c *Client) Lease(ctx context.Context) (*protocol.LeaseResponse, error) {
	var out protocol.LeaseResponse
	_, err := c.do(ctx, call{
		op: "lease", method: http.MethodGet, route: "/v1/lease", path: "/v1/lease",
		retry: true, ok: []int{http.StatusOK}, out: &out,
	})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.execDefault, c.execDefaultSet = out.Limits.DefaultExecTimeoutSeconds, true
	c.mu.Unlock()
	return &out, nil
}

// Acquire creates a workspace with POST /v1/workspaces. created is true for
// 201 and false for an idempotent replay (200); after a retried transport
// error, a workspace this very call created answers as a replay.
//
// idemKey is required and reused verbatim by every retry; derive it before
// the call from the logical operation (spec §Idempotency and retries).
// A nil req.Egress is sent as null, which the broker refuses with 422
// egress_required; the client does not check, so the broker's refusal can
// be tested through it.
//
// When req carries attribution (Agent or RunID) and the broker answers 400
// invalid_request, Acquire sends the same acquisition once more without them
// and the same key (spec §Conventions: a broker of an earlier revision
// refuses them, and a 400 consumes no key).
func (c *Client) Acquire(ctx context.Context, idemKey string, req protocol.AcquireRequest) (ws *protocol.Workspace, created bool, err error) {
	if idemKey == "" {
		return nil, false, errors.New("client: acquire: idempotency key is required")
	}
	ws, created, err = c.acquire(ctx, idemKey, req)
	if err != nil && (req.Agent != "" || req.RunID != "") &&
		isCode(err, http.StatusBadRequest, protocol.InvalidRequest) {
		c.log.InfoContext(ctx, "acquire resent without attribution")
		req.Agent, req.RunID = "", ""
		return c.acquire(ctx, idemKey, req)
	}
	return ws, created, err
}

func (c *Client) acquire(ctx context.Context, idemKey string, req protocol.AcquireRequest) (*protocol.Workspace, bool, error) {
	var out protocol.Workspace
	status, err := c.do(ctx, call{
		op: "acquire", method: http.MethodPost, route: "/v1/workspaces", path: "/v1/workspaces",
		body: req, idemKey: idemKey, retry: true,
		ok: []int{http.StatusCreated, http.StatusOK}, out: &out,
	})
	if err != nil {
		return nil, false, err
	}
	return &out, status == http.StatusCreated, nil
}

// Workspace reads one workspace's status with GET /v1/workspaces/{id}.
func (c *Client) Workspace(ctx context.Context, id string) (*protocol.Workspace, error) {
	return c.workspaceCall(ctx, "workspace", http.MethodGet, id)
}

// workspaceCall sends method without a body to /v1/workspaces/{id} and
// decodes the workspace of its 200 answer.
func (c *Client) workspaceCall(ctx context.Context, op, method, id string) (*protocol.Workspace, error) {
	seg, err := pathID("workspace id", id)
	if err != nil {
		return nil, err
	}
	var out protocol.Workspace
	_, err = c.do(ctx, call{
		op: op, method: method, route: "/v1/workspaces/{id}", path: "/v1/workspaces/" + seg,
		retry: true, ok: []int{http.StatusOK}, out: &out,
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// ListWorkspaces lists this instance's workspaces with GET /v1/workspaces.
// An empty state, an empty cursor and a zero limit are omitted, leaving the
// broker's defaults (live, first page, 50).
func (c *Client) ListWorkspaces(ctx context.Context, state, cursor string, limit int) (*protocol.WorkspaceList, error) {
	q := url.Values{}
	if state != "" {
		q.Set("state", state)
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out protocol.WorkspaceList
	_, err := c.do(ctx, call{
		op: "list workspaces", method: http.MethodGet, route: "/v1/workspaces", path: "/v1/workspaces", query: q,
		retry: true, ok: []int{http.StatusOK}, out: &out,
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// Release terminates a workspace with DELETE /v1/workspaces/{id}. It returns
// the answered status object: state terminated confirms the end, terminating
// does not. 404 not_found is a success with a nil status, an end the broker
// did not confirm (spec §Release). A 404 without the envelope is an error,
// because it more likely means a wrong endpoint than a released workspace.
func (c *Client) Release(ctx context.Context, id string) (*protocol.Workspace, error) {
	w, err := c.workspaceCall(ctx, "release", http.MethodDelete, id)
	if isCode(err, http.StatusNotFound, protocol.NotFound) {
		return nil, nil
	}
	return w, err
}
