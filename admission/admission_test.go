package admission_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/internal/tally"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/store"
)

// env is a store and the standard pipeline over one redis-server.
type env struct {
	db *store.DB
	p  *admission.Pipeline
}

func newEnv(t *testing.T, cfg store.Config) env {
	t.Helper()
	db := store.New(cfg, redistest.Start(t).Client())
	dc := db.Config()
	return env{db: db, p: admission.New(db.Redis(), admission.Standard(db, admission.StandardConfig{
		IdempotencyTTL: dc.IdempotencyTTL, PendingTimeout: dc.PendingTimeout,
		Risk: admission.RiskDefaults{AcquiresPerMinute: 100000, MaxOpenWorkspaces: 100000},
	})...)}
}

// admit admits w with limit max under Idempotency-Key key.
func (e env) admit(w sandgate.Workspace, max int, key string, now time.Time) error {
	scope := sandgate.Scope{Limits: sandgate.Limits{MaxConcurrentWorkspaces: max}.WithDefaults()}
	return e.p.Admit(context.Background(), &admission.Request{
		Workspace: w, Scope: scope, Keys: store.AdmissionKeys(w.AccountID, w.InstanceID, w.ID, key),
		KeyHash: key, RequestHash: "h", Now: now,
	})
}

// mustAdmit is admit, failing the test unless w is admitted.
func (e env) mustAdmit(t *testing.T, w sandgate.Workspace, max int, key string, now time.Time) {
	t.Helper()
	if err := e.admit(w, max, key, now); err != nil {
		t.Fatalf("Admit under key %q = %v; want admitted", key, err)
	}
}

func isConcurrency(err error) bool { return protocol.CodeOf(err) == protocol.ConcurrencyLimit }

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
	e := newEnv(t, store.Config{})
	db := e.db
	ctx := context.Background()
	now := time.Now().UTC()
	acct, inst := sandgate.NewID("acct_"), sandgate.NewID("inst_")
	admitted, full := tally.Run(t, 200, "Admit", func(i int) error {
		return e.admit(newWorkspace(acct, inst, now), 5, fmt.Sprint("k", i), now)
	}, isConcurrency)
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
	e := newEnv(t, store.Config{PendingTimeout: time.Minute})
	db := e.db
	ctx := context.Background()
	now := time.Now().UTC()
	acct, inst := sandgate.NewID("acct_"), sandgate.NewID("inst_")
	stuck := newWorkspace(acct, inst, now)
	e.mustAdmit(t, stuck, 1, "a", now)
	err := e.admit(newWorkspace(acct, inst, now), 1, "b", now.Add(59*time.Second))
	if !isConcurrency(err) {
		t.Fatalf("Admit inside the pending window = %v; want concurrency_limit", err)
	}
	later := now.Add(61 * time.Second)
	if err := e.admit(newWorkspace(acct, inst, later), 1, "c", later); err != nil {
		t.Fatalf("Admit after the pending deadline = %v; want admitted", err)
	}
	ok, err := db.Confirm(ctx, stuck, "ref", later, "a", "h")
	if err != nil || ok {
		t.Fatalf("late Confirm = %v, %v; want false, nil", ok, err)
	}
}

// TestTerminateFreesSlot: termination frees the slot at once and is idempotent.
func TestTerminateFreesSlot(t *testing.T) {
	e := newEnv(t, store.Config{})
	db := e.db
	ctx := context.Background()
	now := time.Now().UTC()
	acct, inst := sandgate.NewID("acct_"), sandgate.NewID("inst_")
	w := newWorkspace(acct, inst, now)
	e.mustAdmit(t, w, 1, "a", now)
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
	if err := db.FinishTerminate(ctx, w, now.Add(2*time.Second), store.Egress{}); err != nil {
		t.Fatal(err)
	}
	got, err := db.Workspace(ctx, acct, w.ID)
	if err != nil || got.State != sandgate.WorkspaceTerminated || got.TerminationReason != sandgate.ReasonReleased {
		t.Fatalf("Workspace = %+v, %v; want terminated/released", got, err)
	}
}

