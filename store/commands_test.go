package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/tally"
	"github.com/sandgate/sandgate/store"
)

func TestClaimCommandOnce(t *testing.T) {
	eachDB(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		now := time.Now().UTC()
		w := newRunning(t, db, sandgate.NewID("acct_"), sandgate.NewID("inst_"), now)
		won, lost := tally.Run(t, 40, "ClaimCommand", func(int) error {
			return db.ClaimCommand(ctx, w, "k1", now, now.Add(time.Minute), now.Add(10*time.Minute))
		}, func(err error) bool {
			var c *store.CommandClaimed
			return errors.As(err, &c) && c.State == sandgate.CommandStarting
		})
		if won != 1 || lost != 39 {
			t.Fatalf("claims won, found claimed = %d, %d; want 1, 39", won, lost)
		}
		got, err := db.Workspace(ctx, w.AccountID, w.ID)
		if err != nil || !got.BusyUntil.Equal(now.Add(10*time.Minute).Truncate(time.Millisecond)) {
			t.Errorf("BusyUntil = %v, %v; want the command's deadline", got.BusyUntil, err)
		}
		if !got.IdleAt().Equal(got.BusyUntil.Add(w.IdleTimeout)) {
			t.Errorf("IdleAt = %v; want BusyUntil + idle timeout", got.IdleAt())
		}
		if st, err := db.CommandLaunched(ctx, w, "k1"); err != nil || st != sandgate.CommandRunning {
			t.Errorf("CommandLaunched = %q, %v; want running", st, err)
		}
		if st, err := db.FinishCommand(ctx, w, "k1", sandgate.CommandCompleted, 3, false, now.Add(time.Second)); err != nil || st != sandgate.CommandCompleted {
			t.Fatalf("FinishCommand = %q, %v", st, err)
		}
		c, err := db.Command(ctx, w, "k1")
		if err != nil || c.State != sandgate.CommandCompleted || !c.HasExit || c.ExitCode != 3 || !c.Launched {
			t.Errorf("Command = %+v, %v; want completed with exit 3", c, err)
		}
		got, _ = db.Workspace(ctx, w.AccountID, w.ID)
		if !got.BusyUntil.IsZero() || !got.LastActivity.Equal(now.Add(time.Second).Truncate(time.Millisecond)) {
			t.Errorf("after finish: BusyUntil %v, LastActivity %v; want zero and the finish time", got.BusyUntil, got.LastActivity)
		}
		// A cancel after completion keeps the result.
		if o, err := db.CancelCommand(ctx, w, "k1", now); err != nil || o != store.CancelFinished {
			t.Errorf("CancelCommand of a completed command = %v, %v; want CancelFinished", o, err)
		}
		if c, _ := db.Command(ctx, w, "k1"); c.State != sandgate.CommandCompleted {
			t.Errorf("state after a late cancel = %q; want completed", c.State)
		}
	})
}

