package gateway

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
)

// createSnapshot is POST /v1/workspaces/{id}/snapshots, in the order of
// Acquire: authenticate → idempotency replay → validate → quota → provider
// (package saga).
func (s *Server) createSnapshot(c echo.Context) error {
	key := c.Request().Header.Get(protocol.HeaderIdempotencyKey)
	if err := policy.ValidateIdempotencyKey(key); err != nil {
		return err
	}
	wsID := c.Param("id")
	if !policy.ValidID(wsID) {
		return errBadWorkspaceID
	}
	var req protocol.SnapshotRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	a := authFrom(c)
	snap, replay, err := s.saga.TakeSnapshot(requestCtx(c), a.Lease, a.Instance, key, wsID, req)
	if err != nil {
		return err
	}
	if replay {
		return answerJSON(c, http.StatusOK, snapshotBody(snap))
	}
	return answerJSON(c, http.StatusCreated, snapshotBody(snap))
}

func snapshotBody(s sandgate.Snapshot) protocol.Snapshot {
	return protocol.Snapshot{SnapshotID: s.ID, CreatedAt: protocol.Time(s.CreatedAt), ExpiresAt: protocol.Time(s.ExpiresAt)}
}

// deleteSnapshot is DELETE /v1/snapshots/{id}: 204 also when the snapshot
// is already deleted or expired; 404 only for an id this instance never
// owned (or whose tombstone has aged out).
func (s *Server) deleteSnapshot(c echo.Context) error {
	if err := s.saga.DeleteSnapshot(c.Request().Context(), authFrom(c).Instance, c.Param("id")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}
