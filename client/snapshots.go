package client

import (
	"context"
	"errors"
	"net/http"

	"github.com/sandgate/sandgate/protocol"
)

// Snapshot captures dir of a workspace with POST
// /v1/workspaces/{id}/snapshots. created is true for 201 and false for an
// idempotent replay (200). idemKey is required and reused by every retry;
// the spec keys a capture by a per-call nonce, made before the call.
func (c *Client) Snapshot(ctx context.Context, id, idemKey, dir string) (snap *protocol.Snapshot, created bool, err error) {
	seg, err := pathID("workspace id", id)
	if err != nil {
		return nil, false, err
	}
	if idemKey == "" {
		return nil, false, errors.New("client: snapshot: idempotency key is required")
	}
	var out protocol.Snapshot
	status, err := c.do(ctx, call{
		op: "snapshot", method: http.MethodPost, route: "/v1/workspaces/{id}/snapshots",
		path: "/v1/workspaces/" + seg + "/snapshots", body: protocol.SnapshotRequest{Dir: dir},
		idemKey: idemKey, retry: true, ok: []int{http.StatusCreated, http.StatusOK}, out: &out,
	})
	if err != nil {
		return nil, false, err
	}
	return &out, status == http.StatusCreated, nil
}

// DeleteSnapshot deletes a snapshot with DELETE /v1/snapshots/{id}. 204 and
// 404 not_found are both success: there is nothing left to reclaim. A 404
// without the envelope is an error, as for Release.
func (c *Client) DeleteSnapshot(ctx context.Context, snapID string) error {
	seg, err := pathID("snapshot id", snapID)
	if err != nil {
		return err
	}
	_, err = c.do(ctx, call{
		op: "delete snapshot", method: http.MethodDelete, route: "/v1/snapshots/{id}", path: "/v1/snapshots/" + seg,
		retry: true, ok: []int{http.StatusNoContent},
	})
	if isCode(err, http.StatusNotFound, protocol.NotFound) {
		return nil
	}
	return err
}
