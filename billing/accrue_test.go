package billing_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/billing"
)

func (e *env) entries(acct string) []billing.UsageEntry {
	e.t.Helper()
	var out []billing.UsageEntry
	if err := e.bill.Ledger().Scan(context.Background(), acct, time.Time{}, time.Time{}, func(u billing.UsageEntry) error {
		out = append(out, u)
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) used(acct string, at time.Time) int64 {
	e.t.Helper()
	bs, err := e.bill.Budgets(context.Background(), acct, at)
	if err != nil || len(bs) != 1 {
		e.t.Fatalf("budgets: %v %v", bs, err)
	}
	return bs[0].UsedMicros
}

// A workspace running across midnight UTC at the end of March accrues
// hourly interim entries while it runs, split at the month boundary, once
// however often accrual runs; settlement adds the rest, and its entries
// add up to metered_seconds × price.
func TestAccrualSplitsAtMonthBoundary(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const acct, unit = "acct_acc", 10
	e.account(acct, unit, false)
	e.credit(acct, 10_000_000, "c")
	if err := e.bill.SetBudget(ctx, acct, billing.Budget{MonthlyMicros: 1_000_000_000, Soft: true}); err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 3, 31, 22, 30, 0, 500_000_000, time.UTC)
	e.clock.Advance(start.Sub(e.clock.Now()))
	w, err := e.acquire(acct, "inst_1", "", 4*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	hold := e.balance(acct).HoldsMicros
	if hold != unit*4*3600 {
		t.Fatalf("hold %d; want %d", hold, unit*4*3600)
	}

	// Within the grace of the 23:00 cut nothing is accrued yet.
	if n, err := e.bill.Accrue(ctx, acct, start.Add(30*time.Minute)); n != 0 || err != nil {
		t.Fatalf("Accrue before a period is complete = %d, %v; want 0", n, err)
	}
	e.clock.Advance(3 * time.Hour) // 01:30:00.5 on April 1st
	now := e.clock.Now()
	if n, err := e.bill.Accrue(ctx, acct, now); n != 3 || err != nil {
		t.Fatalf("Accrue = %d, %v; want 3 entries (22:30:00.5–23, 23–00, 00–01)", n, err)
	}
	if n, err := e.bill.Accrue(ctx, acct, now); n != 0 || err != nil {
		t.Fatalf("second Accrue = %d, %v; want 0", n, err)
	}
	es := e.entries(acct)
	h := func(s string) string {
		tm, _ := time.Parse(time.RFC3339, s)
		return billing.PeriodID(w.ID, tm)
	}
	wantIDs := []string{h("2026-03-31T22:00:00Z"), h("2026-03-31T23:00:00Z"), h("2026-04-01T00:00:00Z")}
	wantSecs := []int64{1800, 3600, 3600}
	if len(es) != 3 {
		t.Fatalf("ledger after accrual: %d entries; want 3", len(es))
	}
	for i, u := range es {
		if u.ID != wantIDs[i] || u.Seconds != wantSecs[i] || u.Final || u.AmountMicros != unit*wantSecs[i] {
			t.Errorf("interim entry %d = %s %d s %d final %v; want %s %d s, provisional", i, u.ID, u.Seconds, u.AmountMicros, u.Final, wantIDs[i], wantSecs[i])
		}
	}
	b := e.balance(acct)
	if b.SettledMicros != unit*9000 || b.HoldsMicros != hold-unit*9000 {
		t.Fatalf("after accrual: %+v; want settled %d, holds %d", b, unit*9000, hold-unit*9000)
	}
	// Budgets see interim usage, each period in its month.
	if got := e.used(acct, now); got != unit*3600 {
		t.Errorf("April budget use %d; want %d (00–01 accrued)", got, unit*3600)
	}
	if got := e.used(acct, start); got != unit*5400+(hold-unit*9000) {
		t.Errorf("March budget use %d; want %d (accrued plus the rest of the hold)", got, unit*5400+(hold-unit*9000))
	}
	e.noDrift(acct)

	e.clock.Advance(39*time.Minute + 59*time.Second + 800*time.Millisecond) // ends 02:09:60.3 = 02:10:00.3
	cur, err := e.db.Workspace(ctx, acct, w.ID)
	if err != nil {
		t.Fatal(err)
	}
	e.release(cur, sandgate.ReasonReleased)
	if n, err := e.bill.Accrue(ctx, acct, e.clock.Now().Add(time.Hour)); n != 0 || err != nil {
		t.Fatalf("Accrue after the end = %d, %v; want 0", n, err)
	}
	if err := e.bill.Settle(ctx, cur); err != nil { // a second settlement changes nothing
		t.Fatal(err)
	}
	fin, err := e.db.Workspace(ctx, acct, w.ID)
	if err != nil {
		t.Fatal(err)
	}
	metered, _ := billing.Metered(fin)
	if metered != 13200 {
		t.Fatalf("metered %d; want 13200", metered)
	}
	es = e.entries(acct)
	var secs, amt int64
	months := map[string]int64{}
	for i, u := range es {
		secs += u.Seconds
		amt += u.AmountMicros
		months[u.TerminatedAt.Format("200601")] += u.AmountMicros
		if final := i == len(es)-1; u.Final != final {
			t.Errorf("entry %s final %v; want %v", u.ID, u.Final, final)
		}
	}
	if len(es) != 5 || es[3].ID != h("2026-04-01T01:00:00Z") || es[4].ID != billing.FinalID(w.ID) {
		t.Fatalf("ledger: %d entries, want 5 ending in the 01:00 period and the final one", len(es))
	}
	if secs != metered || amt != metered*unit {
		t.Fatalf("entries add up to %d s, %d micros; want %d s, %d", secs, amt, metered, metered*unit)
	}
	if months["202603"] != unit*5400 || months["202604"] != unit*(13200-5400) {
		t.Errorf("by month %v; want March %d, April %d", months, unit*5400, unit*(13200-5400))
	}
	b = e.balance(acct)
	if b.SettledMicros != amt || b.HoldsMicros != 0 {
		t.Fatalf("after settlement: %+v; want settled %d, holds 0", b, amt)
	}
	if got := e.used(acct, start); got != unit*5400 {
		t.Errorf("March budget use after settlement %d; want %d", got, unit*5400)
	}
	if got := e.used(acct, e.clock.Now()); got != unit*(13200-5400) {
		t.Errorf("April budget use after settlement %d; want %d", got, unit*(13200-5400))
	}
	e.noDrift(acct)
}

// TestVanishedAfterAccrualChargesOnce: a sandbox the reaper found gone is
// ended at its listing, but never earlier than accrual's grace before
// now: an hour accrued after a slow listing is not charged again by the
// final entry, and the entries add up to the metered seconds.
func TestVanishedAfterAccrualChargesOnce(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const acct = "acct_v"
	w := e.runningFrom(acct, time.Date(2026, 3, 10, 10, 10, 0, 0, time.UTC))
	listed := time.Date(2026, 3, 10, 10, 59, 50, 0, time.UTC)
	e.clock.Set(listed.Add(75 * time.Second)) // 11:01:05: the walk was slow
	if n, err := e.bill.Accrue(ctx, acct, e.clock.Now()); err != nil || n != 1 {
		t.Fatalf("Accrue = %d, %v; want the 10:10-11:00 period", n, err)
	}
	if started, err := e.term.Vanished(ctx, w, listed); err != nil || !started {
		t.Fatalf("Vanished = %t, %v", started, err)
	}
	fin, err := e.db.Workspace(ctx, acct, w.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want := e.clock.Now().Add(-billing.AccrualGrace / 2); !fin.TerminatedAt.Equal(want) {
		t.Errorf("ended at %v; want %v, half accrual's grace before now", fin.TerminatedAt, want)
	}
	metered, _ := billing.Metered(fin)
	var secs, amount int64
	for _, u := range e.entries(acct) {
		secs, amount = secs+u.Seconds, amount+u.AmountMicros
	}
	if secs != metered || amount != 10*metered {
		t.Errorf("entries add up to %d s, %d micros; want the metered %d s, %d micros", secs, amount, metered, 10*metered)
	}
	e.noDrift(acct)
}

// TestVanishedEndsByItsDeadline: the floor that keeps a vanished
// workspace's end out of accrued periods never moves it past expires_at.
func TestVanishedEndsByItsDeadline(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const acct = "acct_vd"
	e.account(acct, 10, false)
	e.credit(acct, 100_000_000, "c")
	e.clock.Set(time.Date(2026, 3, 10, 10, 10, 0, 0, time.UTC))
	w, err := e.acquire(acct, "inst_1", "", 50*time.Minute) // expires 11:00
	if err != nil {
		t.Fatal(err)
	}
	listed := time.Date(2026, 3, 10, 10, 59, 50, 0, time.UTC)
	e.clock.Set(listed.Add(3 * time.Minute))
	if started, err := e.term.Vanished(ctx, w, listed); err != nil || !started {
		t.Fatalf("Vanished = %t, %v", started, err)
	}
	fin, err := e.db.Workspace(ctx, acct, w.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !fin.TerminatedAt.Equal(fin.ExpiresAt) {
		t.Errorf("ended at %v; want its expires_at %v", fin.TerminatedAt, fin.ExpiresAt)
	}
}
