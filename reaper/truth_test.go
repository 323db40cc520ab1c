package reaper_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
	"github.com/sandgate/sandgate/reaper"
	"github.com/sandgate/sandgate/termination"
)

// truthReaper is the fixture's reaper with this broker's id and a
// reconcile interval of interval.
func (f *fixture) truthReaper(interval time.Duration) *reaper.Reaper {
	set := providers.Single(providers.LegacyName, f.prov)
	term := termination.New(termination.Config{}, termination.Deps{DB: f.db, Providers: set, Clock: f.clock})
	return reaper.New(reaper.Config{Owner: "truth", BrokerID: "test-broker", ReconcileInterval: interval},
		reaper.Deps{DB: f.db, Providers: set, Terminator: term, Clock: f.clock})
}

// TestVanishedSandboxEnded: a running workspace whose sandbox the provider
// no longer lists is ended (failed) at the listing that missed it, its
// slot freed; one confirmed less than a reconcile interval before the
// listing, one due to idle out within the interval, and one whose sandbox
// is still listed, are left running.
func TestVanishedSandboxEnded(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	gone := f.admit(time.Hour, time.Hour, true, true)
	kept := f.admit(time.Hour, time.Hour, true, true)
	idling := f.admit(time.Hour, 70*time.Second, true, true)
	r := f.truthReaper(30 * time.Second)
	f.clock.Advance(time.Minute)
	young := f.admit(time.Hour, time.Hour, true, true)
	// The vendor ends two sandboxes on its own.
	for _, w := range []sandgate.Workspace{gone, young, idling} {
		if err := f.prov.Terminate(ctx, providers.Sandbox{Ref: w.ProviderRef}); err != nil {
			t.Fatalf("Terminate at the provider: %v", err)
		}
	}
	listed := f.clock.Now()
	if err := r.Pass(ctx); err != nil {
		t.Fatalf("Pass: %v", err)
	}
	g := f.get(gone.ID)
	if g.State != sandgate.WorkspaceTerminated || g.TerminationReason != sandgate.ReasonFailed || !g.TerminatedAt.Equal(listed) {
		t.Errorf("vanished workspace: %s %s at %v; want terminated, failed at the listing %v", g.State, g.TerminationReason, g.TerminatedAt, listed)
	}
	// The idling one is due to idle out within the interval: a vendor
	// enforcing the idle timeout may end it a little early.
	for _, w := range []sandgate.Workspace{kept, young, idling} {
		if st := f.get(w.ID).State; st != sandgate.WorkspaceRunning {
			t.Errorf("workspace %s is %s; want running", w.ID, st)
		}
	}
	f.checkSlots(3)
	if n := r.Stats().Vanished.Load(); n != 1 {
		t.Errorf("Vanished = %d; want 1", n)
	}

	// The next comparison, a reconcile interval later, ends the young
	// one; the idling one has idled out, with that reason.
	f.clock.Advance(30 * time.Second)
	if err := r.Pass(ctx); err != nil {
		t.Fatalf("Pass: %v", err)
	}
	if st := f.get(young.ID).State; st != sandgate.WorkspaceTerminated {
		t.Errorf("young vanished workspace is %s; want terminated", st)
	}
	if w := f.get(idling.ID); w.State != sandgate.WorkspaceTerminated || w.TerminationReason != sandgate.ReasonIdle {
		t.Errorf("idling workspace: %s %s; want terminated, idle", w.State, w.TerminationReason)
	}
	f.checkSlots(1)
}

// TestVanishedNeedsEveryBroker: with another broker id registered on the
// store, a running workspace whose sandbox that broker labelled is found
// through the provider's ListBroker and kept running.
func TestVanishedNeedsEveryBroker(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	other, err := local.New(ctx, local.Config{DataDir: f.dir}, providers.Env{BrokerID: "other-broker", Clock: f.clock})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(other) })
	if err := f.db.RegisterBroker(ctx, "other-broker", f.clock.Now()); err != nil {
		t.Fatal(err)
	}
	// A workspace created by the other gateway: its sandbox carries the
	// other broker id.
	w := f.admit(time.Hour, time.Hour, false, false)
	sb, err := other.Create(ctx, providers.CreateSpec{WorkspaceID: w.ID, InstanceID: f.inst,
		Size: sandgate.Size{CPUCores: 1, MemoryMiB: 256}, ExpiresAt: w.ExpiresAt})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if ok, err := f.db.Confirm(ctx, w, sb.Ref, f.clock.Now(), f.keys[w.ID], "h"); err != nil || !ok {
		t.Fatalf("Confirm: %v %v", ok, err)
	}
	f.clock.Advance(time.Minute)
	if err := f.truthReaper(time.Second).Pass(ctx); err != nil {
		t.Fatalf("Pass: %v", err)
	}
	if st := f.get(w.ID).State; st != sandgate.WorkspaceRunning {
		t.Fatalf("another broker's running workspace is %s; want running", st)
	}
}
