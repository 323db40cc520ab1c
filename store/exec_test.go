package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/store"
)

// TestExecBegin: an exec's one round trip reads the record and marks the
// exec busy only when the record can take it (running, the caller's
// instance, before expires_at), until the timeout clamped to expires_at
// plus 30 s; with another command queued it only reads.
func TestExecBegin(t *testing.T) {
	eachDB(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Millisecond)
		w := newRunning(t, db, sandgate.NewID("acct_"), sandgate.NewID("inst_"), now)
		busy := func(want time.Time, what string) {
			t.Helper()
			got, err := db.Workspace(ctx, w.AccountID, w.ID)
			if err != nil || !got.BusyUntil.Equal(want) {
				t.Errorf("%s: busy until %v (%v); want %v", what, got.BusyUntil, err, want)
			}
		}

		if _, _, err := db.ExecBegin(ctx, w.AccountID, w.InstanceID, sandgate.NewID(sandgate.PrefixWorkspace), "e0", time.Minute, now, nil); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("ExecBegin of no record: %v; want ErrNotFound", err)
		}
		got, marked, err := db.ExecBegin(ctx, w.AccountID, "inst_other", w.ID, "e1", time.Minute, now, nil)
		if err != nil || marked || got.ID != w.ID || got.InstanceID != w.InstanceID {
			t.Errorf("ExecBegin by another instance = %s of %s, marked %v, %v; want the record, unmarked", got.ID, got.InstanceID, marked, err)
		}
		if _, marked, err := db.ExecBegin(ctx, w.AccountID, w.InstanceID, w.ID, "e2", time.Minute, w.ExpiresAt, nil); err != nil || marked {
			t.Errorf("ExecBegin at expires_at: marked %v, %v; want unmarked", marked, err)
		}
		busy(time.Time{}, "refused execs")

		at := now.Add(time.Second)
		got, marked, err = db.ExecBegin(ctx, w.AccountID, w.InstanceID, w.ID, "e3", 10*time.Second, at, nil)
		if err != nil || !marked || got.State != sandgate.WorkspaceRunning || !got.ExpiresAt.Equal(w.ExpiresAt) {
			t.Errorf("ExecBegin = %s %v, marked %v, %v; want running until %v, marked", got.State, got.ExpiresAt, marked, err, w.ExpiresAt)
		}
		busy(at.Add(40*time.Second), "a 10 s exec")
		if _, marked, err := db.ExecBegin(ctx, w.AccountID, w.InstanceID, w.ID, "e4", 2*time.Hour, at, nil); err != nil || !marked {
			t.Errorf("ExecBegin of a 2 h exec: marked %v, %v; want marked", marked, err)
		}
		busy(w.ExpiresAt.Add(30*time.Second), "a 2 h exec in a workspace that ends in 1 h")
		for _, m := range []string{"e3", "e4"} {
			if err := db.ExecEnded(ctx, got, m, at.Add(2*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		busy(time.Time{}, "both ended")

		var ping *redis.StatusCmd
		got, marked, err = db.ExecBegin(ctx, w.AccountID, w.InstanceID, w.ID, "e5", time.Minute, at, func(p redis.Pipeliner) error { ping = p.Ping(ctx); return nil })
		if err != nil || marked || got.ID != w.ID || ping.Err() != nil {
			t.Errorf("ExecBegin with a command queued = %s, marked %v, %v (ping %v); want the record, unmarked", got.ID, marked, err, ping.Err())
		}
		busy(time.Time{}, "a read that shared a pipeline")
		refused := errors.New("refused")
		if _, marked, err := db.ExecBegin(ctx, w.AccountID, w.InstanceID, w.ID, "e6", time.Minute, at.Add(time.Minute), func(redis.Pipeliner) error { return refused }); err != refused || marked {
			t.Errorf("ExecBegin refused by its queue = marked %v, %v; want unmarked, the refusal", marked, err)
		}
		busy(time.Time{}, "a refusal of the queue")
		if got, err := db.Workspace(ctx, w.AccountID, w.ID); err != nil || !got.LastActivity.Equal(at.Add(2*time.Second)) {
			t.Errorf("last activity %v (%v); want the last end, %v", got.LastActivity, err, at.Add(2*time.Second))
		}
	})
}