func TestListCursor(t *testing.T) {
	e := newEnv(t, store.Config{})
	db := e.db
	ctx := context.Background()
	now := time.Now().UTC()
	acct, inst := sandgate.NewID("acct_"), sandgate.NewID("inst_")
	want := map[string]bool{}
	for i := range 23 {
		w := newWorkspace(acct, inst, now.Add(time.Duration(i%4)*time.Millisecond)) // many share a score
		e.mustAdmit(t, w, 100, fmt.Sprint(i), now)
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

// traces counts what an instance's admissions left in Redis: claimed keys
// among keys, records, live slots.
func (e env) traces(t *testing.T, acct, inst string, keys []string, now time.Time) (claimed, records int, live int64) {
	t.Helper()
	ctx := context.Background()
	for _, k := range keys {
		if _, err := e.db.Idempotency(ctx, acct, inst, store.OpAcquire, k); err == nil {
			claimed++
		}
	}
	ws, _, err := e.db.ListWorkspaces(ctx, acct, inst, "", 100, false, now)
	if err != nil {
		t.Fatal(err)
	}
	live, err = e.db.LiveCount(ctx, acct, inst, now)
	if err != nil {
		t.Fatal(err)
	}
	return claimed, len(ws), live
}

func TestControls(t *testing.T) {
	e := newEnv(t, store.Config{})
	ctx := context.Background()
	now := time.Now().UTC()
	acct := sandgate.NewID("acct_")
	var inst, sibling string
	on := &store.Control{Reason: "operator", Actor: "test", Since: now.UnixMilli()}
	tests := []struct {
		name        string
		set         func() error
		clear       func() error
		want        protocol.Code
		wantReason  string
		siblingCode protocol.Code // what the sibling instance gets
	}{
		{"broker stop", func() error { return e.db.SetGlobalStop(ctx, on) }, func() error { return e.db.SetGlobalStop(ctx, nil) },
			protocol.EmergencyStopped, "operator", protocol.EmergencyStopped},
		{"account stop", func() error { return e.db.SetControl(ctx, acct, store.FieldStop, on) }, func() error { return e.db.SetControl(ctx, acct, store.FieldStop, nil) },
			protocol.EmergencyStopped, "operator", protocol.EmergencyStopped},
		{"account pause", func() error { return e.db.SetControl(ctx, acct, store.FieldPause, &store.Control{Reason: "payment"}) }, func() error { return e.db.SetControl(ctx, acct, store.FieldPause, nil) },
			protocol.Paused, "payment", protocol.Paused},
		{"instance pause", func() error {
			return e.db.SetControl(ctx, acct, store.InstancePauseField(inst), &store.Control{Reason: "instance_paused"})
		}, func() error { return e.db.SetControl(ctx, acct, store.InstancePauseField(inst), nil) },
			protocol.Paused, "instance_paused", ""},
		{"expired pause", func() error {
			return e.db.SetControl(ctx, acct, store.FieldPause, &store.Control{Reason: "payment", Until: now.Add(-time.Second).UnixMilli()})
		}, func() error { return e.db.SetControl(ctx, acct, store.FieldPause, nil) }, "", "", ""},
	}
	for i, tt := range tests {
		inst, sibling = sandgate.NewID("inst_"), sandgate.NewID("inst_")
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.set(); err != nil {
				t.Fatal(err)
			}
			cleared := false
			defer func() {
				if !cleared {
					tt.clear()
				}
			}()
			key := fmt.Sprint("key-", i)
			err := e.admit(newWorkspace(acct, inst, now), 10, key, now)
			if got := protocol.CodeOf(err); got != tt.want {
				t.Fatalf("Admit code = %q; want %q", got, tt.want)
			}
			if pe := (*protocol.Error)(nil); tt.want != "" && errors.As(err, &pe) && pe.Reason != tt.wantReason {
				t.Errorf("reason = %q; want %q", pe.Reason, tt.wantReason)
			}
			sib := newWorkspace(acct, sibling, now)
			if got := protocol.CodeOf(e.admit(sib, 10, key+"-sib", now)); got != tt.siblingCode {
				t.Errorf("sibling instance code = %q; want %q", got, tt.siblingCode)
			}
			if tt.want != "" {
				if c, r, l := e.traces(t, acct, inst, []string{key}, now); c+r+int(l) != 0 {
					t.Fatalf("refusal left claimed=%d records=%d live=%d; want nothing", c, r, l)
				}
			}
			cleared = true
			if err := tt.clear(); err != nil {
				t.Fatal(err)
			}
			// The same key is not consumed: it admits once the control clears.
			if tt.want == "" {
				return
			}
			if err := e.admit(newWorkspace(acct, inst, now), 10, key, now); err != nil {
				t.Fatalf("Admit after clearing = %v; want admitted", err)
			}
		})
	}
}

