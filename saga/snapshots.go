package saga

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

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

func errSnapshotNotFound() error {
	return protocol.E(protocol.NotFound, "no such snapshot for this instance")
}

// Snapshot returns the snapshot id of instance in; ids of other instances
// answer exactly as unknown ones (spec §Trust model).
func (s *Saga) Snapshot(ctx context.Context, in sandgate.Instance, id string) (sandgate.Snapshot, error) {
	if !policy.ValidID(id) {
		return sandgate.Snapshot{}, protocol.E(protocol.InvalidRequest,
			"the snapshot id is malformed: an id is 1 to 64 characters of [A-Za-z0-9._-], never . or ..; send it exactly as the broker returned it")
	}
	snap, err := s.db.Snapshot(ctx, in.AccountID, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && snap.InstanceID != in.ID) {
		return sandgate.Snapshot{}, errSnapshotNotFound()
	}
	if err != nil {
		return sandgate.Snapshot{}, Unavailable(err)
	}
	return snap, nil
}

// TakeSnapshot is POST of a snapshot of workspace wsID by lease l of
// instance in, in the order of Acquire: idempotency replay (answered even
// once the workspace has ended, spec §Idempotency) → the workspace, usable
// and counted against the lease's acquire rate (Usable) → CreateSnapshot.
// replay is true when the key's snapshot is answered, not created.
func (s *Saga) TakeSnapshot(ctx context.Context, l sandgate.Lease, in sandgate.Instance, key, wsID string, req protocol.SnapshotRequest) (snap sandgate.Snapshot, replay bool, err error) {
	if snap, ok, err := s.snapshotReplay(ctx, in, key, wsID, req); err != nil || ok {
		return snap, ok, err
	}
	w, err := s.Usable(ctx, l, wsID, admission.ClassAcquire)
	if err != nil {
		return sandgate.Snapshot{}, false, err
	}
	return s.CreateSnapshot(ctx, in, w, key, req)
}

// snapshotReplay looks up a snapshot request's Idempotency-Key: the
// snapshot it created (ok true), or ok false when the key is unused.
func (s *Saga) snapshotReplay(ctx context.Context, in sandgate.Instance, key, wsID string, req protocol.SnapshotRequest) (snap sandgate.Snapshot, ok bool, err error) {
	if err := policy.ValidateIdempotencyKey(key); err != nil {
		return sandgate.Snapshot{}, false, err
	}
	if err := policy.ValidatePathField("dir", req.Dir); err != nil {
		return sandgate.Snapshot{}, false, err
	}
	rec, err := s.db.Idempotency(ctx, in.AccountID, in.ID, store.OpSnapshot, HashString(key))
	if errors.Is(err, store.ErrNotFound) {
		return sandgate.Snapshot{}, false, nil
	}
	if err != nil {
		return sandgate.Snapshot{}, false, Unavailable(err)
	}
	snap, err = s.replaySnapshot(ctx, in, rec, snapshotHash(wsID, req))
	return snap, err == nil, err
}

func (s *Saga) replaySnapshot(ctx context.Context, in sandgate.Instance, rec store.IdemRecord, reqHash string) (sandgate.Snapshot, error) {
	if err := replayed(rec, reqHash); err != nil {
		return sandgate.Snapshot{}, err
	}
	snap, err := s.db.Snapshot(ctx, in.AccountID, rec.SnapshotID)
	if errors.Is(err, store.ErrNotFound) {
		return sandgate.Snapshot{}, protocol.E(protocol.SnapshotGone, "the snapshot this Idempotency-Key created is gone")
	}
	if err != nil {
		return sandgate.Snapshot{}, Unavailable(err)
	}
	return snap, nil
}

