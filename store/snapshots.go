package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
)

// Errors of the snapshot and command changes.
var (
	// ErrQuota: the instance holds max_snapshots live snapshots.
	ErrQuota = errors.New("store: snapshot quota reached")
	// ErrByteQuota: the instance's live snapshots hold max_snapshot_bytes,
	// or would with the one being confirmed.
	ErrByteQuota = errors.New("store: snapshot byte quota reached")
	// ErrStateChanged: the record is no longer in the state the change
	// needs (a snapshot expired while it was created, a workspace ended).
	ErrStateChanged = errors.New("store: state changed")
)

// SnapshotReplay is returned by BeginSnapshot when the Idempotency-Key was
// claimed before.
type SnapshotReplay struct{ Record IdemRecord }

func (r *SnapshotReplay) Error() string { return "store: idempotency key already claimed" }

func itoa(n int) string { return strconv.Itoa(n) }

// snapshotKeys are the keys a snapshot change touches, in the order the
// begin, confirm and abort scripts take them.
func snapshotKeys(s sandgate.Snapshot, keyHash string) []string {
	return []string{
		idempotencyKey(s.AccountID, s.InstanceID, OpSnapshot, keyHash),
		snapshotKey(s.AccountID, s.ID),
		snapshotQuotaKey(s.AccountID, s.InstanceID),
		snapshotExpiryKey(s.AccountID),
		snapshotBytesKey(s.AccountID, s.InstanceID),
	}
}

// BeginSnapshot claims the Idempotency-Key and a quota slot for s (state
// creating, every field but Dir, ProviderRef and Bytes set) in one step;
// the slot is held until pendingDeadline unless Confirm makes it live.
// Returns a *SnapshotReplay when the key was claimed before, ErrQuota when
// the instance holds max live snapshots, ErrByteQuota when they hold
// maxBytes or more (0: no byte quota).
func (db *DB) BeginSnapshot(ctx context.Context, s sandgate.Snapshot, max int, maxBytes int64, pendingDeadline time.Time, keyHash, requestHash string, now time.Time) error {
	args := []any{ms(now), max, ms(pendingDeadline), s.ID,
		EncodeIdemRecord(IdemRecord{Hash: requestHash, SnapshotID: s.ID, State: IdemInProgress}),
		db.cfg.IdempotencyTTL.Milliseconds(), maxBytes}
	args = append(args, snapshotFields(s)...)
	res, err := beginSnapshotScript.Run(ctx, db.rdb, snapshotKeys(s, keyHash), args...).Slice()
	if err != nil {
		return fmt.Errorf("begin snapshot: %w", err)
	}
	switch code, _ := res[0].(int64); code {
	case resOK:
		return nil
	case resReplay:
		var rec IdemRecord
		v, _ := res[1].(string)
		if err := DecodeIdemRecord(v, &rec); err != nil {
			return fmt.Errorf("begin snapshot: %w", err)
		}
		if rec.SnapshotID == s.ID && rec.State == IdemInProgress {
			// This call's own claim: the script ran before and its answer
			// was lost (a resent command). Its writes are all there.
			return nil
		}
		return &SnapshotReplay{Record: rec}
	case resQuota:
		return ErrQuota
	case resBytes:
		return ErrByteQuota
	default:
		return fmt.Errorf("begin snapshot: unexpected result %v", res)
	}
}

// ConfirmSnapshot makes a creating snapshot live with the provider's
// reference, the directory restore needs and its size s.Bytes. Returns
// ErrStateChanged when it is no longer creating; the key is then freed and
// the reaper deletes the contents. Returns ErrByteQuota, changing nothing,
// when s.Bytes would take the instance's live snapshots at now past
// maxBytes (0: no byte quota); the caller then deletes the contents and
// aborts.
func (db *DB) ConfirmSnapshot(ctx context.Context, s sandgate.Snapshot, ref, dir, keyHash, requestHash string, maxBytes int64, now time.Time) error {
	n, err := confirmSnapshotScript.Run(ctx, db.rdb, snapshotKeys(s, keyHash), s.ID, ms(s.ExpiresAt), ref, dir,
		EncodeIdemRecord(IdemRecord{Hash: requestHash, SnapshotID: s.ID, State: IdemDone}),
		db.cfg.IdempotencyTTL.Milliseconds(), max(s.Bytes, 0), maxBytes, ms(now)).Int()
	if err != nil {
		return fmt.Errorf("confirm snapshot: %w", err)
	}
	switch n {
	case resOK:
		return nil
	case resBytes:
		return ErrByteQuota
	}
	return ErrStateChanged
}

