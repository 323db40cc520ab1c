package reaper_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
	"github.com/sandgate/sandgate/reaper"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
)

type fixture struct {
	t     *testing.T
	db    *store.DB
	clock *sgtest.Clock
	prov  *local.Provider
	dir   string
	acct  string
	inst  string
	keys  map[string]string // workspace id → key hash
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	db := store.New(store.Config{PendingTimeout: time.Minute}, redistest.Start(t).Client())
	clock := sgtest.NewClock(time.Now().Truncate(time.Second))
	dir := t.TempDir()
	prov, err := local.New(context.Background(), local.Config{DataDir: dir}, providers.Env{BrokerID: "test-broker", Clock: clock})
	if err != nil {
		t.Skipf("local provider unavailable: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(prov) }) // its background teardown ends before its directory goes
	f := &fixture{t: t, db: db, clock: clock, prov: prov, dir: dir, acct: sandgate.NewID(sandgate.PrefixAccount),
		inst: sandgate.NewID(sandgate.PrefixInstance), keys: map[string]string{}}
	ctx := context.Background()
	if err := db.CreateAccount(ctx, sandgate.Account{ID: f.acct, Name: "a", CreatedAt: clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := db.PutInstance(ctx, sandgate.Instance{ID: f.inst, AccountID: f.acct, Name: "i", CreatedAt: clock.Now()}); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) reaper(owner string) *reaper.Reaper {
	term := termination.New(termination.Config{}, termination.Deps{DB: f.db, Providers: providers.Single(providers.LegacyName, f.prov), Clock: f.clock})
	return reaper.New(reaper.Config{Owner: owner, Interval: 100 * time.Millisecond, LeaseTTL: time.Second},
		reaper.Deps{DB: f.db, Providers: providers.Single(providers.LegacyName, f.prov), Terminator: term, Clock: f.clock})
}

// admit admits a workspace (starting) and, with create, creates its sandbox
// at the provider; with confirm, confirms it (running).
func (f *fixture) admit(life, idle time.Duration, create, confirm bool) sandgate.Workspace {
	f.t.Helper()
	ctx := context.Background()
	now := f.clock.Now()
	w := sandgate.Workspace{
		ID: sandgate.NewID(sandgate.PrefixWorkspace), AccountID: f.acct, InstanceID: f.inst,
		Label: "l", Size: "small", Image: local.Image, State: sandgate.WorkspaceStarting,
		CreatedAt: now, ExpiresAt: now.Add(life), IdleTimeout: idle, LastActivity: now,
	}
	p := admission.New(f.db.Redis(), admission.Standard(f.db, admission.StandardConfig{
		IdempotencyTTL: time.Hour, PendingTimeout: time.Minute,
		Risk: admission.RiskDefaults{AcquiresPerMinute: 1 << 20, MaxOpenWorkspaces: 1 << 20}})...)
	key := sandgate.NewID("k")
	f.keys[w.ID] = key
	err := p.Admit(ctx, &admission.Request{Workspace: w, Scope: sandgate.Scope{Limits: sandgate.Limits{MaxConcurrentWorkspaces: 1 << 20}},
		Keys: store.AdmissionKeys(f.acct, f.inst, w.ID, key), KeyHash: key, RequestHash: "h", Now: now})
	if err != nil {
		f.t.Fatalf("Admit: %v", err)
	}
	if create {
		sb, err := f.prov.Create(ctx, providers.CreateSpec{WorkspaceID: w.ID, InstanceID: f.inst,
			Size: sandgate.Size{CPUCores: 1, MemoryMiB: 256}, ExpiresAt: w.ExpiresAt})
		if err != nil {
			f.t.Fatalf("Create: %v", err)
		}
		if confirm {
			if ok, err := f.db.Confirm(ctx, w, sb.Ref, now, key, "h"); err != nil || !ok {
				f.t.Fatalf("Confirm: %v %v", ok, err)
			}
		}
	}
	return f.get(w.ID)
}

func (f *fixture) get(id string) sandgate.Workspace {
	f.t.Helper()
	w, err := f.db.Workspace(context.Background(), f.acct, id)
	if err != nil {
		f.t.Fatalf("Workspace: %v", err)
	}
	return w
}

func (f *fixture) sandboxExists(id string) bool {
	_, err := os.Stat(filepath.Join(f.dir, "workspaces", id))
	return err == nil
}

// checkSlots checks that the slots and reservations equal the live records.
func (f *fixture) checkSlots(wantLive int) {
	f.t.Helper()
	live, open, err := f.db.SlotCounts(context.Background(), f.acct, f.inst)
	if err != nil {
		f.t.Fatal(err)
	}
	ws, err := f.db.LiveWorkspaces(context.Background(), f.acct, f.inst, f.clock.Now())
	if err != nil {
		f.t.Fatal(err)
	}
	if live != int64(wantLive) || open != int64(wantLive) || len(ws) != wantLive {
		f.t.Fatalf("slots %d, reservations %d, live records %d; want %d each", live, open, len(ws), wantLive)
	}
}

func TestExpiredAndIdle(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	exp := f.admit(10*time.Second, 0, true, true)
	idle := f.admit(time.Hour, 5*time.Second, true, true)
	busy := f.admit(time.Hour, 5*time.Second, true, true)
	keep := f.admit(time.Hour, time.Hour, true, true)
	if err := f.db.ExecStarted(ctx, busy, "x", f.clock.Now().Add(time.Minute), f.clock.Now()); err != nil {
		t.Fatal(err)
	}
	r := f.reaper("a")
	f.clock.Advance(11 * time.Second)
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		w      sandgate.Workspace
		reason sandgate.TerminationReason
	}{{exp, sandgate.ReasonExpired}, {idle, sandgate.ReasonIdle}} {
		got := f.get(c.w.ID)
		if got.State != sandgate.WorkspaceTerminated || got.TerminationReason != c.reason {
			t.Errorf("%s: state %s reason %s, want terminated %s", c.reason, got.State, got.TerminationReason, c.reason)
		}
		if f.sandboxExists(c.w.ID) {
			t.Errorf("%s: sandbox still there", c.reason)
		}
	}
	if got := f.get(busy.ID); got.State != sandgate.WorkspaceRunning {
		t.Errorf("workspace with an exec in flight: %s %s, want running", got.State, got.TerminationReason)
	}
	if got := f.get(keep.ID); got.State != sandgate.WorkspaceRunning {
		t.Errorf("active workspace: %s, want running", got.State)
	}
	// Ended by this pass, they are not orphans of its (older) listing too.
	if n := r.Stats().Orphaned.Load(); n != 0 {
		t.Errorf("the pass that ended 2 workspaces counted %d orphans; want 0", n)
	}
	// The exec ends: idle an idle timeout later.
	if err := f.db.ExecEnded(ctx, busy, "x", f.clock.Now()); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(6 * time.Second)
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.get(busy.ID); got.TerminationReason != sandgate.ReasonIdle {
		t.Errorf("after its exec: %s %s, want idle", got.State, got.TerminationReason)
	}
	f.checkSlots(1)
}

// TestIdleAfterDurableCommand: a durable command that finished with nobody
// reading it stops keeping its workspace busy, so the workspace idles an
// idle timeout after the command's end, not after its deadline; one still
// running keeps its workspace. The commands run in real sandboxes, so their
// end is the wall clock's, and the test's clock is set past it.
func TestIdleAfterDurableCommand(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const idle = 20 * time.Second
	tests := []struct {
		name    string
		argv    []string
		wantEnd bool // ended as idle, or still running
	}{
		{"finished", []string{"echo", "hi"}, true},
		{"still running", []string{"sleep", "120"}, false},
	}
	ws := make([]sandgate.Workspace, len(tests))
	for i, tt := range tests {
		w := f.admit(time.Hour, idle, true, true)
		now := f.clock.Now()
		key := fmt.Sprintf("%x", sha256.Sum256([]byte(tt.name)))
		if err := f.db.ClaimCommand(ctx, w, key, now, now.Add(time.Minute), now.Add(15*time.Minute)); err != nil {
			t.Fatalf("%s: ClaimCommand: %v", tt.name, err)
		}
		sb := providers.Sandbox{Ref: w.ProviderRef}
		if err := f.prov.StartCommand(ctx, sb, key, providers.ExecSpec{Argv: tt.argv, Timeout: 15 * time.Minute, MaxOutputBytes: 100}); err != nil {
			t.Fatalf("%s: StartCommand: %v", tt.name, err)
		}
		if _, err := f.db.CommandLaunched(ctx, w, key); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.prov.CancelCommand(context.Background(), sb, key) })
		for j := 0; tt.wantEnd; j++ {
			st, err := f.prov.ReadCommand(ctx, sb, key, 0)
			if err != nil {
				t.Fatal(err)
			}
			if st.State == providers.CommandCompleted {
				break
			}
			if j == 1500 {
				t.Fatalf("%s: command still %s after 30s", tt.name, st.State)
			}
			time.Sleep(20 * time.Millisecond)
		}
		ws[i] = f.get(w.ID)
		if !ws[i].BusyUntil.After(now.Add(idle)) {
			t.Fatalf("%s: busy until %v; want the command's deadline", tt.name, ws[i].BusyUntil)
		}
	}
	// Past every command's end and every claim by more than the idle
	// timeout, well before the commands' deadline.
	f.clock.Set(time.Now().Add(idle + time.Second))
	if err := f.reaper("a").Pass(ctx); err != nil {
		t.Fatal(err)
	}
	for i, tt := range tests {
		got := f.get(ws[i].ID)
		switch {
		case tt.wantEnd && got.TerminationReason != sandgate.ReasonIdle:
			t.Errorf("%s: state %s reason %q; want ended as idle", tt.name, got.State, got.TerminationReason)
		case !tt.wantEnd && got.State != sandgate.WorkspaceRunning:
			t.Errorf("%s: state %s reason %q; want running", tt.name, got.State, got.TerminationReason)
		}
	}
}

func TestRevokedScope(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	old := f.admit(time.Hour, time.Hour, true, true)
	f.clock.Advance(2 * time.Second)
	if err := f.db.MarkRevoked(ctx, f.acct, f.inst, f.clock.Now()); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(2 * time.Second)
	later := f.admit(time.Hour, time.Hour, true, true)
	if err := f.reaper("a").Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.get(old.ID); got.TerminationReason != sandgate.ReasonLeaseRevoked || got.State != sandgate.WorkspaceTerminated {
		t.Errorf("revoked: %s %s", got.State, got.TerminationReason)
	}
	if got := f.get(later.ID); got.State != sandgate.WorkspaceRunning {
		t.Errorf("acquired after the revocation: %s", got.State)
	}
	f.checkSlots(1)
}

func TestUnknownCreate(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	created := f.admit(time.Hour, time.Hour, true, false) // the gateway died after the provider's create
	never := f.admit(time.Hour, time.Hour, false, false)  // … or before it
	r := f.reaper("a")
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if f.get(created.ID).State != sandgate.WorkspaceStarting {
		t.Fatal("resolved before its pending deadline")
	}
	f.clock.Advance(time.Minute + 2*time.Second)
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	for _, w := range []sandgate.Workspace{created, never} {
		got := f.get(w.ID)
		if got.State != sandgate.WorkspaceTerminated || got.TerminationReason != sandgate.ReasonFailed {
			t.Errorf("%s: %s %s, want terminated failed", w.ID, got.State, got.TerminationReason)
		}
		if _, err := f.db.Idempotency(ctx, f.acct, f.inst, store.OpAcquire, f.keys[w.ID]); err != store.ErrNotFound {
			t.Errorf("key still claimed: %v", err)
		}
	}
	if f.sandboxExists(created.ID) {
		t.Error("the created sandbox is still there")
	}
	f.checkSlots(0)
}

func TestOrphans(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	// Created directly through the provider, with the broker's labels and no record.
	orphan, err := f.prov.Create(ctx, providers.CreateSpec{WorkspaceID: sandgate.NewID(sandgate.PrefixWorkspace), InstanceID: f.inst,
		Size: sandgate.Size{CPUCores: 1, MemoryMiB: 256}, ExpiresAt: f.clock.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	// Another broker's sandbox on the same host: not ours to touch.
	other, err := local.New(ctx, local.Config{DataDir: f.dir}, providers.Env{BrokerID: "another-broker"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { providertest.Discard(other) })
	foreign, err := other.Create(ctx, providers.CreateSpec{WorkspaceID: sandgate.NewID(sandgate.PrefixWorkspace), InstanceID: f.inst,
		Size: sandgate.Size{CPUCores: 1, MemoryMiB: 256}, ExpiresAt: f.clock.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	// A directory without labels at all.
	bare := filepath.Join(f.dir, "workspaces", sandgate.NewID(sandgate.PrefixWorkspace))
	if err := os.Mkdir(bare, 0o700); err != nil {
		t.Fatal(err)
	}
	live := f.admit(time.Hour, time.Hour, true, true)
	starting := f.admit(time.Hour, time.Hour, true, false)
	if err := f.reaper("a").Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if f.sandboxExists(orphan.Ref) {
		t.Error("orphan not terminated")
	}
	for _, id := range []string{foreign.Ref, live.ID, starting.ID, filepath.Base(bare)} {
		if !f.sandboxExists(id) {
			t.Errorf("%s was terminated", id)
		}
	}
}

// TestRacingReapers runs two reapers' passes at once over the same
// records: every workspace ends once, with one reason, and no slot leaks.
func TestRacingReapers(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var ws []sandgate.Workspace
	for range 8 {
		ws = append(ws, f.admit(5*time.Second, 0, true, true))
	}
	for range 4 {
		ws = append(ws, f.admit(time.Hour, 0, true, false))
	}
	f.clock.Advance(2 * time.Minute)
	a, b := f.reaper("a"), f.reaper("b")
	var wg sync.WaitGroup
	for _, r := range []*reaper.Reaper{a, b} {
		wg.Go(func() {
			for range 3 {
				if err := r.Pass(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	for _, w := range ws {
		if got := f.get(w.ID); got.State != sandgate.WorkspaceTerminated {
			t.Errorf("%s: %s", w.ID, got.State)
		}
	}
	sa, sb := a.Stats(), b.Stats()
	if n := sa.Expired.Load() + sb.Expired.Load(); n != 8 {
		t.Errorf("expired %d times, want 8", n)
	}
	if n := sa.Failed.Load() + sb.Failed.Load(); n != 4 {
		t.Errorf("failed %d times, want 4", n)
	}
	f.checkSlots(0)
}

// TestLeaderHandoff: one reaper leads at a time; when it stops, another
// takes over within seconds with a larger fencing token.
func TestLeaderHandoff(t *testing.T) {
	f := newFixture(t)
	a, b := f.reaper("a"), f.reaper("b")
	actx, stopA := context.WithCancel(context.Background())
	bctx, stopB := context.WithCancel(context.Background())
	defer stopB()
	var wg sync.WaitGroup
	wg.Go(func() { a.Run(actx) })
	sgtest.WaitFor(t, "a leads", func() bool { return a.Fence() > 0 })
	wg.Go(func() { b.Run(bctx) })
	time.Sleep(1500 * time.Millisecond)
	if b.Fence() != 0 {
		t.Fatal("two leaders at once")
	}
	first := a.Fence()
	stopA()
	start := time.Now()
	sgtest.WaitFor(t, "b leads", func() bool { return b.Fence() > 0 })
	// Within seconds: the lease's TTL (1 s) and a pass, with room for a
	// loaded machine; a takeover that waits for anything longer fails.
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("takeover took %s", d)
	}
	if b.Fence() <= first {
		t.Errorf("fence %d not above %d", b.Fence(), first)
	}
	stopB()
	wg.Wait()
}
