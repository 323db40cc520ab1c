package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/store"
)

// snapshotPendingGrace is added to SnapshotTimeout for a snapshot's
// pending deadline, so the quota slot of a snapshot in flight is never
// freed under it.
const snapshotPendingGrace = 30 * time.Second

// createSnapshot is POST /v1/workspaces/{id}/snapshots, in the order of
// Acquire: authenticate → idempotency replay → validate → quota → provider.
func (s *Server) createSnapshot(c echo.Context) error {
	ctx := c.Request().Context()
	a := authFrom(c)
	key := c.Request().Header.Get(protocol.HeaderIdempotencyKey)
	if err := policy.ValidateIdempotencyKey(key); err != nil {
		return err
	}
	wsID := c.Param("id")
	if !policy.ValidID(wsID) {
		return errNotFound
	}
	var req protocol.SnapshotRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if err := policy.ValidatePathField("dir", req.Dir); err != nil {
		return err
	}
	keyHash, reqHash := hashString(key), snapshotHash(wsID, req)

	// spec §Idempotency: a replay answers the original snapshot, even once
	// its workspace has ended.
	if rec, err := s.db.Idempotency(ctx, a.Lease.AccountID, a.Lease.InstanceID, store.OpSnapshot, keyHash); err == nil {
		return s.replaySnapshot(c, rec, reqHash)
	} else if !errors.Is(err, store.ErrNotFound) {
		return unavailable(err)
	}
	w, err := s.usable(c, admission.ClassAcquire)
	if err != nil {
		return err
	}
	lim := s.effectiveScope(a.Instance.Scope).Limits
	now := s.clock.Now()
	created := now.Truncate(time.Second)
	snap := sandgate.Snapshot{
		ID: sandgate.NewID(sandgate.PrefixSnapshot), AccountID: w.AccountID, InstanceID: w.InstanceID,
		WorkspaceID: w.ID, State: sandgate.SnapshotCreating, CreatedAt: created, ExpiresAt: created.Add(lim.SnapshotTTL),
	}
	err = s.db.BeginSnapshot(ctx, snap, lim.MaxSnapshots, lim.MaxSnapshotBytes, now.Add(s.cfg.SnapshotTimeout+snapshotPendingGrace), keyHash, reqHash, now)
	var replay *store.SnapshotReplay
	switch {
	case errors.As(err, &replay): // a concurrent request claimed the key first
		return s.replaySnapshot(c, replay.Record, reqHash)
	case errors.Is(err, store.ErrQuota):
		return protocol.E(protocol.SnapshotQuotaExceeded, "the instance holds max_snapshots live snapshots; delete some first")
	case errors.Is(err, store.ErrByteQuota):
		return errByteQuota
	case err != nil:
		return unavailable(err)
	}
	if err := s.db.Touch(ctx, w, now); err != nil {
		s.log.Warn("snapshot: touch", sandgate.WorkspaceAttr(w.ID), slog.Any(sandgate.KeyError, err))
	}

	// What is left of the byte quota bounds the provider's archive, so an
	// oversized one is cut short rather than stored first; the confirm
	// below checks the size all the same (other snapshots may land
	// meanwhile). An error here only loses the early stop.
	room := lim.MaxSnapshotBytes
	if used, err := s.db.LiveSnapshotBytes(ctx, w.AccountID, w.InstanceID, now); err == nil {
		room = max(room-used, 1)
	}

	// The key and the slot are held: finish even if the client goes away.
	ctx = context.WithoutCancel(ctx)
	sctx, cancel := context.WithTimeout(ctx, s.cfg.SnapshotTimeout)
	ref, err := s.provider.Snapshot(sctx, sandboxOf(w), providers.SnapshotSpec{ID: snap.ID, InstanceID: w.InstanceID, Dir: req.Dir, MaxBytes: room})
	cancel()
	if err != nil {
		// The provider stored nothing: free the key and the slot, so a
		// retry re-evaluates (spec §Idempotency).
		if aerr := s.db.AbortSnapshot(ctx, snap, keyHash); aerr != nil {
			s.log.Error("abort after failed snapshot", sandgate.WorkspaceAttr(w.ID), slog.Any(sandgate.KeyError, aerr))
		}
		return snapshotError(err)
	}
	snap.Bytes = ref.Bytes
	if err := s.db.ConfirmSnapshot(ctx, snap, ref.Ref, req.Dir, keyHash, reqHash, lim.MaxSnapshotBytes, s.clock.Now()); err != nil {
		if errors.Is(err, store.ErrByteQuota) {
			s.refuseOverByteQuota(ctx, snap, ref, keyHash)
			return errByteQuota
		}
		if errors.Is(err, store.ErrStateChanged) {
			// Too slow: the reaper expired the create. What the provider
			// stored must not outlive the answer.
			s.deleteContents(ctx, snap.ID, ref)
			return &protocol.Error{Code: protocol.UpstreamError, Message: "the snapshot took too long; retry with the same Idempotency-Key", Err: err}
		}
		// The record stays creating: the reaper deletes the contents at
		// the pending deadline.
		return unavailable(err)
	}
	s.log.Info("snapshot created", sandgate.WorkspaceAttr(w.ID), sandgate.SnapshotAttr(snap.ID))
	return c.JSON(http.StatusCreated, snapshotBody(snap))
}