// LiveSnapshotBytes returns the bytes of an instance's snapshots that count
// against max_snapshot_bytes at now.
func (db *DB) LiveSnapshotBytes(ctx context.Context, acct, inst string, now time.Time) (int64, error) {
	ids, err := db.rdb.ZRangeByScore(ctx, snapshotQuotaKey(acct, inst), &redis.ZRangeBy{
		Min: "(" + strconv.FormatInt(ms(now), 10), Max: "+inf"}).Result()
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	vals, err := db.rdb.HMGet(ctx, snapshotBytesKey(acct, inst), ids...).Result()
	if err != nil {
		return 0, err
	}
	var total int64
	for _, v := range vals {
		if s, ok := v.(string); ok {
			n, _ := strconv.ParseInt(s, 10, 64)
			total += n
		}
	}
	return total, nil
}

// AbortSnapshot removes a snapshot whose provider call stored nothing, and
// frees its key.
func (db *DB) AbortSnapshot(ctx context.Context, s sandgate.Snapshot, keyHash string) error {
	if err := abortSnapshotScript.Run(ctx, db.rdb, snapshotKeys(s, keyHash), s.ID).Err(); err != nil {
		return fmt.Errorf("abort snapshot: %w", err)
	}
	return nil
}

// Snapshot returns a snapshot of an account, tombstones included. Returns ErrNotFound.
func (db *DB) Snapshot(ctx context.Context, acct, id string) (sandgate.Snapshot, error) {
	m, err := db.rdb.HGetAll(ctx, snapshotKey(acct, id)).Result()
	if err != nil {
		return sandgate.Snapshot{}, err
	}
	if len(m) == 0 {
		return sandgate.Snapshot{}, ErrNotFound
	}
	return parseSnapshot(m)
}

// DeleteSnapshot starts the deletion of a creating or live snapshot: it
// stops counting against the quota at once and is queued for the provider.
// It reports whether it started the deletion (false: already deleting or
// deleted). Returns ErrNotFound.
func (db *DB) DeleteSnapshot(ctx context.Context, s sandgate.Snapshot, now time.Time) (bool, error) {
	return db.startSnapshotDelete(ctx, s, now, "deleted", false)
}

// ExpireSnapshot starts the deletion of a snapshot due in the expiry index
// (past expires_at, or a create whose pending deadline passed). It reports
// whether it started one.
func (db *DB) ExpireSnapshot(ctx context.Context, acct, id string, now time.Time) (bool, error) {
	inst, err := db.rdb.HGet(ctx, snapshotKey(acct, id), "instance").Result()
	if isNil(err) {
		// A record that expired under its index entry: drop the entry.
		return false, db.rdb.ZRem(ctx, snapshotExpiryKey(acct), id).Err()
	}
	if err != nil {
		return false, err
	}
	return db.startSnapshotDelete(ctx, sandgate.Snapshot{ID: id, AccountID: acct, InstanceID: inst}, now, "expired", true)
}

func (db *DB) startSnapshotDelete(ctx context.Context, s sandgate.Snapshot, now time.Time, reason string, ifDue bool) (bool, error) {
	keys := []string{snapshotKey(s.AccountID, s.ID), snapshotQuotaKey(s.AccountID, s.InstanceID),
		snapshotExpiryKey(s.AccountID), snapshotGCKey(s.AccountID), snapshotBytesKey(s.AccountID, s.InstanceID)}
	due := "0"
	if ifDue {
		due = "1"
	}
	res, err := deleteSnapshotScript.Run(ctx, db.rdb, keys, s.ID, ms(now), reason, due).Slice()
	if err != nil {
		return false, fmt.Errorf("delete snapshot: %w", err)
	}
	switch code, _ := res[0].(int64); code {
	case resOK:
		return true, nil
	case resAbsent:
		return false, ErrNotFound
	}
	return false, nil
}

