package reaper

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/store"
)

// Snapshot sweep bounds: how many snapshots one pass takes per account,
// how long one provider call may take, and when a failed deletion is
// tried again.
const (
	snapshotBatch   = 100
	snapshotTimeout = 30 * time.Second
	snapshotRetry   = 10 * time.Second
)

// sweepSnapshots carries out spec §Broker obligations for snapshots: every
// snapshot past its expires_at (and every create whose pending deadline
// passed: its gateway died) stops being usable and counting, and the
// contents of every deleted or expired snapshot are deleted at the
// provider, retried every snapshotRetry until it confirms, whether or not
// the client ever called DELETE.
func (r *Reaper) sweepSnapshots(ctx context.Context) error {
	if r.provs == nil {
		return nil
	}
	accts, err := r.db.AccountIDs(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, acct := range accts {
		errs = append(errs, r.sweepAccountSnapshots(ctx, acct))
	}
	return errors.Join(errs...)
}

func (r *Reaper) sweepAccountSnapshots(ctx context.Context, acct string) error {
	now := r.clock.Now()
	due, err := r.db.DueSnapshots(ctx, acct, now, snapshotBatch)
	if err != nil {
		return err
	}
	expired := 0
	for _, id := range due {
		ok, err := r.db.ExpireSnapshot(ctx, acct, id, now)
		if err != nil {
			return err
		}
		if ok {
			expired++
		}
	}
	gc, err := r.db.DueSnapshotDeletes(ctx, acct, now, snapshotBatch)
	if err != nil {
		return err
	}
	deleted, failed := 0, 0
	for _, id := range gc {
		snap, err := r.db.Snapshot(ctx, acct, id)
		if errors.Is(err, store.ErrNotFound) {
			r.db.DropSnapshotDelete(ctx, acct, id)
			continue
		}
		if err != nil {
			return err
		}
		if snap.State != sandgate.SnapshotDeleting {
			r.db.DropSnapshotDelete(ctx, acct, id)
			continue
		}
		err = r.deleteContents(ctx, snap)
		if err != nil {
			failed++
			r.log.Warn("snapshot contents not deleted; will retry", sandgate.SnapshotAttr(id), slog.Any(sandgate.KeyError, err))
			if err := r.db.RetrySnapshotDelete(ctx, acct, id, now.Add(snapshotRetry)); err != nil {
				return err
			}
			continue
		}
		if err := r.db.PurgeSnapshot(ctx, snap); err != nil {
			return err
		}
		deleted++
	}
	r.correct(ctx, KindSnapshotExpired, int64(expired))
	r.correct(ctx, KindSnapshotDeleted, int64(deleted))
	if expired+deleted+failed > 0 {
		r.log.Info("swept snapshots", slog.String(sandgate.KeyAccountID, acct),
			slog.Int("expired", expired), slog.Int("deleted", deleted), slog.Int("failed", failed))
	}
	return nil
}

// deleteContents deletes a snapshot's contents on the provider that holds
// them, accepting new work or not.
func (r *Reaper) deleteContents(ctx context.Context, snap sandgate.Snapshot) error {
	e, err := r.provs.Get(snap.Provider)
	if err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	return e.Provider.DeleteSnapshot(dctx, providers.SnapshotRef{ID: snap.ID, Ref: snap.ProviderRef})
}