// errByteQuota refuses a snapshot past the instance's max_snapshot_bytes.
var errByteQuota = protocol.E(protocol.SnapshotQuotaExceeded,
	"the instance's live snapshots would hold more than max_snapshot_bytes; delete some first")

// refuseOverByteQuota undoes a snapshot whose stored size would take the
// instance past max_snapshot_bytes: its contents are deleted and its
// record, slot and key removed, so a retry re-evaluates (spec
// §Idempotency). When the provider cannot delete the contents now, the
// snapshot is marked deleted first (the reaper retries the contents) and
// only its key is freed.
func (s *Server) refuseOverByteQuota(ctx context.Context, snap sandgate.Snapshot, ref providers.SnapshotRef, keyHash string) {
	dctx, cancel := context.WithTimeout(ctx, s.cfg.TerminateTimeout)
	err := s.provider.DeleteSnapshot(dctx, ref)
	cancel()
	if err != nil {
		s.log.Warn("snapshot over the byte quota not deleted; the reaper retries", sandgate.SnapshotAttr(snap.ID), slog.Any(sandgate.KeyError, err))
		if _, err := s.db.DeleteSnapshot(ctx, snap, s.clock.Now()); err != nil {
			s.log.Error("delete snapshot over the byte quota", sandgate.SnapshotAttr(snap.ID), slog.Any(sandgate.KeyError, err))
		}
	}
	if err := s.db.AbortSnapshot(ctx, snap, keyHash); err != nil {
		s.log.Error("abort snapshot over the byte quota", sandgate.SnapshotAttr(snap.ID), slog.Any(sandgate.KeyError, err))
	}
}

// deleteContents asks the provider to delete a snapshot's contents once,
// leaving any failure to the reaper.
func (s *Server) deleteContents(ctx context.Context, id string, ref providers.SnapshotRef) {
	dctx, cancel := context.WithTimeout(ctx, s.cfg.TerminateTimeout)
	defer cancel()
	if err := s.provider.DeleteSnapshot(dctx, ref); err != nil {
		s.log.Warn("snapshot contents not deleted; the reaper retries", sandgate.SnapshotAttr(id), slog.Any(sandgate.KeyError, err))
	}
}

// snapshotError maps a provider's Snapshot failure: the directory's
// problems are the client's (404, 422), the rest 410 or 502.
func snapshotError(err error) error {
	switch {
	case errors.Is(err, providers.ErrSnapshotTooLarge):
		return &protocol.Error{Code: protocol.SnapshotQuotaExceeded, Err: err,
			Message: "the snapshot would take the instance's live snapshots past max_snapshot_bytes; delete some first"}
	case errors.Is(err, providers.ErrFileNotFound):
		return &protocol.Error{Code: protocol.FileNotFound, Message: "dir does not exist in the workspace", Err: err}
	case errors.Is(err, providers.ErrNotAFile):
		return &protocol.Error{Code: protocol.NotAFile, Message: "dir is not a directory that can be snapshotted (it must persist in the workspace)", Err: err}
	case errors.Is(err, providers.ErrSandboxGone):
		return &protocol.Error{Code: protocol.WorkspaceGone, Message: "the workspace's sandbox has ended; acquire a new one", Err: err}
	}
	return &protocol.Error{Code: protocol.UpstreamError, Message: "the sandbox provider could not store the snapshot; retry with the same Idempotency-Key", Err: err}
}