func TestCancelFencesClaim(t *testing.T) {
	eachDB(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		now := time.Now().UTC()
		w := newRunning(t, db, sandgate.NewID("acct_"), sandgate.NewID("inst_"), now)
		if o, err := db.CancelCommand(ctx, w, "early", now); err != nil || o != store.CancelFenced {
			t.Fatalf("CancelCommand before any claim = %v, %v; want CancelFenced", o, err)
		}
		var c *store.CommandClaimed
		if err := db.ClaimCommand(ctx, w, "early", now, now.Add(time.Minute), now.Add(time.Minute)); !errors.As(err, &c) || c.State != sandgate.CommandCanceled {
			t.Errorf("ClaimCommand after a cancel = %v; want claimed, canceled", err)
		}

		// A cancel between claim and launch: the launch keeps it canceled.
		if err := db.ClaimCommand(ctx, w, "mid", now, now.Add(time.Minute), now.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if o, err := db.CancelCommand(ctx, w, "mid", now); err != nil || o != store.CancelRecorded {
			t.Fatalf("CancelCommand of a starting command = %v, %v; want CancelRecorded", o, err)
		}
		if st, _ := db.CommandLaunched(ctx, w, "mid"); st != sandgate.CommandCanceled {
			t.Errorf("CommandLaunched after a cancel = %q; want canceled", st)
		}
		// The provider found it completed before the kill: completed wins.
		if st, _ := db.FinishCommand(ctx, w, "mid", sandgate.CommandCompleted, 0, false, now); st != sandgate.CommandCompleted {
			t.Errorf("FinishCommand completed after a cancel = %q; want completed", st)
		}
		// Unclaim releases a starting identity only.
		if err := db.ClaimCommand(ctx, w, "free", now, now.Add(time.Minute), now.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if err := db.UnclaimCommand(ctx, w, "free"); err != nil {
			t.Fatal(err)
		}
		if err := db.ClaimCommand(ctx, w, "free", now, now.Add(time.Minute), now.Add(time.Minute)); err != nil {
			t.Errorf("ClaimCommand after unclaim = %v; want a fresh claim", err)
		}
		// A workspace that is not running takes no claim.
		if _, _, err := db.BeginTerminate(ctx, w, sandgate.ReasonReleased, now); err != nil {
			t.Fatal(err)
		}
		if err := db.ClaimCommand(ctx, w, "late", now, now.Add(time.Minute), now.Add(time.Minute)); !errors.Is(err, store.ErrStateChanged) {
			t.Errorf("ClaimCommand on a terminating workspace = %v; want ErrStateChanged", err)
		}
	})
}

// TestListWorkspacesTies pages through workspaces that share one creation
// time, while more are added with that time, and finds every one of the
// first set exactly once.
func TestListWorkspacesTies(t *testing.T) {
	eachDB(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Second)
		acct, inst := sandgate.NewID("acct_"), sandgate.NewID("inst_")
		want := map[string]bool{}
		for range 230 {
			want[newRunning(t, db, acct, inst, now).ID] = true
		}
		seen := map[string]int{}
		cursor := ""
		for page := 0; ; page++ {
			ws, next, err := db.ListWorkspaces(ctx, acct, inst, cursor, 7, true, now)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range ws {
				seen[w.ID]++
			}
			if page%3 == 0 {
				newRunning(t, db, acct, inst, now) // same score, sorts anywhere
			}
			if next == "" {
				break
			}
			cursor = next
		}
		for id := range want {
			if seen[id] != 1 {
				t.Errorf("workspace %s listed %d times; want once", id, seen[id])
			}
		}
		for id, n := range seen {
			if n != 1 {
				t.Errorf("workspace %s listed %d times", id, n)
			}
		}
	})
}

// TestFinishCommandKeepsLaterActivity: a command found finished after the
// workspace was used again (by the reaper, at the command's real end) no
// longer keeps it busy, and does not move its last activity back; the busy
// set lists commands only, not execs.
func TestFinishCommandKeepsLaterActivity(t *testing.T) {
	eachDB(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Millisecond)
		w := newRunning(t, db, sandgate.NewID("acct_"), sandgate.NewID("inst_"), now)
		if err := db.ClaimCommand(ctx, w, "k1", now, now.Add(time.Minute), now.Add(10*time.Minute)); err != nil {
			t.Fatal(err)
		}
		if err := db.ExecStarted(ctx, w, "e1", now.Add(time.Minute), now); err != nil {
			t.Fatal(err)
		}
		if keys, err := db.BusyCommands(ctx, w); err != nil || len(keys) != 1 || keys[0] != "k1" {
			t.Errorf("BusyCommands = %q, %v; want [k1]", keys, err)
		}
		if err := db.ExecEnded(ctx, w, "e1", now.Add(20*time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := db.FinishCommand(ctx, w, "k1", sandgate.CommandCompleted, 0, false, now.Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		got, err := db.Workspace(ctx, w.AccountID, w.ID)
		if err != nil || !got.BusyUntil.IsZero() || !got.LastActivity.Equal(now.Add(20*time.Second)) {
			t.Errorf("after the finish: busy until %v, last activity %v (%v); want none, %v", got.BusyUntil, got.LastActivity, err, now.Add(20*time.Second))
		}
		if keys, err := db.BusyCommands(ctx, w); err != nil || len(keys) != 0 {
			t.Errorf("BusyCommands after the finish = %q, %v; want none", keys, err)
		}
	})
}