// PurgeSnapshot records that the provider deleted a snapshot's contents:
// a tombstone without the directory is kept for SnapshotTombstone.
func (db *DB) PurgeSnapshot(ctx context.Context, s sandgate.Snapshot) error {
	err := purgeSnapshotScript.Run(ctx, db.rdb, []string{snapshotKey(s.AccountID, s.ID), snapshotGCKey(s.AccountID)},
		s.ID, db.cfg.SnapshotTombstone.Milliseconds()).Err()
	if err != nil {
		return fmt.Errorf("purge snapshot: %w", err)
	}
	return nil
}

// RetrySnapshotDelete schedules the next attempt to delete a snapshot's contents.
func (db *DB) RetrySnapshotDelete(ctx context.Context, acct, id string, at time.Time) error {
	return db.rdb.ZAddXX(ctx, snapshotGCKey(acct), redis.Z{Score: float64(ms(at)), Member: id}).Err()
}

// DueSnapshots returns up to n ids of an account's snapshots at or past
// their deadline (expired, or creates past their pending deadline).
func (db *DB) DueSnapshots(ctx context.Context, acct string, now time.Time, n int64) ([]string, error) {
	return db.rdb.ZRangeByScore(ctx, snapshotExpiryKey(acct), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(ms(now), 10), Count: n}).Result()
}

// DueSnapshotDeletes returns up to n ids of an account's snapshots whose
// contents are due for a deletion attempt at now.
func (db *DB) DueSnapshotDeletes(ctx context.Context, acct string, now time.Time, n int64) ([]string, error) {
	return db.rdb.ZRangeByScore(ctx, snapshotGCKey(acct), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(ms(now), 10), Count: n}).Result()
}

// DropSnapshotDelete removes an id from an account's deletion queue, for
// an entry whose record is gone.
func (db *DB) DropSnapshotDelete(ctx context.Context, acct, id string) error {
	return db.rdb.ZRem(ctx, snapshotGCKey(acct), id).Err()
}

// LiveSnapshots returns how many snapshots count against an instance's
// quota at now.
func (db *DB) LiveSnapshots(ctx context.Context, acct, inst string, now time.Time) (int64, error) {
	return db.rdb.ZCount(ctx, snapshotQuotaKey(acct, inst), "("+strconv.FormatInt(ms(now), 10), "+inf").Result()
}

// AccountIDs returns every account id, unsorted.
func (db *DB) AccountIDs(ctx context.Context) ([]string, error) {
	return db.rdb.SMembers(ctx, accountsKey()).Result()
}

// snapshotFields flattens a snapshot into HSET field/value pairs.
func snapshotFields(s sandgate.Snapshot) []any {
	return []any{
		"id", s.ID, "account", s.AccountID, "instance", s.InstanceID, "workspace", s.WorkspaceID,
		"provider", s.Provider, "state", string(s.State), "created_ms", ms(s.CreatedAt), "expires_ms", ms(s.ExpiresAt),
		"size", s.Size,
	}
}

func parseSnapshot(m map[string]string) (sandgate.Snapshot, error) {
	num := func(k string) int64 {
		v, _ := strconv.ParseInt(m[k], 10, 64)
		return v
	}
	s := sandgate.Snapshot{
		ID: m["id"], AccountID: m["account"], InstanceID: m["instance"], WorkspaceID: m["workspace"],
		Provider: m["provider"], ProviderRef: m["provider_ref"], Dir: m["dir"],
		State:     sandgate.SnapshotState(m["state"]),
		CreatedAt: fromMS(num("created_ms")),
		ExpiresAt: fromMS(num("expires_ms")),
		DeletedAt: fromMS(num("deleted_ms")),
		Bytes:     num("bytes"),
		Size:      m["size"],
	}
	if s.ID == "" || s.State == "" {
		return sandgate.Snapshot{}, errors.New("store: snapshot record without id or state")
	}
	return s, nil
}
