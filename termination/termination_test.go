package termination_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
)

// TestReleaseWithoutBilling: with no settler that finishes and settles in
// one step, Release still ends the workspace step by step, and refuses a
// workspace of another instance as not found, changing nothing.
func TestReleaseWithoutBilling(t *testing.T) {
	ctx := context.Background()
	db := store.New(store.Config{}, redistest.Start(t).Client())
	clock := sgtest.NewClock(time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC))
	pipe := admission.New(db.Redis(), admission.Standard(db, admission.StandardConfig{
		IdempotencyTTL: time.Hour, PendingTimeout: time.Minute,
		Risk: admission.RiskDefaults{AcquiresPerMinute: 1000, MaxOpenWorkspaces: 1000},
	})...)
	now := clock.Now()
	w := sandgate.Workspace{ID: sandgate.NewID(sandgate.PrefixWorkspace), AccountID: "acct_t", InstanceID: "inst_t",
		Size: "small", Image: "img", State: sandgate.WorkspaceStarting, CreatedAt: now, ExpiresAt: now.Add(time.Hour), LastActivity: now}
	r := &admission.Request{Workspace: w, Scope: sandgate.Scope{Limits: sandgate.Limits{MaxConcurrentWorkspaces: 10}},
		Keys: store.AdmissionKeys(w.AccountID, w.InstanceID, w.ID, "k"), KeyHash: "k", RequestHash: "h", Now: now}
	if err := pipe.Admit(ctx, r); err != nil {
		t.Fatalf("Admit: %v", err)
	}
	if ok, err := db.Confirm(ctx, w, "", now, "k", "h"); err != nil || !ok {
		t.Fatalf("Confirm = %v, %v", ok, err)
	}
	term := termination.New(termination.Config{}, termination.Deps{DB: db, Clock: clock})

	if _, err := term.Release(ctx, w.AccountID, "inst_other", w.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Release through another instance: %v; want ErrNotFound", err)
	}
	if cur, err := db.Workspace(ctx, w.AccountID, w.ID); err != nil || cur.State != sandgate.WorkspaceRunning {
		t.Fatalf("after a refused release: %q, %v; want running", cur.State, err)
	}
	clock.Advance(time.Minute)
	cur, err := term.Release(ctx, w.AccountID, w.InstanceID, w.ID)
	if err != nil || cur.State != sandgate.WorkspaceTerminated || cur.TerminationReason != sandgate.ReasonReleased ||
		!cur.TerminatedAt.Equal(clock.Now()) {
		t.Fatalf("Release = %q %q at %v, %v; want terminated, released, at %v", cur.State, cur.TerminationReason, cur.TerminatedAt, err, clock.Now())
	}
	if n, err := db.LiveCount(ctx, w.AccountID, w.InstanceID, clock.Now()); err != nil || n != 0 {
		t.Errorf("slots held after release = %d, %v; want 0", n, err)
	}
}
