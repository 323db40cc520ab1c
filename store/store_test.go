package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/store"
)

func newWorkspace(acct, inst string, now time.Time) sandgate.Workspace {
	return sandgate.Workspace{
		ID: sandgate.NewID(sandgate.PrefixWorkspace), AccountID: acct, InstanceID: inst,
		Label: "l", Size: "small", Image: "host", State: sandgate.WorkspaceStarting,
		CreatedAt: now, ExpiresAt: now.Add(time.Hour), IdleTimeout: time.Minute,
	}
}

// TestAdmitAtomic: concurrent admits never exceed the limit and a refusal
// claims nothing.
func TestAdmitAtomic(t *testing.T) {
	db := store.New(redistest.Start(t).Client(), store.Config{})
	ctx := context.Background()
	now := time.Now().UTC()
	acct, inst := sandgate.NewID("acct_"), sandgate.NewID("inst_")
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted, full := 0, 0
	for i := range 200 {
		wg.Go(func() {
			_, err := db.Admit(ctx, store.Admission{Workspace: newWorkspace(acct, inst, now), MaxConcurrent: 5,
				KeyHash: fmt.Sprint("k", i), RequestHash: "h", Now: now})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admitted++
			case errors.Is(err, store.ErrConcurrencyLimit):
				full++
			default:
				t.Errorf("Admit: %v", err)
			}
		})
	}
	wg.Wait()
	if admitted != 5 || full != 195 {
		t.Fatalf("admitted, refused = %d, %d; want 5, 195", admitted, full)
	}
	// A refused key was not claimed: find one and check.
	claimed := 0
	for i := range 200 {
		if _, err := db.Idempotency(ctx, acct, inst, store.OpAcquire, fmt.Sprint("k", i)); err == nil {
			claimed++
		} else if !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
	}
	if claimed != 5 {
		t.Fatalf("claimed keys = %d; want 5", claimed)
	}
	ws, _, err := db.ListWorkspaces(ctx, acct, inst, "", 100, false, now)
	if err != nil || len(ws) != 5 {
		t.Fatalf("ListWorkspaces = %d records, %v; want 5", len(ws), err)
	}
}

// TestPendingSlotExpires: a gateway that dies between admit and confirm
// cannot leak the slot: past the pending deadline the next admit prunes it,
// and a late confirm is refused so the caller terminates the sandbox.
func TestPendingSlotExpires(t *testing.T) {
	db := store.New(redistest.Start(t).Client(), store.Config{PendingTimeout: time.Minute})
	ctx := context.Background()
	now := time.Now().UTC()
	acct, inst := sandgate.NewID("acct_"), sandgate.NewID("inst_")
	stuck := newWorkspace(acct, inst, now)
	if _, err := db.Admit(ctx, store.Admission{Workspace: stuck, MaxConcurrent: 1, KeyHash: "a", RequestHash: "h", Now: now}); err != nil {
		t.Fatal(err)
	}
	_, err := db.Admit(ctx, store.Admission{Workspace: newWorkspace(acct, inst, now), MaxConcurrent: 1, KeyHash: "b", RequestHash: "h", Now: now.Add(59 * time.Second)})
	if !errors.Is(err, store.ErrConcurrencyLimit) {
		t.Fatalf("Admit inside the pending window = %v; want ErrConcurrencyLimit", err)
	}
	later := now.Add(61 * time.Second)
	if _, err := db.Admit(ctx, store.Admission{Workspace: newWorkspace(acct, inst, later), MaxConcurrent: 1, KeyHash: "c", RequestHash: "h", Now: later}); err != nil {
		t.Fatalf("Admit after the pending deadline = %v; want admitted", err)
	}
	ok, err := db.Confirm(ctx, stuck, "ref", later, "a", "h")
	if err != nil || ok {
		t.Fatalf("late Confirm = %v, %v; want false, nil", ok, err)
	}
}

// TestTerminateFreesSlot: termination frees the slot at once and is idempotent.
func TestTerminateFreesSlot(t *testing.T) {
	db := store.New(redistest.Start(t).Client(), store.Config{})
	ctx := context.Background()
	now := time.Now().UTC()
	acct, inst := sandgate.NewID("acct_"), sandgate.NewID("inst_")
	w := newWorkspace(acct, inst, now)
	if _, err := db.Admit(ctx, store.Admission{Workspace: w, MaxConcurrent: 1, KeyHash: "a", RequestHash: "h", Now: now}); err != nil {
		t.Fatal(err)
	}
	if ok, err := db.Confirm(ctx, w, "ref", now, "a", "h"); !ok || err != nil {
		t.Fatalf("Confirm = %v, %v; want true", ok, err)
	}
	prev, started, err := db.BeginTerminate(ctx, w, sandgate.ReasonReleased, now)
	if err != nil || !started || prev != sandgate.WorkspaceRunning {
		t.Fatalf("BeginTerminate = %q, %v, %v; want running, true", prev, started, err)
	}
	if n, _ := db.LiveCount(ctx, acct, inst, now); n != 0 {
		t.Fatalf("LiveCount after terminate = %d; want 0", n)
	}
	if _, started, _ := db.BeginTerminate(ctx, w, sandgate.ReasonReleased, now); started {
		t.Fatal("second BeginTerminate started again")
	}
	if err := db.FinishTerminate(ctx, w, now.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	got, err := db.Workspace(ctx, acct, w.ID)
	if err != nil || got.State != sandgate.WorkspaceTerminated || got.TerminationReason != sandgate.ReasonReleased {
		t.Fatalf("Workspace = %+v, %v; want terminated/released", got, err)
	}
}

func TestListCursor(t *testing.T) {
	db := store.New(redistest.Start(t).Client(), store.Config{})
	ctx := context.Background()
	now := time.Now().UTC()
	acct, inst := sandgate.NewID("acct_"), sandgate.NewID("inst_")
	want := map[string]bool{}
	for i := range 23 {
		w := newWorkspace(acct, inst, now.Add(time.Duration(i%4)*time.Millisecond)) // many share a score
		if _, err := db.Admit(ctx, store.Admission{Workspace: w, MaxConcurrent: 100, KeyHash: fmt.Sprint(i), RequestHash: "h", Now: now}); err != nil {
			t.Fatal(err)
		}
		want[w.ID] = true
	}
	seen := map[string]bool{}
	cursor := ""
	for pages := 0; ; pages++ {
		ws, next, err := db.ListWorkspaces(ctx, acct, inst, cursor, 4, true, now)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range ws {
			if seen[w.ID] {
				t.Fatalf("workspace %s listed twice", w.ID)
			}
			seen[w.ID] = true
		}
		if next == "" {
			break
		}
		if pages > 10 {
			t.Fatal("paging does not end")
		}
		cursor = next
	}
	if len(seen) != len(want) {
		t.Fatalf("listed %d; want %d", len(seen), len(want))
	}
	if _, _, err := db.ListWorkspaces(ctx, acct, inst, "!!", 4, true, now); !errors.Is(err, store.ErrBadCursor) {
		t.Fatalf("bad cursor = %v; want ErrBadCursor", err)
	}
}
