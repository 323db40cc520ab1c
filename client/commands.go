package client

import (
	"context"
	"net/http"

	"github.com/sandgate/sandgate/protocol"
)

// commandPath returns the escaped path of a durable command.
func commandPath(id, identity string) (string, error) {
	seg, err := pathID("workspace id", id)
	if err != nil {
		return "", err
	}
	ident, err := pathID("command identity", identity)
	if err != nil {
		return "", err
	}
	return "/v1/workspaces/" + seg + "/commands/" + ident, nil
}

// StartCommand launches req as the durable command identity with PUT
// /v1/workspaces/{id}/commands/{identity}. launched is true for 202 and
// false for 200, the current status of an identity already claimed.
//
// It is never retried. 422 command_not_started matches ErrCommandNotStarted;
// a transport error matches ErrOutcomeUnknown, and a 5xx is unknown too: the
// caller learns the outcome with ReadCommand, never with another PUT (spec
// §Durable commands).
func (c *Client) StartCommand(ctx context.Context, id, identity string, req protocol.ExecRequest) (st *protocol.CommandStatus, launched bool, err error) {
	path, err := commandPath(id, identity)
	if err != nil {
		return nil, false, err
	}
	var out protocol.CommandStatus
	status, err := c.do(ctx, call{
		op: "start command", method: http.MethodPut, route: "/v1/workspaces/{id}/commands/{identity}", path: path,
		body: req, ok: []int{http.StatusAccepted, http.StatusOK}, out: &out,
	})
	if err != nil {
		return nil, false, err
	}
	return &out, status == http.StatusAccepted, nil
}

// ReadCommand reads a durable command's status with GET
// /v1/workspaces/{id}/commands/{identity}. Per the spec's client checklist,
// 404 not_found and 410 workspace_gone both answer state unknown with a nil
// error: the command can no longer be learned about. Callers must treat a
// state they do not recognize as neither finished nor not started.
func (c *Client) ReadCommand(ctx context.Context, id, identity string) (*protocol.CommandStatus, error) {
	path, err := commandPath(id, identity)
	if err != nil {
		return nil, err
	}
	var out protocol.CommandStatus
	_, err = c.do(ctx, call{
		op: "read command", method: http.MethodGet, route: "/v1/workspaces/{id}/commands/{identity}", path: path,
		retry: true, ok: []int{http.StatusOK}, out: &out,
	})
	if isCode(err, http.StatusNotFound, protocol.NotFound) || isCode(err, http.StatusGone, protocol.WorkspaceGone) {
		return &protocol.CommandStatus{State: protocol.CommandUnknown}, nil
	}
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// CancelCommand cancels a durable command with POST
// /v1/workspaces/{id}/commands/{identity}/cancel, and fences a launch still
// on its way. It is idempotent, so it is retried; a completed result survives.
func (c *Client) CancelCommand(ctx context.Context, id, identity string) error {
	path, err := commandPath(id, identity)
	if err != nil {
		return err
	}
	_, err = c.do(ctx, call{
		op: "cancel command", method: http.MethodPost, route: "/v1/workspaces/{id}/commands/{identity}/cancel",
		path: path + "/cancel", retry: true, ok: []int{http.StatusAccepted},
	})
	return err
}