// CreateSnapshot stores dir of workspace w (usable, of instance in) on w's
// own provider: quota slot and key claimed → provider snapshot → confirm.
// A provider failure frees the key and the slot; contents stored too late
// to confirm are deleted. replay is true when a concurrent request with
// the same key created the snapshot returned.
func (s *Saga) CreateSnapshot(ctx context.Context, in sandgate.Instance, w sandgate.Workspace, key string, req protocol.SnapshotRequest) (snap sandgate.Snapshot, replay bool, err error) {
	if err := policy.ValidatePathField("dir", req.Dir); err != nil {
		return sandgate.Snapshot{}, false, err
	}
	p, err := s.ProviderOf(w.Provider)
	if err != nil {
		return sandgate.Snapshot{}, false, err
	}
	keyHash, reqHash := HashString(key), snapshotHash(w.ID, req)
	lim := in.Scope.Limits.WithDefaults()
	now := s.clock.Now()
	created := now.Truncate(time.Second)
	snap = sandgate.Snapshot{
		ID: sandgate.NewID(sandgate.PrefixSnapshot), AccountID: w.AccountID, InstanceID: w.InstanceID,
		WorkspaceID: w.ID, Provider: providerName(w.Provider), Size: w.Size, State: sandgate.SnapshotCreating,
		CreatedAt: created, ExpiresAt: created.Add(lim.SnapshotTTL),
	}
	err = s.db.BeginSnapshot(ctx, snap, lim.MaxSnapshots, lim.MaxSnapshotBytes, now.Add(s.cfg.SnapshotTimeout+snapshotPendingGrace), keyHash, reqHash, now)
	var claimed *store.SnapshotReplay
	switch {
	case errors.As(err, &claimed): // a concurrent request claimed the key first
		snap, err := s.replaySnapshot(ctx, in, claimed.Record, reqHash)
		return snap, err == nil, err
	case errors.Is(err, store.ErrQuota):
		return sandgate.Snapshot{}, false, protocol.E(protocol.SnapshotQuotaExceeded, "the instance holds max_snapshots live snapshots; delete some first")
	case errors.Is(err, store.ErrByteQuota):
		return sandgate.Snapshot{}, false, errByteQuota()
	case err != nil:
		return sandgate.Snapshot{}, false, Unavailable(err)
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
	ref, err := p.Snapshot(sctx, providers.Sandbox{Ref: w.ProviderRef}, providers.SnapshotSpec{ID: snap.ID, InstanceID: w.InstanceID, Dir: req.Dir, MaxBytes: room, ExpiresAt: snap.ExpiresAt})
	cancel()
	if err != nil {
		// The provider stored nothing: free the key and the slot, so a
		// retry re-evaluates (spec §Idempotency).
		if aerr := s.db.AbortSnapshot(ctx, snap, keyHash); aerr != nil {
			s.log.Error("abort after failed snapshot", sandgate.WorkspaceAttr(w.ID), slog.Any(sandgate.KeyError, aerr))
		}
		return sandgate.Snapshot{}, false, s.sandboxError(ctx, w, opSnapshot, err)
	}
	snap.Bytes = ref.Bytes
	if err := s.db.ConfirmSnapshot(ctx, snap, ref.Ref, req.Dir, keyHash, reqHash, lim.MaxSnapshotBytes, s.clock.Now()); err != nil {
		if errors.Is(err, store.ErrByteQuota) {
			s.refuseOverByteQuota(ctx, p, snap, ref, keyHash)
			return sandgate.Snapshot{}, false, errByteQuota()
		}
		if errors.Is(err, store.ErrStateChanged) {
			// Too slow: the reaper expired the create. What the provider
			// stored must not outlive the answer.
			s.deleteContents(ctx, p, snap.ID, ref)
			return sandgate.Snapshot{}, false, &protocol.Error{Code: protocol.UpstreamError, Message: "the snapshot took too long; retry with the same Idempotency-Key", Err: err}
		}
		// The record stays creating: the reaper deletes the contents at
		// the pending deadline.
		return sandgate.Snapshot{}, false, Unavailable(err)
	}
	s.log.Info("snapshot created", sandgate.WorkspaceAttr(w.ID), sandgate.SnapshotAttr(snap.ID))
	return snap, false, nil
}

// DeleteSnapshot deletes a snapshot of instance in: recorded as deleting,
// then its contents deleted at once on the provider that holds them; the
// reaper retries until that provider confirms. Deleting one already
// deleted or expired succeeds.
func (s *Saga) DeleteSnapshot(ctx context.Context, in sandgate.Instance, id string) error {
	snap, err := s.Snapshot(ctx, in, id)
	if err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	started, err := s.db.DeleteSnapshot(ctx, snap, s.clock.Now())
	if errors.Is(err, store.ErrNotFound) {
		return nil // removed meanwhile: an aborted create
	}
	if err != nil {
		return Unavailable(err)
	}
	if !started {
		return nil
	}
	e, err := s.provs.Get(snap.Provider)
	if err != nil {
		s.log.Warn("snapshot contents not deleted: its provider is not configured; the reaper retries", sandgate.SnapshotAttr(snap.ID), slog.Any(sandgate.KeyError, err))
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, s.cfg.TerminateTimeout)
	err = e.Provider.DeleteSnapshot(dctx, providers.SnapshotRef{ID: snap.ID, Ref: snap.ProviderRef})
	cancel()
	if err != nil {
		s.log.Warn("snapshot contents not deleted; the reaper retries", sandgate.SnapshotAttr(snap.ID), slog.Any(sandgate.KeyError, err))
		return nil
	}
	if err := s.db.PurgeSnapshot(ctx, snap); err != nil {
		s.log.Warn("snapshot purge not recorded; the reaper retries", sandgate.SnapshotAttr(snap.ID), slog.Any(sandgate.KeyError, err))
	}
	return nil
}

// errByteQuota refuses a snapshot past the instance's max_snapshot_bytes.
func errByteQuota() error {
	return protocol.E(protocol.SnapshotQuotaExceeded,
		"the instance's live snapshots would hold more than max_snapshot_bytes; delete some first")
}

// refuseOverByteQuota undoes a snapshot whose stored size would take the
// instance past max_snapshot_bytes: its contents are deleted and its
// record, slot and key removed, so a retry re-evaluates (spec
// §Idempotency). When the provider cannot delete the contents now, the
// snapshot is marked deleted first (the reaper retries the contents) and
// only its key is freed.
func (s *Saga) refuseOverByteQuota(ctx context.Context, p providers.Provider, snap sandgate.Snapshot, ref providers.SnapshotRef, keyHash string) {
	dctx, cancel := context.WithTimeout(ctx, s.cfg.TerminateTimeout)
	err := p.DeleteSnapshot(dctx, ref)
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
func (s *Saga) deleteContents(ctx context.Context, p providers.Provider, id string, ref providers.SnapshotRef) {
	dctx, cancel := context.WithTimeout(ctx, s.cfg.TerminateTimeout)
	defer cancel()
	if err := p.DeleteSnapshot(dctx, ref); err != nil {
		s.log.Warn("snapshot contents not deleted; the reaper retries", sandgate.SnapshotAttr(id), slog.Any(sandgate.KeyError, err))
	}
}

// snapshotHash is the canonical hash of a snapshot request: its workspace
// and its dir, as sent.
func snapshotHash(wsID string, req protocol.SnapshotRequest) string {
	b, _ := json.Marshal(struct{ Workspace, Dir string }{wsID, req.Dir})
	return HashString(string(b))
}
