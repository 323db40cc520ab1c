package saga_test

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/broker"
	"github.com/sandgate/sandgate/internal/fakeprovider"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/reaper"
	"github.com/sandgate/sandgate/saga"
	"github.com/sandgate/sandgate/store"
)

// env is a saga over three fake providers: "one" (the default) and "two"
// take new work, "closed" does not; one prepaid account.
type env struct {
	rdb      *redis.Client
	db       *store.DB
	bill     *billing.Billing
	saga     *saga.Saga
	one, two *fakeprovider.Provider
	closed   *fakeprovider.Provider
	acct     string
	clock    *sgtest.Clock
}

func newEnv(t *testing.T) *env {
	t.Helper()
	rdb := redistest.Start(t).Client()
	db := store.New(store.Config{}, rdb)
	e := &env{rdb: rdb, db: db, one: fakeprovider.New(), two: fakeprovider.New(), closed: fakeprovider.New(),
		clock: sgtest.NewClock(time.Now().UTC().Truncate(time.Second))}
	set, err := providers.NewSet("one",
		providers.Entry{Name: "one", Kind: "fake", Provider: e.one, AcceptNew: true},
		providers.Entry{Name: "two", Kind: "fake", Provider: e.two, AcceptNew: true},
		providers.Entry{Name: "closed", Kind: "fake", Provider: e.closed})
	if err != nil {
		t.Fatal(err)
	}
	w := sgtest.Broker(t, sgtest.Config(t), broker.Options{Redis: rdb, Providers: set, Clock: e.clock})
	e.bill, e.saga = w.Billing(), w.Saga()
	ctx := context.Background()
	e.acct = sandgate.NewID(sandgate.PrefixAccount)
	if err := db.CreateAccount(ctx, sandgate.Account{ID: e.acct, Name: "saga", CreatedAt: e.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.bill.CreateRateCard(ctx, "rc-"+e.acct, "USD", map[string]int64{"small": 10, "standard": 20, "large": 40, "xlarge": 80}, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if err := e.bill.SetSettings(ctx, billing.Settings{AccountID: e.acct, RateCard: "rc-" + e.acct, Currency: "USD"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.bill.Adjust(ctx, e.acct, billing.FundsEntry{Key: "open", Kind: billing.KindCredit, AmountMicros: 100_000_000,
		Reason: "test", Actor: "test", At: e.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	return e
}

// newEnvInstance is newEnv with one instance on the default provider, the
// set-up of most tests.
func newEnvInstance(t *testing.T) (*env, sandgate.Instance) {
	t.Helper()
	e := newEnv(t)
	return e, e.instance(t, "")
}

// instance stores an instance on provider ("" for the default).
func (e *env) instance(t *testing.T, provider string) sandgate.Instance {
	t.Helper()
	in := sandgate.Instance{ID: sandgate.NewID(sandgate.PrefixInstance), AccountID: e.acct, Name: "saga", Provider: provider,
		Scope: sandgate.Scope{DefaultImage: "img", Limits: sandgate.Limits{MaxConcurrentWorkspaces: 5}}, CreatedAt: e.clock.Now()}
	if err := e.db.PutInstance(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	return in
}

func req() protocol.AcquireRequest {
	return protocol.AcquireRequest{Label: "saga", Size: "small", Egress: &protocol.Egress{AllowedDomains: []string{}}}
}

// wantNewWorkspace acquires with key on s and fails the test unless the
// answer is a new running workspace, not a replay; it returns it.
func wantNewWorkspace(t *testing.T, s *saga.Saga, in sandgate.Instance, key, what string) sandgate.Workspace {
	t.Helper()
	res, err := s.Acquire(context.Background(), in, key, req())
	if err != nil || res.Replayed || res.Workspace.State != sandgate.WorkspaceRunning {
		t.Fatalf("%s = %+v, %v; want a new running workspace", what, res, err)
	}
	return res.Workspace
}

func wantCode(t *testing.T, what string, err error, code protocol.Code) {
	t.Helper()
	if got := protocol.CodeOf(err); got != code {
		t.Fatalf("%s: code %q (%v); want %q", what, got, err, code)
	}
}

func (e *env) holds(t *testing.T) int64 {
	t.Helper()
	b, err := e.bill.Balance(context.Background(), e.acct)
	if err != nil {
		t.Fatal(err)
	}
	return b.HoldsMicros
}

func (e *env) live(t *testing.T, in sandgate.Instance) int64 {
	t.Helper()
	n, err := e.db.LiveCount(context.Background(), e.acct, in.ID, e.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// wantNothingHeld checks that in has no live slot and the account no hold;
// when names the moment in failures.
func (e *env) wantNothingHeld(t *testing.T, in sandgate.Instance, when string) {
	t.Helper()
	if n, h := e.live(t, in), e.holds(t); n != 0 || h != 0 {
		t.Errorf("%s: %d live, %d µ held; want 0, 0", when, n, h)
	}
}

// wantRetryAdmitted retries a failed acquire with its key and checks that
// it makes a new workspace, whose slot is the only one of in.
func (e *env) wantRetryAdmitted(t *testing.T, in sandgate.Instance, key string) {
	t.Helper()
	wantNewWorkspace(t, e.saga, in, key, "retry with the same key")
	if n := e.live(t, in); n != 1 {
		t.Errorf("live slots after the retry = %d; want 1 (the retry's; the failed one's freed)", n)
	}
}

// TestAcquireRoutesToTheInstanceProvider: each workspace lands on its
// instance's provider and its record names it.
func TestAcquireRoutesToTheInstanceProvider(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, tt := range []struct {
		provider, want string
		fake           *fakeprovider.Provider
	}{{"", "one", e.one}, {"two", "two", e.two}} {
		in := e.instance(t, tt.provider)
		res, err := e.saga.Acquire(ctx, in, "k", req())
		if err != nil {
			t.Fatalf("Acquire on %q: %v", tt.provider, err)
		}
		if res.Replayed || res.Workspace.Provider != tt.want || res.Workspace.State != sandgate.WorkspaceRunning {
			t.Errorf("Acquire on %q = %+v; want a new running workspace on %s", tt.provider, res, tt.want)
		}
		if _, err := providers.ReadFileBytes(ctx, tt.fake, providers.Sandbox{Ref: res.Workspace.ProviderRef}, "/none", 1); !errors.Is(err, providers.ErrFileNotFound) {
			t.Errorf("sandbox %s not at provider %s: %v", res.Workspace.ProviderRef, tt.want, err)
		}
		again, err := e.saga.Acquire(ctx, in, "k", req())
		if err != nil || !again.Replayed || again.Workspace.ID != res.Workspace.ID {
			t.Errorf("replay = %+v, %v; want the same workspace, replayed", again, err)
		}
	}
}

// TestAcquireCompensates: a failed create leaves no record, no hold and
// no consumed key; a provider closed to new work refuses before anything
// is reserved.
func TestAcquireCompensates(t *testing.T) {
	e, in := newEnvInstance(t)
	ctx := context.Background()
	e.one.Set(func(p *fakeprovider.Provider) {
		p.CreateHook = func(context.Context, providers.CreateSpec) error { return errors.New("vendor down") }
	})
	_, err := e.saga.Acquire(ctx, in, "k1", req())
	wantCode(t, "acquire while the vendor fails", err, protocol.UpstreamError)
	e.wantNothingHeld(t, in, "after a failed create")
	e.one.Set(func(p *fakeprovider.Provider) { p.CreateHook = nil })
	res, err := e.saga.Acquire(ctx, in, "k1", req())
	if err != nil || res.Replayed {
		t.Fatalf("retry with the same key = %+v, %v; want a new workspace", res, err)
	}
	if h := e.holds(t); h != res.Workspace.Price.HoldMicros || h == 0 {
		t.Errorf("holds %d µ; want the new workspace's %d", h, res.Workspace.Price.HoldMicros)
	}

	closed := e.instance(t, "closed")
	_, err = e.saga.Acquire(ctx, closed, "k2", req())
	wantCode(t, "acquire on a closed provider", err, protocol.Paused)
	var pe *protocol.Error
	if errors.As(err, &pe); pe.Reason != saga.ReasonProviderClosed {
		t.Errorf("reason %q; want %q", pe.Reason, saga.ReasonProviderClosed)
	}
	gone := e.instance(t, "removed")
	_, err = e.saga.Acquire(ctx, gone, "k3", req())
	wantCode(t, "acquire on a provider no longer configured", err, protocol.Paused)
	if n := e.live(t, closed) + e.live(t, gone); n != 0 {
		t.Errorf("%d live workspaces on closed providers; want 0", n)
	}
}

// TestWarmStartOnlyOnTheSnapshotsProvider: a snapshot restores only on the
// provider that holds it; once the instance moved, a warm start answers
// 410 snapshot_gone and the client starts cold.
func TestWarmStartOnlyOnTheSnapshotsProvider(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	in := e.instance(t, "one")
	res, err := e.saga.Acquire(ctx, in, "k1", req())
	if err != nil {
		t.Fatal(err)
	}
	snap, _, err := e.saga.CreateSnapshot(ctx, in, res.Workspace, "s1", protocol.SnapshotRequest{Dir: "/workspace"})
	if err != nil {
		t.Fatalf("CreateSnapshot: %v", err)
	}
	if snap.Provider != "one" {
		t.Errorf("snapshot provider %q; want one", snap.Provider)
	}
	warm := req()
	warm.SnapshotID = snap.ID
	if _, err := e.saga.Acquire(ctx, in, "k2", warm); err != nil {
		t.Fatalf("warm start on the same provider: %v", err)
	}
	in.Provider = "two"
	if err := e.db.PutInstance(ctx, in); err != nil {
		t.Fatal(err)
	}
	_, err = e.saga.Acquire(ctx, in, "k3", warm)
	wantCode(t, "warm start on another provider", err, protocol.SnapshotGone)
	// Refused before admission: nothing was created on two, nothing held for it.
	if n := e.two.Creates(); n != 0 {
		t.Errorf("provider two created %d sandboxes for the refused warm start; want 0", n)
	}
	cold, err := e.saga.Acquire(ctx, in, "k4", req())
	if err != nil || cold.Workspace.Provider != "two" {
		t.Fatalf("cold start after the move = %+v, %v; want a workspace on two", cold, err)
	}
	// The snapshot is still deleted where it lives.
	if err := e.saga.DeleteSnapshot(ctx, in, snap.ID); err != nil {
		t.Fatalf("DeleteSnapshot: %v", err)
	}
	if err := e.one.Restore(ctx, providers.Sandbox{Ref: res.Workspace.ProviderRef}, providers.SnapshotRef{ID: snap.ID}, "/workspace"); !errors.Is(err, providers.ErrSnapshotGone) {
		t.Errorf("contents at provider one after delete: %v; want ErrSnapshotGone", err)
	}
}

// TestAcquireConfirmFails: when the confirm after the provider's create
// fails (Redis unreachable, or the replicas did not acknowledge it), the
// sandbox is ended, the answer is admission_unavailable, and the key is
// freed: a retry with the same key re-evaluates and gets a workspace.
func TestAcquireConfirmFails(t *testing.T) {
	e, in := newEnvInstance(t)
	e.acquireStepsAfterCreate(t, in, "k-confirm", "acquire whose confirm failed", failScript) // the confirm
	e.wantRetryAdmitted(t, in, "k-confirm")
}

// TestAcquireCompensatesBesideRepair: another broker's billing repair
// (SettleDangling) runs after every script of a create that fails. The
// hold goes back with the budgets' held counters, so the month's budget
// counts nothing for a workspace that never ran. Before, the record was
// removed first, and the repair freed the hold without its counters.
func TestAcquireCompensatesBesideRepair(t *testing.T) {
	e, in := newEnvInstance(t)
	ctx := context.Background()
	if err := e.bill.SetBudget(ctx, e.acct, billing.Budget{MonthlyMicros: 10_000_000}); err != nil {
		t.Fatal(err)
	}
	e.rdb.AddHook(repairHook(e.bill, e.acct))
	e.one.Set(func(p *fakeprovider.Provider) {
		p.CreateHook = func(context.Context, providers.CreateSpec) error { return errors.New("vendor down") }
	})
	_, err := e.saga.Acquire(ctx, in, "k1", req())
	wantCode(t, "acquire while the vendor fails", err, protocol.UpstreamError)
	bs, err := e.bill.Budgets(ctx, e.acct, e.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 1 || bs[0].UsedMicros != 0 {
		t.Errorf("budgets after a failed create = %+v; want the account's, 0 used", bs)
	}
	if h := e.holds(t); h != 0 {
		t.Errorf("holds after a failed create = %d µ; want 0", h)
	}
}

// repairHook runs billing's repair of dangling holds after every script
// call, as another broker's pass could land between any two steps.
func repairHook(bill *billing.Billing, acct string) redistest.ScriptHook {
	var busy atomic.Bool // the repair's own scripts do not repair again
	return func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		err := next(ctx, cmd)
		if busy.CompareAndSwap(false, true) {
			_, _ = bill.SettleDangling(ctx, acct)
			busy.Store(false)
		}
		return err
	}
}

// failScript fails a script call without sending it, as an unreachable
// Redis would.
func failScript(_ context.Context, cmd redis.Cmder, _ redis.ProcessHook) error {
	err := errors.New("injected: redis unreachable")
	cmd.SetErr(err)
	return err
}

// loseAnswer runs a script call in Redis and then fails it as if its
// answer had been lost.
func loseAnswer(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
	if err := next(ctx, cmd); err != nil {
		return err // NOSCRIPT: the EVAL that follows runs it
	}
	err := errors.New("injected: the answer was lost")
	cmd.SetErr(err)
	return err
}

// stepHook hands the script calls that follow its arming to its steps,
// one call each, in order, and then lets every call through. A call
// answered NOSCRIPT stays with its step for the EVAL that follows.
type stepHook struct {
	steps []redistest.ScriptHook
	at    atomic.Int32 // 0 unarmed, 1..len(steps) the next step, len(steps)+1 done
}

// addSteps adds a stepHook of steps to e's Redis client.
func (e *env) addSteps(steps ...redistest.ScriptHook) *stepHook {
	h := &stepHook{steps: steps}
	e.rdb.AddHook(redistest.ScriptHook(h.process))
	return h
}

// arm starts the steps with the next script call; only the first arming
// counts.
func (h *stepHook) arm() { h.at.CompareAndSwap(0, 1) }

// used reports whether every step ran.
func (h *stepHook) used() bool { return int(h.at.Load()) > len(h.steps) }

func (h *stepHook) process(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
	i := int(h.at.Load())
	if i == 0 || i > len(h.steps) {
		return next(ctx, cmd)
	}
	err := h.steps[i-1](ctx, cmd, next)
	if !redis.HasErrorPrefix(err, "NOSCRIPT") {
		h.at.CompareAndSwap(int32(i), int32(i+1))
	}
	return err
}

// acquireStepsAfterCreate acquires under key with the script calls that
// follow the provider's create handed to steps, and fails the test unless
// the acquire answers Unavailable and every step ran. what names the
// acquire in failures. The create runs unhooked again afterwards.
func (e *env) acquireStepsAfterCreate(t *testing.T, in sandgate.Instance, key, what string, steps ...redistest.ScriptHook) {
	t.Helper()
	h := e.addSteps(steps...)
	e.one.Set(func(p *fakeprovider.Provider) {
		p.CreateHook = func(context.Context, providers.CreateSpec) error {
			h.arm()
			return nil
		}
	})
	_, err := e.saga.Acquire(context.Background(), in, key, req())
	wantCode(t, what, err, protocol.Unavailable)
	if !h.used() {
		t.Fatalf("%s: the steps after the create did not all run", what)
	}
	e.one.Set(func(p *fakeprovider.Provider) { p.CreateHook = nil })
}

// acquireDying runs an acquire under key on w in a goroutine of its own,
// which w's gateway may end by dying there (runtime.Goexit), and waits
// for that goroutine to end.
func acquireDying(w *broker.Broker, in sandgate.Instance, key string) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = w.Saga().Acquire(context.Background(), in, key, req())
	}()
	<-done
}

// wireAfterCreate wires another saga over provider "one" alone that
// calls afterCreate between each provider create and its confirm.
func (e *env) wireAfterCreate(t *testing.T, afterCreate func(string)) (*providers.Set, *broker.Broker) {
	t.Helper()
	set, err := providers.NewSet("one", providers.Entry{Name: "one", Kind: "fake", Provider: e.one, AcceptNew: true})
	if err != nil {
		t.Fatal(err)
	}
	return set, sgtest.Broker(t, sgtest.Config(t), broker.Options{Redis: e.rdb, Providers: set, Clock: e.clock, AfterCreate: afterCreate})
}

// TestLateConfirmLeavesReclaimedKey: a gateway stalls between the create
// and its confirm; the reaper fails the create at its pending deadline
// and frees the key, and the client's retry claims it for a workspace of
// its own. The stalled confirm, when it runs, refuses and leaves the key
// to the retry's workspace: replays answer the one running.
func TestLateConfirmLeavesReclaimedKey(t *testing.T) {
	e, in := newEnvInstance(t)
	ctx := context.Background()
	stall := make(chan struct{})
	var creates atomic.Int32
	set, w := e.wireAfterCreate(t, func(string) {
		if creates.Add(1) == 1 {
			<-stall
		}
	})
	stalled := make(chan error, 1)
	go func() {
		_, err := w.Saga().Acquire(ctx, in, "k", req())
		stalled <- err
	}()
	sgtest.WaitFor(t, "the first create", func() bool { return e.one.Creates() == 1 })
	e.clock.Advance(e.db.Config().PendingTimeout + 2*time.Second)
	if err := reaper.New(reaper.Config{}, reaper.Deps{DB: e.db, Providers: set, Terminator: w.Terminator(), Clock: e.clock}).Pass(ctx); err != nil {
		t.Fatal(err)
	}
	retry := wantNewWorkspace(t, w.Saga(), in, "k", "retry after the reaper failed the create")
	close(stall)
	<-stalled
	replay, err := w.Saga().Acquire(ctx, in, "k", req())
	if err != nil || !replay.Replayed || replay.Workspace.ID != retry.ID || replay.Workspace.State != sandgate.WorkspaceRunning {
		t.Errorf("replay after the stalled confirm = %s %s replayed %v, %v; want the retry's %s, running",
			replay.Workspace.ID, replay.Workspace.State, replay.Replayed, err, retry.ID)
	}
}

// TestAdmissionAnswerLost: the admission script runs in Redis but its
// answer never arrives (both of go-redis's tries lost, or the replicas
// did not acknowledge it). The Acquire answers 503 admission_unavailable
// and undoes what the script wrote, so the slot and the hold are free and
// a retry with the same key is admitted at once, not refused with 409
// idempotency_in_progress until the pending deadline.
func TestAdmissionAnswerLost(t *testing.T) {
	e, in := newEnvInstance(t)
	ctx := context.Background()
	e.addSteps(loseAnswer).arm()
	_, err := e.saga.Acquire(ctx, in, "k", req())
	wantCode(t, "acquire whose admission answer was lost", err, protocol.AdmissionUnavailable)
	e.wantNothingHeld(t, in, "after the lost answer")
	if got := e.one.Creates(); got != 0 {
		t.Errorf("provider creates after the lost answer = %d; want 0", got)
	}
	e.wantRetryAdmitted(t, in, "k")
}

// TestStartingReleasedFreesKey: a gateway dies between the provider
// create and the confirm, and the client releases the workspace it sees
// starting (Formation's reaper does so with one it does not know). The
// workspace ends, and its key, whose create was never confirmed, is freed:
// a retry with it is evaluated again, where before it met 409
// idempotency_in_progress until the key's TTL (7 days).
func TestStartingReleasedFreesKey(t *testing.T) {
	e, in := newEnvInstance(t)
	ctx := context.Background()
	var dying atomic.Bool
	dying.Store(true)
	_, w := e.wireAfterCreate(t, func(string) {
		if dying.CompareAndSwap(true, false) {
			runtime.Goexit() // the gateway dies here
		}
	})
	acquireDying(w, in, "k")
	live, err := e.db.LiveWorkspaces(ctx, e.acct, in.ID, e.clock.Now())
	if err != nil || len(live) != 1 || live[0].State != sandgate.WorkspaceStarting {
		t.Fatalf("live workspaces after the gateway died = %+v, %v; want one starting", live, err)
	}
	if _, err := w.Terminator().Release(ctx, e.acct, in.ID, live[0].ID); err != nil {
		t.Fatalf("release of the starting workspace: %v", err)
	}
	if got := wantNewWorkspace(t, w.Saga(), in, "k", "retry with the key"); got.ID == live[0].ID {
		t.Fatalf("retry with the key answered the released workspace %s; want a new one", got.ID)
	}
}

// TestConfirmLostEndUnrecorded: the confirm runs in Redis but its answer
// is lost, and the store then refuses the end the Acquire tries to
// record. The Acquire answers 503 and leaves the sandbox running, as the
// record (running) says it is: its key replays a workspace that works,
// and the workspace is ended and billed like any other. Before, the
// sandbox was ended under a running record that went on being billed,
// and the key was freed, so a retry got a second workspace.
func TestConfirmLostEndUnrecorded(t *testing.T) {
	e, in := newEnvInstance(t)
	ctx := context.Background()
	e.acquireStepsAfterCreate(t, in, "k", "acquire whose confirm's answer was lost and whose end failed",
		loseAnswer, failScript) // the confirm, then the end's record
	live, err := e.db.LiveWorkspaces(ctx, e.acct, in.ID, e.clock.Now())
	if err != nil || len(live) != 1 || live[0].State != sandgate.WorkspaceRunning {
		t.Fatalf("live workspaces = %+v, %v; want the confirmed one, running", live, err)
	}
	if n := e.one.Live(); n != 1 {
		t.Errorf("sandboxes at the provider = %d; want 1, the running record's", n)
	}
	res, err := e.saga.Acquire(ctx, in, "k", req())
	if err != nil || !res.Replayed || res.Workspace.ID != live[0].ID || res.Workspace.State != sandgate.WorkspaceRunning {
		t.Fatalf("retry with the key = %s %s replayed %v, %v; want %s replayed, running",
			res.Workspace.ID, res.Workspace.State, res.Replayed, err, live[0].ID)
	}
	if _, err := e.one.Exec(ctx, providers.Sandbox{Ref: res.Workspace.ProviderRef}, providers.ExecSpec{Argv: []string{"echo", "hi"}}); err != nil {
		t.Errorf("exec in the replayed workspace's sandbox: %v", err)
	}
}

// TestEndRetriedOnTheSandbox: a create whose workspace was released while
// it ran is ended by its Acquire, but the provider fails that terminate;
// the record stays terminating and names the sandbox, so the reaper's
// next pass ends that sandbox before it records the end. Before, the
// record named no sandbox, and the reaper recorded an end without asking
// the provider while the sandbox ran on, unbilled.
func TestEndRetriedOnTheSandbox(t *testing.T) {
	e, in := newEnvInstance(t)
	ctx := context.Background()
	var w *broker.Broker
	set, w := e.wireAfterCreate(t, func(id string) {
		if _, err := w.Terminator().Release(ctx, e.acct, in.ID, id); err != nil {
			t.Errorf("release while starting: %v", err)
		}
	})
	e.one.Set(func(p *fakeprovider.Provider) { p.TerminateErr = fakeprovider.ErrInjected })
	res, err := w.Saga().Acquire(ctx, in, "k", req())
	if err != nil || res.Workspace.State != sandgate.WorkspaceTerminating {
		t.Fatalf("acquire released while starting, its end failing = %s, %v; want terminating", res.Workspace.State, err)
	}
	if n := e.one.Live(); n != 1 {
		t.Fatalf("sandboxes after the failed terminate = %d; want 1", n)
	}
	e.one.Set(func(p *fakeprovider.Provider) { p.TerminateErr = nil })
	e.reapOnce(t, set, w)
	e.wantEnded(t, res.Workspace.ID)
}

// TestFailedCreateRetriedOnTheSandbox: a gateway dies between the create
// and its confirm; the reaper fails the create at its pending deadline
// but the provider fails the terminate. The record keeps the sandbox the
// provider listed, so the next pass ends it before recording the end.
func TestFailedCreateRetriedOnTheSandbox(t *testing.T) {
	e, in := newEnvInstance(t)
	ctx := context.Background()
	set, w := e.wireAfterCreate(t, func(string) { runtime.Goexit() }) // the gateway dies here
	acquireDying(w, in, "k")
	live, err := e.db.LiveWorkspaces(ctx, e.acct, in.ID, e.clock.Now())
	if err != nil || len(live) != 1 {
		t.Fatalf("live workspaces after the gateway died = %+v, %v; want one", live, err)
	}
	e.one.Set(func(p *fakeprovider.Provider) { p.TerminateErr = fakeprovider.ErrInjected })
	e.clock.Advance(e.db.Config().PendingTimeout + 2*time.Second)
	e.reapOnce(t, set, w)
	if got, err := e.db.Workspace(ctx, e.acct, live[0].ID); err != nil || got.State != sandgate.WorkspaceTerminating || e.one.Live() != 1 {
		t.Fatalf("after a pass whose terminate failed: %s, %v, %d sandboxes; want terminating, 1", got.State, err, e.one.Live())
	}
	e.one.Set(func(p *fakeprovider.Provider) { p.TerminateErr = nil })
	e.reapOnce(t, set, w)
	e.wantEnded(t, live[0].ID)
}

// reapOnce runs one reaper pass over set.
func (e *env) reapOnce(t *testing.T, set *providers.Set, w *broker.Broker) {
	t.Helper()
	if err := reaper.New(reaper.Config{}, reaper.Deps{DB: e.db, Providers: set, Terminator: w.Terminator(), Clock: e.clock}).Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// wantEnded checks that workspace id is terminated and its sandbox gone.
func (e *env) wantEnded(t *testing.T, id string) {
	t.Helper()
	got, err := e.db.Workspace(context.Background(), e.acct, id)
	if err != nil || got.State != sandgate.WorkspaceTerminated {
		t.Errorf("workspace %s = %s, %v; want terminated", id, got.State, err)
	}
	if n := e.one.Live(); n != 0 {
		t.Errorf("sandboxes at the provider = %d; want 0: the end was recorded with the sandbox still running", n)
	}
}

// TestEndAnswerLostFreesKey: the confirm never reaches Redis, and the
// end the Acquire then records runs but its answer is lost. The Acquire
// answers 503 and leaves the sandbox; the reaper's next pass ends it and
// frees the key, still in progress, so a retry is evaluated again. Before,
// nothing freed the key of a record already terminating: every retry met
// 409 idempotency_in_progress for the key's TTL.
func TestEndAnswerLostFreesKey(t *testing.T) {
	e, in := newEnvInstance(t)
	ctx := context.Background()
	steps := e.addSteps(failScript, loseAnswer) // the confirm, then the end's record
	set, w := e.wireAfterCreate(t, func(string) { steps.arm() })
	_, err := w.Saga().Acquire(ctx, in, "k", req())
	wantCode(t, "acquire whose confirm failed and whose end's answer was lost", err, protocol.Unavailable)
	e.reapOnce(t, set, w)
	wantNewWorkspace(t, w.Saga(), in, "k", "retry after the reaper's pass")
	if n := e.one.Live(); n != 1 {
		t.Errorf("sandboxes = %d; want 1, the retry's (the first ended by the reaper)", n)
	}
}

// TestTerminateReadBeforeConfirm: an operator's stop reads a workspace
// while it is starting, and ends it after its create was confirmed. The
// end is asked of the sandbox the record names by then, not of the
// caller's copy, which names none; before, the end was recorded without
// asking the provider, and the sandbox ran on until an orphan pass.
func TestTerminateReadBeforeConfirm(t *testing.T) {
	e, in := newEnvInstance(t)
	ctx := context.Background()
	var early sandgate.Workspace
	_, w := e.wireAfterCreate(t, func(id string) {
		var err error
		if early, err = e.db.Workspace(ctx, e.acct, id); err != nil {
			t.Errorf("read while starting: %v", err)
		}
	})
	res, err := w.Saga().Acquire(ctx, in, "k", req())
	if err != nil || early.State != sandgate.WorkspaceStarting || early.ProviderRef != "" {
		t.Fatalf("acquire = %v, the copy read while starting: %s %q; want it starting, naming no sandbox", err, early.State, early.ProviderRef)
	}
	if ok, err := w.Terminator().Terminate(ctx, early, sandgate.ReasonEmergencyStopped); !ok || err != nil {
		t.Fatalf("terminate = %v, %v; want the end confirmed", ok, err)
	}
	e.wantEnded(t, res.Workspace.ID)
}

// TestEndWaitsForTheCreate: a workspace released while its create runs
// is met, before the create returns, by a reaper pass and by a second
// release. Neither records the end: no sandbox is named yet, and its
// Acquire ends the one it gets. When the provider then fails that
// terminate, the record stays terminating, naming the sandbox, and the
// next pass ends both. Before, the pass or the release recorded
// terminated at once, and the sandbox ran on until an orphan pass.
func TestEndWaitsForTheCreate(t *testing.T) {
	e, in := newEnvInstance(t)
	ctx := context.Background()
	var w *broker.Broker
	var set *providers.Set
	set, w = e.wireAfterCreate(t, func(id string) {
		for range 2 {
			if _, err := w.Terminator().Release(ctx, e.acct, in.ID, id); err != nil {
				t.Errorf("release while starting: %v", err)
			}
		}
		e.reapOnce(t, set, w)
		if got, err := e.db.Workspace(ctx, e.acct, id); err != nil || got.State != sandgate.WorkspaceTerminating {
			t.Errorf("workspace released while its create runs = %s, %v; want terminating", got.State, err)
		}
		e.one.Set(func(p *fakeprovider.Provider) { p.TerminateErr = fakeprovider.ErrInjected })
	})
	res, err := w.Saga().Acquire(ctx, in, "k", req())
	if err != nil || res.Workspace.State != sandgate.WorkspaceTerminating || e.one.Live() != 1 {
		t.Fatalf("acquire released while starting, its terminate failing = %s, %v, %d sandboxes; want terminating, 1", res.Workspace.State, err, e.one.Live())
	}
	e.one.Set(func(p *fakeprovider.Provider) { p.TerminateErr = nil })
	e.reapOnce(t, set, w)
	e.wantEnded(t, res.Workspace.ID)
}
