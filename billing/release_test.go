package billing_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/store"
)

// TestReleaseSettlesLikeTerminate: a release records its end and settles
// in one script (Billing.FinishAndSettle through Terminator.Release); it
// must charge exactly what the step-by-step path charges (Terminate, then
// Settle), entry for entry, with an accrued interim period before it, and
// free the whole hold.
func TestReleaseSettlesLikeTerminate(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const acct, inst = "acct_rel", "inst_rel"
	e.account(acct, 7, false)
	e.credit(acct, 1_000_000_000, "c1")
	a, err := e.acquire(acct, inst, "bot", 3*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.acquire(acct, inst, "bot", 3*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(90*time.Minute + 13*time.Second + 400*time.Millisecond)
	if n, err := e.bill.Accrue(ctx, acct, e.clock.Now()); err != nil || n != 2 {
		t.Fatalf("Accrue = %d, %v; want 2 interim entries, nil", n, err)
	}
	e.clock.Advance(time.Minute)
	e.release(a, sandgate.ReasonReleased)
	cur, err := e.term.Release(ctx, acct, inst, b.ID)
	if err != nil {
		t.Fatalf("Release: %v", err)
	}
	if cur.State != sandgate.WorkspaceTerminated || !cur.TerminatedAt.Equal(e.clock.Now().Truncate(time.Millisecond)) {
		t.Errorf("Release answered state %q, terminated_at %v; want terminated at %v", cur.State, cur.TerminatedAt, e.clock.Now())
	}
	if read, err := e.db.Workspace(ctx, acct, b.ID); err != nil || !reflect.DeepEqual(cur, read) {
		t.Errorf("Release answered\n%+v\nwant the record as read\n%+v (%v)", cur, read, err)
	}
	if again, err := e.term.Release(ctx, acct, inst, b.ID); err != nil || again.State != sandgate.WorkspaceTerminated {
		t.Errorf("second Release = %q, %v; want terminated, nil", again.State, err)
	}
	if _, err := e.term.Release(ctx, acct, "inst_other", a.ID); err == nil {
		t.Errorf("Release through another instance: nil error; want not found")
	}
	// Both ends left the instance's live index in the script that recorded
	// them (the walks of live workspaces read neither record again).
	if n, err := e.db.Redis().ZCard(ctx, store.AdmissionKeys(acct, inst, "", "").LiveIndex).Result(); err != nil || n != 0 {
		t.Errorf("live index holds %d entries, %v; want 0 once both ended", n, err)
	}

	amounts := map[string][]int64{}
	var total int64
	if err := e.bill.Ledger().Scan(ctx, acct, time.Time{}, e.clock.Now().Add(time.Hour), func(u billing.UsageEntry) error {
		amounts[u.WorkspaceID] = append(amounts[u.WorkspaceID], u.AmountMicros)
		total += u.AmountMicros
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ga, gb := amounts[a.ID], amounts[b.ID]
	if len(ga) != 2 || len(gb) != 2 || ga[0] != gb[0] || ga[1] != gb[1] {
		t.Fatalf("entries: terminate path %v, release path %v; want the same two amounts", ga, gb)
	}
	// 91 min 14 s metered (rounded up) at 7 micros per second, each.
	if want := int64(2 * (91*60 + 14) * 7); total != want {
		t.Errorf("charged %d micros in all; want %d", total, want)
	}
	bal := e.balance(acct)
	if bal.HoldsMicros != 0 || bal.BalanceMicros != 1_000_000_000-total || bal.SettledMicros != total {
		t.Errorf("balance %+v; want holds 0, settled %d, balance %d", bal, total, 1_000_000_000-total)
	}
	e.noDrift(acct)
}
