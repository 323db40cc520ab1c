package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/internal/tally"
	"github.com/sandgate/sandgate/store"
)

// eachDB runs fn against a fresh store on every Redis topology: one
// redis-server and a Redis Cluster (redistest.Each).
func eachDB(t *testing.T, fn func(t *testing.T, db *store.DB)) {
	t.Helper()
	redistest.Each(t, func(t *testing.T, rdb redis.UniversalClient) { fn(t, store.New(store.Config{}, rdb)) })
}

// eachScope is eachDB with a fresh account and instance, and the time the
// test runs at, as every snapshot test starts.
func eachScope(t *testing.T, fn func(t *testing.T, db *store.DB, acct, inst string, now time.Time)) {
	t.Helper()
	eachDB(t, func(t *testing.T, db *store.DB) {
		fn(t, db, sandgate.NewID("acct_"), sandgate.NewID("inst_"), time.Now().UTC())
	})
}

// newSnapshot returns a creating snapshot of a fresh account and instance
// (or of acct and inst when set).
func newSnapshot(acct, inst string, now time.Time) sandgate.Snapshot {
	return sandgate.Snapshot{
		ID: sandgate.NewID(sandgate.PrefixSnapshot), AccountID: acct, InstanceID: inst, WorkspaceID: "ws_x",
		State: sandgate.SnapshotCreating, CreatedAt: now, ExpiresAt: now.Add(time.Hour),
	}
}

// beginSnapshot begins a new snapshot of acct and inst under the key "key",
// with a quota of one and a pending deadline a minute after now.
func beginSnapshot(t *testing.T, db *store.DB, acct, inst string, now time.Time) sandgate.Snapshot {
	t.Helper()
	s := newSnapshot(acct, inst, now)
	if err := db.BeginSnapshot(context.Background(), s, 1, 0, now.Add(time.Minute), "key", "hash", now); err != nil {
		t.Fatalf("BeginSnapshot: %v", err)
	}
	return s
}

func TestSnapshotQuotaAtomic(t *testing.T) {
	eachScope(t, func(t *testing.T, db *store.DB, acct, inst string, now time.Time) {
		ctx := context.Background()
		ok, full := tally.Run(t, 50, "BeginSnapshot", func(i int) error {
			return db.BeginSnapshot(ctx, newSnapshot(acct, inst, now), 3, 0, now.Add(time.Minute), fmt.Sprint("k", i), "h", now)
		}, isErr(store.ErrQuota))
		if ok != 3 || full != 47 {
			t.Fatalf("begun, refused = %d, %d; want 3, 47", ok, full)
		}
		claimed := 0
		for i := range 50 {
			if _, err := db.Idempotency(ctx, acct, inst, store.OpSnapshot, fmt.Sprint("k", i)); err == nil {
				claimed++
			}
		}
		if claimed != 3 {
			t.Errorf("keys claimed = %d; want 3: a refusal claims nothing", claimed)
		}
		// Another instance of the account has its own quota.
		if err := db.BeginSnapshot(ctx, newSnapshot(acct, "inst_other", now), 3, 0, now.Add(time.Minute), "k", "h", now); err != nil {
			t.Errorf("BeginSnapshot of another instance: %v", err)
		}
	})
}