func TestRisk(t *testing.T) {
	e := newEnv(t, store.Config{})
	ctx := context.Background()
	now := time.Now().UTC()
	t.Run("request cap", func(t *testing.T) {
		acct, inst := sandgate.NewID("acct_"), sandgate.NewID("inst_")
		if err := e.db.SetRiskLimits(ctx, acct, store.RiskLimits{MaxSize: "standard"}); err != nil {
			t.Fatal(err)
		}
		big := newWorkspace(acct, inst, now)
		big.Size = "large"
		err := e.admit(big, 10, "big", now)
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code != protocol.RiskLimit || pe.Reason != "request_cap" {
			t.Fatalf("Admit(large) = %v; want risk_limit/request_cap", err)
		}
		if err := e.admit(newWorkspace(acct, inst, now), 10, "std", now); err != nil {
			t.Fatalf("Admit(standard) = %v", err)
		}
	})
	t.Run("velocity", func(t *testing.T) {
		acct, inst := sandgate.NewID("acct_"), sandgate.NewID("inst_")
		if err := e.db.SetRiskLimits(ctx, acct, store.RiskLimits{AcquiresPerMinute: 3}); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			e.mustAdmit(t, newWorkspace(acct, inst, now), 10, fmt.Sprint(i), now)
		}
		err := e.admit(newWorkspace(acct, inst, now), 10, "4th", now)
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code != protocol.RiskLimit || pe.Reason != "velocity" || pe.RetryAfter <= 0 {
			t.Fatalf("4th Admit in a minute = %v; want risk_limit/velocity with Retry-After", err)
		}
		if err := e.admit(newWorkspace(acct, inst, now), 10, "later", now.Add(61*time.Second)); err != nil {
			t.Fatalf("Admit a minute later = %v; want admitted", err)
		}
	})
	t.Run("open workspaces across instances", func(t *testing.T) {
		acct := sandgate.NewID("acct_")
		if err := e.db.SetRiskLimits(ctx, acct, store.RiskLimits{MaxOpenWorkspaces: 2}); err != nil {
			t.Fatal(err)
		}
		a, b := sandgate.NewID("inst_"), sandgate.NewID("inst_")
		w1 := newWorkspace(acct, a, now)
		e.mustAdmit(t, w1, 10, "1", now)
		e.mustAdmit(t, newWorkspace(acct, b, now), 10, "2", now)
		err := e.admit(newWorkspace(acct, b, now), 10, "3", now)
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Reason != "open_workspaces" {
			t.Fatalf("3rd open workspace = %v; want risk_limit/open_workspaces", err)
		}
		// Terminating one frees its place at once.
		if _, _, err := e.db.BeginTerminate(ctx, w1, sandgate.ReasonReleased, now); err != nil {
			t.Fatal(err)
		}
		if err := e.admit(newWorkspace(acct, b, now), 10, "3", now); err != nil {
			t.Fatalf("Admit after a release = %v; want admitted", err)
		}
	})
}

func TestReplay(t *testing.T) {
	e := newEnv(t, store.Config{})
	now := time.Now().UTC()
	acct, inst := sandgate.NewID("acct_"), sandgate.NewID("inst_")
	w := newWorkspace(acct, inst, now)
	e.mustAdmit(t, w, 1, "k", now)
	// Even at the concurrency limit, a claimed key answers its record.
	rec, ok := admission.IsReplay(e.admit(newWorkspace(acct, inst, now), 1, "k", now))
	if !ok || rec.WorkspaceID != w.ID || rec.State != store.IdemInProgress {
		t.Fatalf("replay = %+v, %v; want the first workspace, in progress", rec, ok)
	}
}

// TestAdmissionUnavailable: when Redis cannot be reached, Admit fails closed.
func TestAdmissionUnavailable(t *testing.T) {
	srv := redistest.Start(t)
	db := store.New(store.Config{}, srv.Client())
	p := admission.New(db.Redis(), admission.Standard(db, admission.StandardConfig{})...)
	srv.Kill()
	now := time.Now().UTC()
	w := newWorkspace(sandgate.NewID("acct_"), sandgate.NewID("inst_"), now)
	err := p.Admit(context.Background(), &admission.Request{Workspace: w, Scope: sandgate.Scope{Limits: sandgate.DefaultLimits},
		Keys: store.AdmissionKeys(w.AccountID, w.InstanceID, w.ID, "k"), KeyHash: "k", Now: now})
	if got := protocol.CodeOf(err); got != protocol.AdmissionUnavailable {
		t.Fatalf("Admit with Redis down = %q; want admission_unavailable", got)
	}
}