func (s *Server) replaySnapshot(c echo.Context, rec store.IdemRecord, reqHash string) error {
	if rec.Hash != reqHash {
		return protocol.E(protocol.IdempotencyConflict, "this Idempotency-Key was used with a different request")
	}
	if rec.State != store.IdemDone {
		return &protocol.Error{Code: protocol.IdempotencyInProgress,
			Message: "the original request with this Idempotency-Key is still running", RetryAfter: time.Second}
	}
	snap, err := s.db.Snapshot(c.Request().Context(), authFrom(c).Lease.AccountID, rec.SnapshotID)
	if errors.Is(err, store.ErrNotFound) {
		return protocol.E(protocol.SnapshotGone, "the snapshot this Idempotency-Key created is gone")
	}
	if err != nil {
		return unavailable(err)
	}
	return c.JSON(http.StatusOK, snapshotBody(snap))
}

func snapshotBody(s sandgate.Snapshot) protocol.Snapshot {
	return protocol.Snapshot{SnapshotID: s.ID, CreatedAt: wireTime(s.CreatedAt), ExpiresAt: wireTime(s.ExpiresAt)}
}

// snapshotHash is the canonical hash of a snapshot request: its workspace
// and its dir, as sent.
func snapshotHash(wsID string, req protocol.SnapshotRequest) string {
	b, _ := json.Marshal(struct{ Workspace, Dir string }{wsID, req.Dir})
	return hashString(string(b))
}

// deleteSnapshot is DELETE /v1/snapshots/{id}: 204 also when the snapshot
// is already deleted or expired; 404 only for an id this instance never
// owned (or whose tombstone has aged out).
func (s *Server) deleteSnapshot(c echo.Context) error {
	snap, err := s.loadSnapshot(c, c.Param("id"))
	if err != nil {
		return err
	}
	ctx := context.WithoutCancel(c.Request().Context())
	started, err := s.db.DeleteSnapshot(ctx, snap, s.clock.Now())
	if errors.Is(err, store.ErrNotFound) {
		return c.NoContent(http.StatusNoContent) // removed meanwhile: an aborted create
	}
	if err != nil {
		return unavailable(err)
	}
	if started {
		// Try at once; the reaper retries until the provider confirms.
		dctx, cancel := context.WithTimeout(ctx, s.cfg.TerminateTimeout)
		err := s.provider.DeleteSnapshot(dctx, providers.SnapshotRef{ID: snap.ID, Ref: snap.ProviderRef})
		cancel()
		if err == nil {
			if err := s.db.PurgeSnapshot(ctx, snap); err != nil {
				s.log.Warn("snapshot purge not recorded; the reaper retries", sandgate.SnapshotAttr(snap.ID), slog.Any(sandgate.KeyError, err))
			}
		} else {
			s.log.Warn("snapshot contents not deleted; the reaper retries", sandgate.SnapshotAttr(snap.ID), slog.Any(sandgate.KeyError, err))
		}
	}
	return c.NoContent(http.StatusNoContent)
}

// loadSnapshot returns the snapshot id of the request's instance; ids of
// other instances answer exactly as unknown ones (spec §Trust model).
func (s *Server) loadSnapshot(c echo.Context, id string) (sandgate.Snapshot, error) {
	notFound := protocol.E(protocol.NotFound, "no such snapshot for this instance")
	if !policy.ValidID(id) {
		return sandgate.Snapshot{}, notFound
	}
	a := authFrom(c)
	snap, err := s.db.Snapshot(c.Request().Context(), a.Lease.AccountID, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && snap.InstanceID != a.Lease.InstanceID) {
		return sandgate.Snapshot{}, notFound
	}
	if err != nil {
		return sandgate.Snapshot{}, unavailable(err)
	}
	return snap, nil
}

// warmStart checks Acquire's snapshot_id: 404 for an id this instance does
// not own (or one still being created, which no client can know yet), 410
// once it is expired or deleted.
func (s *Server) warmStart(c echo.Context, id string, now time.Time) (*sandgate.Snapshot, error) {
	if id == "" {
		return nil, nil
	}
	snap, err := s.loadSnapshot(c, id)
	if err != nil {
		return nil, err
	}
	switch {
	case snap.State == sandgate.SnapshotCreating:
		return nil, protocol.E(protocol.NotFound, "no such snapshot for this instance")
	case !snap.UsableAt(now):
		return nil, protocol.E(protocol.SnapshotGone, "the snapshot expired or was deleted; start cold")
	}
	return &snap, nil
}

// restoreError maps a failed restore into a new workspace.
func restoreError(err error) error {
	if errors.Is(err, providers.ErrSnapshotGone) {
		return &protocol.Error{Code: protocol.SnapshotGone, Message: "the snapshot's contents are gone; start cold", Err: err}
	}
	return &protocol.Error{Code: protocol.UpstreamError, Message: "the sandbox provider could not restore the snapshot; the workspace was terminated; retry with the same Idempotency-Key", Err: err}
}