func TestSnapshotLife(t *testing.T) {
	eachScope(t, func(t *testing.T, db *store.DB, acct, inst string, now time.Time) {
		ctx := context.Background()
		s := beginSnapshot(t, db, acct, inst, now)
		var replay *store.SnapshotReplay
		if err := db.BeginSnapshot(ctx, newSnapshot(acct, inst, now), 1, 0, now.Add(time.Minute), "key", "hash", now); !errors.As(err, &replay) ||
			replay.Record.SnapshotID != s.ID || replay.Record.State != store.IdemInProgress {
			t.Fatalf("BeginSnapshot with the same key = %v; want a replay of %s in progress", err, s.ID)
		}
		if err := db.ConfirmSnapshot(ctx, s, "ref-1", "/workspace/dir", "key", "hash", 0, now); err != nil {
			t.Fatalf("ConfirmSnapshot: %v", err)
		}
		got, err := db.Snapshot(ctx, acct, s.ID)
		if err != nil || got.State != sandgate.SnapshotLive || got.Dir != "/workspace/dir" || got.ProviderRef != "ref-1" ||
			!got.ExpiresAt.Equal(s.ExpiresAt.Truncate(time.Millisecond)) {
			t.Fatalf("Snapshot = %+v, %v; want live with its dir and ref", got, err)
		}
		if rec, err := db.Idempotency(ctx, acct, inst, store.OpSnapshot, "key"); err != nil || rec.State != store.IdemDone || rec.SnapshotID != s.ID {
			t.Errorf("key after confirm = %+v, %v; want done, %s", rec, err, s.ID)
		}
		if n, _ := db.LiveSnapshots(ctx, acct, inst, now); n != 1 {
			t.Errorf("LiveSnapshots = %d; want 1", n)
		}
		if err := db.BeginSnapshot(ctx, newSnapshot(acct, inst, now), 1, 0, now.Add(time.Minute), "key2", "hash", now); !errors.Is(err, store.ErrQuota) {
			t.Errorf("BeginSnapshot at the quota = %v; want ErrQuota", err)
		}

		started, err := db.DeleteSnapshot(ctx, got, now)
		if err != nil || !started {
			t.Fatalf("DeleteSnapshot = %v, %v; want started", started, err)
		}
		if again, err := db.DeleteSnapshot(ctx, got, now); err != nil || again {
			t.Errorf("second DeleteSnapshot = %v, %v; want not started, nil", again, err)
		}
		if n, _ := db.LiveSnapshots(ctx, acct, inst, now); n != 0 {
			t.Errorf("LiveSnapshots after delete = %d; want 0", n)
		}
		due, err := db.DueSnapshotDeletes(ctx, acct, now, 10)
		if err != nil || len(due) != 1 || due[0] != s.ID {
			t.Fatalf("DueSnapshotDeletes = %v, %v; want [%s]", due, err, s.ID)
		}
		if err := db.RetrySnapshotDelete(ctx, acct, s.ID, now.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if due, _ := db.DueSnapshotDeletes(ctx, acct, now, 10); len(due) != 0 {
			t.Errorf("DueSnapshotDeletes after a retry was scheduled = %v; want none", due)
		}
		if err := db.PurgeSnapshot(ctx, got); err != nil {
			t.Fatal(err)
		}
		tomb, err := db.Snapshot(ctx, acct, s.ID)
		if err != nil || tomb.State != sandgate.SnapshotDeleted || tomb.Dir != "" || tomb.ProviderRef != "" || tomb.InstanceID != inst {
			t.Errorf("tombstone = %+v, %v; want deleted, owned by %s, without dir or ref", tomb, err, inst)
		}
		if ttl := db.Redis().PTTL(ctx, "sg:{"+acct+"}:snap:"+s.ID).Val(); ttl <= 0 {
			t.Errorf("tombstone TTL = %v; want one", ttl)
		}
		if due, _ := db.DueSnapshotDeletes(ctx, acct, now.Add(time.Hour), 10); len(due) != 0 {
			t.Errorf("deletion queue after purge = %v; want empty", due)
		}
	})
}

func TestSnapshotAbortFreesKey(t *testing.T) {
	eachScope(t, func(t *testing.T, db *store.DB, acct, inst string, now time.Time) {
		ctx := context.Background()
		s := beginSnapshot(t, db, acct, inst, now)
		if err := db.AbortSnapshot(ctx, s, "key"); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Snapshot(ctx, acct, s.ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Snapshot after abort = %v; want ErrNotFound", err)
		}
		if err := db.BeginSnapshot(ctx, newSnapshot(acct, inst, now), 1, 0, now.Add(time.Minute), "key", "hash", now); err != nil {
			t.Errorf("BeginSnapshot with the aborted key = %v; want a fresh claim and a free slot", err)
		}
	})
}

// TestSnapshotPendingExpiry: a create whose gateway died holds its slot
// only until the pending deadline; the reaper then queues its contents for
// deletion, and a late confirm is refused with the key freed.
func TestSnapshotPendingExpiry(t *testing.T) {
	eachScope(t, func(t *testing.T, db *store.DB, acct, inst string, now time.Time) {
		ctx := context.Background()
		s := beginSnapshot(t, db, acct, inst, now)
		later := now.Add(2 * time.Minute)
		if n, _ := db.LiveSnapshots(ctx, acct, inst, later); n != 0 {
			t.Errorf("LiveSnapshots past the pending deadline = %d; want 0", n)
		}
		if due, _ := db.DueSnapshots(ctx, acct, now, 10); len(due) != 0 {
			t.Errorf("DueSnapshots before the deadline = %v; want none", due)
		}
		due, err := db.DueSnapshots(ctx, acct, later, 10)
		if err != nil || len(due) != 1 {
			t.Fatalf("DueSnapshots = %v, %v; want the one", due, err)
		}
		if ok, err := db.ExpireSnapshot(ctx, acct, due[0], now); err != nil || ok {
			t.Errorf("ExpireSnapshot before it is due = %v, %v; want false", ok, err)
		}
		if ok, err := db.ExpireSnapshot(ctx, acct, due[0], later); err != nil || !ok {
			t.Fatalf("ExpireSnapshot = %v, %v; want started", ok, err)
		}
		if err := db.ConfirmSnapshot(ctx, s, "ref", "/tmp/x", "key", "hash", 0, now); !errors.Is(err, store.ErrStateChanged) {
			t.Errorf("late ConfirmSnapshot = %v; want ErrStateChanged", err)
		}
		if _, err := db.Idempotency(ctx, acct, inst, store.OpSnapshot, "key"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("key after a refused confirm = %v; want freed", err)
		}
		if got, _ := db.Snapshot(ctx, acct, s.ID); got.State != sandgate.SnapshotDeleting || got.Dir != "" {
			t.Errorf("expired create = %+v; want deleting, no dir", got)
		}
		if due, _ := db.DueSnapshotDeletes(ctx, acct, later, 10); len(due) != 1 {
			t.Errorf("deletion queue = %v; want the expired create", due)
		}
	})
}

// newRunning admits and confirms a running workspace of a fresh account.
func newRunning(t *testing.T, db *store.DB, acct, inst string, now time.Time) sandgate.Workspace {
	t.Helper()
	w, key := newStarting(t, db, acct, inst, now)
	if ok, err := db.Confirm(context.Background(), w, "ref-"+w.ID, now, key, "h"); err != nil || !ok {
		t.Fatalf("Confirm: %v, %v", ok, err)
	}
	return readWorkspace(t, db, acct, w.ID)
}

// TestSnapshotByteQuota: live snapshots' sizes add up against
// max_snapshot_bytes; a begin at the quota and a confirm past it change
// nothing; a deletion or an expiry gives the bytes back.
func TestSnapshotByteQuota(t *testing.T) {
	eachScope(t, func(t *testing.T, db *store.DB, acct, inst string, now time.Time) {
		ctx := context.Background()
		const max = 1000
		begin := func(key string) (sandgate.Snapshot, error) {
			s := newSnapshot(acct, inst, now)
			return s, db.BeginSnapshot(ctx, s, 10, max, now.Add(time.Minute), key, "hash", now)
		}
		confirm := func(s sandgate.Snapshot, key string, bytes int64) error {
			s.Bytes = bytes
			return db.ConfirmSnapshot(ctx, s, "ref-"+s.ID, "/workspace", key, "hash", max, now)
		}
		live := func() int64 {
			n, err := db.LiveSnapshotBytes(ctx, acct, inst, now)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}

		s1, err := begin("k1")
		if err != nil {
			t.Fatal(err)
		}
		if err := confirm(s1, "k1", 600); err != nil {
			t.Fatalf("confirm of 600 bytes: %v", err)
		}
		if got, _ := db.Snapshot(ctx, acct, s1.ID); got.Bytes != 600 || got.State != sandgate.SnapshotLive {
			t.Errorf("snapshot record = %+v; want live, 600 bytes", got)
		}
		s2, err := begin("k2")
		if err != nil {
			t.Fatalf("begin under the byte quota: %v", err)
		}
		if err := confirm(s2, "k2", 401); !errors.Is(err, store.ErrByteQuota) {
			t.Errorf("confirm of 401 bytes past 600 of %d = %v; want ErrByteQuota", max, err)
		}
		if got, _ := db.Snapshot(ctx, acct, s2.ID); got.State != sandgate.SnapshotCreating {
			t.Errorf("snapshot refused at confirm = %+v; want still creating (the caller aborts)", got)
		}
		if err := db.AbortSnapshot(ctx, s2, "k2"); err != nil {
			t.Fatal(err)
		}
		s3, err := begin("k3")
		if err != nil {
			t.Fatal(err)
		}
		if err := confirm(s3, "k3", 400); err != nil {
			t.Fatalf("confirm up to exactly the quota: %v", err)
		}
		if got := live(); got != max {
			t.Errorf("LiveSnapshotBytes = %d; want %d", got, max)
		}
		s4, err := begin("k4")
		if !errors.Is(err, store.ErrByteQuota) {
			t.Errorf("begin at the byte quota = %v; want ErrByteQuota", err)
		}
		if _, err := db.Snapshot(ctx, acct, s4.ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("record after a refused begin = %v; want none", err)
		}
		if _, err := db.Idempotency(ctx, acct, inst, store.OpSnapshot, "k4"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("key after a refused begin = %v; want unclaimed", err)
		}
		if _, err := db.DeleteSnapshot(ctx, s1, now); err != nil {
			t.Fatal(err)
		}
		if got := live(); got != 400 {
			t.Errorf("LiveSnapshotBytes after deleting 600 = %d; want 400", got)
		}
		if _, err := begin("k4"); err != nil {
			t.Errorf("begin after a deletion freed bytes: %v", err)
		}
		if n, _ := db.LiveSnapshotBytes(ctx, acct, inst, now.Add(2*time.Hour)); n != 0 {
			t.Errorf("LiveSnapshotBytes past every expires_at = %d; want 0", n)
		}
	})
}

// TestSnapshotByteQuotaAtomic: concurrent confirms never take the live
// snapshots past the byte quota.
func TestSnapshotByteQuotaAtomic(t *testing.T) {
	eachScope(t, func(t *testing.T, db *store.DB, acct, inst string, now time.Time) {
		ctx := context.Background()
		ok, over := tally.Run(t, 30, "BeginSnapshot or ConfirmSnapshot", func(i int) error {
			s := newSnapshot(acct, inst, now)
			key := fmt.Sprint("k", i)
			if err := db.BeginSnapshot(ctx, s, 100, 1000, now.Add(time.Minute), key, "h", now); err != nil {
				return err
			}
			s.Bytes = 100
			return db.ConfirmSnapshot(ctx, s, "ref", "/workspace", key, "h", 1000, now)
		}, isErr(store.ErrByteQuota))
		if ok != 10 {
			t.Errorf("confirmed %d snapshots of 100 bytes under a quota of 1000 (%d refused at begin or confirm); want 10", ok, over)
		}
		if n, _ := db.LiveSnapshotBytes(ctx, acct, inst, now); n != 1000 {
			t.Errorf("LiveSnapshotBytes = %d; want 1000", n)
		}
	})
}

// isErr reports whether an error is target, for tally.Run.
func isErr(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}
