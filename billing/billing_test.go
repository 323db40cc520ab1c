package billing_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
)

// env is billing over a private Redis with the standard admission pipeline
// and a terminator that settles, as the gateway wires them.
type env struct {
	t     *testing.T
	db    *store.DB
	bill  *billing.Billing
	pipe  *admission.Pipeline
	term  *termination.Terminator
	clock *sgtest.Clock
}

func newEnv(t *testing.T) *env {
	t.Helper()
	db := store.New(store.Config{}, redistest.Start(t).Client())
	clock := sgtest.NewClock(time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC))
	b := billing.New(billing.Config{}, billing.Deps{DB: db, Clock: clock})
	pipe := admission.New(db.Redis(), admission.Standard(db, admission.StandardConfig{
		IdempotencyTTL: time.Hour, PendingTimeout: 2 * time.Minute,
		Risk:    admission.RiskDefaults{AcquiresPerMinute: 100000, MaxOpenWorkspaces: 100000},
		Billing: b.Checks(),
	})...)
	term := termination.New(termination.Config{}, termination.Deps{DB: db, Clock: clock, Settler: b})
	return &env{t: t, db: db, bill: b, pipe: pipe, term: term, clock: clock}
}

// account creates a prepaid account on a card pricing "small" at unit
// micros per second.
func (e *env) account(id string, unit int64, postpaid bool) {
	e.t.Helper()
	ctx := context.Background()
	card := "card-" + id
	prices := map[string]int64{}
	for _, s := range sandgate.StandardSizes {
		prices[s.Name] = unit
	}
	if _, err := e.bill.CreateRateCard(ctx, card, "USD", prices, e.clock.Now()); err != nil {
		e.t.Fatal(err)
	}
	if err := e.bill.SetSettings(ctx, billing.Settings{AccountID: id, RateCard: card, Currency: "USD", Postpaid: postpaid}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) credit(acct string, micros int64, key string) {
	e.t.Helper()
	if _, _, err := e.bill.Adjust(context.Background(), acct, billing.FundsEntry{Key: key, Kind: billing.KindCredit, AmountMicros: micros, Reason: "test", At: e.clock.Now()}); err != nil {
		e.t.Fatal(err)
	}
}

// acquire admits a workspace living life, and confirms it started.
func (e *env) acquire(acct, inst, agent string, life time.Duration) (sandgate.Workspace, error) {
	ctx := context.Background()
	now := e.clock.Now()
	w := sandgate.Workspace{ID: sandgate.NewID(sandgate.PrefixWorkspace), AccountID: acct, InstanceID: inst,
		Size: "small", Image: "img", Agent: agent, State: sandgate.WorkspaceStarting,
		CreatedAt: now, ExpiresAt: now.Add(life), LastActivity: now, IdleTimeout: time.Hour}
	r := &admission.Request{Workspace: w, Scope: sandgate.Scope{Limits: sandgate.Limits{MaxConcurrentWorkspaces: 100000}},
		Keys: store.AdmissionKeys(acct, inst, w.ID, w.ID), KeyHash: w.ID, RequestHash: "h", Now: now}
	if err := e.pipe.Admit(ctx, r); err != nil {
		return w, err
	}
	if ok, err := e.db.Confirm(ctx, r.Workspace, "", now, w.ID, "h"); err != nil || !ok {
		e.t.Fatalf("confirm: %v %v", ok, err)
	}
	return e.db.Workspace(ctx, acct, w.ID)
}

func (e *env) release(w sandgate.Workspace, reason sandgate.TerminationReason) {
	e.t.Helper()
	if ok, err := e.term.Terminate(context.Background(), w, reason); err != nil || !ok {
		e.t.Fatalf("terminate %s: %v %v", w.ID, ok, err)
	}
}

func (e *env) balance(acct string) billing.Balance {
	e.t.Helper()
	b, err := e.bill.Balance(context.Background(), acct)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

func (e *env) noDrift(acct string) {
	e.t.Helper()
	rep, err := e.bill.Reconcile(context.Background(), acct)
	if err != nil {
		e.t.Fatal(err)
	}
	if len(rep.Drift) != 0 {
		e.t.Fatalf("reconcile %s: drift %v", acct, rep.Drift)
	}
}

func code(err error) protocol.Code {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// Acceptance: 200 concurrent acquires against a balance covering exactly 7
// worst cases admit exactly 7; the rest are 402 insufficient_funds.
func TestConcurrentAcquiresAdmitExactlyWhatFundsCover(t *testing.T) {
	e := newEnv(t)
	const unit, life = 100, 10 * time.Minute // 100 micros/s × 600 s = 0.06 a worst case
	worst := int64(unit * 600)
	e.account("acct_a", unit, false)
	opening := 7 * worst
	e.credit("acct_a", opening, "open")

	var mu sync.Mutex
	var admitted []sandgate.Workspace
	refused := map[protocol.Code]int{}
	var wg sync.WaitGroup
	for range 200 {
		wg.Go(func() {
			w, err := e.acquire("acct_a", "inst_1", "", life)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				refused[code(err)]++
				return
			}
			admitted = append(admitted, w)
		})
	}
	wg.Wait()
	if len(admitted) != 7 || refused[protocol.InsufficientFunds] != 193 {
		t.Fatalf("admitted %d, refused %v; want 7 admitted and 193 insufficient_funds", len(admitted), refused)
	}
	if b := e.balance("acct_a"); b.AvailableMicros != 0 || b.HoldsMicros != opening {
		t.Fatalf("after admission: %+v, want available 0 and holds %d", b, opening)
	}
	var settled int64
	for i, w := range admitted {
		e.clock.Advance(time.Duration(i+1) * 7 * time.Second / 3)
		e.release(w, sandgate.ReasonReleased)
		e.noDrift("acct_a")
	}
	err := e.bill.Ledger().Scan(context.Background(), "acct_a", time.Time{}, time.Time{}, func(u billing.UsageEntry) error {
		settled += u.AmountMicros
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	b := e.balance("acct_a")
	if b.HoldsMicros != 0 || b.BalanceMicros != opening-settled || b.BalanceMicros < 0 || settled == 0 {
		t.Fatalf("after release: %+v, settled %d; want holds 0 and balance %d", b, settled, opening-settled)
	}
	e.noDrift("acct_a")
}

// Acceptance: an instance at its monthly cap is refused while a sibling
// under its own cap is admitted; the next month admits again.
func TestInstanceBudgetCapsOneMonth(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.account("acct_b", 100, true) // postpaid: budgets alone limit it
	cap := int64(100 * 600 * 2)    // two worst cases of 10 minutes
	for _, inst := range []string{"inst_1", "inst_2"} {
		if err := e.bill.SetBudget(ctx, "acct_b", billing.Budget{InstanceID: inst, MonthlyMicros: cap}); err != nil {
			t.Fatal(err)
		}
	}
	var ws []sandgate.Workspace
	for range 2 {
		w, err := e.acquire("acct_b", "inst_1", "", 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	if _, err := e.acquire("acct_b", "inst_1", "", 10*time.Minute); code(err) != protocol.BudgetExhausted {
		t.Fatalf("inst_1 at its cap: %v, want budget_exhausted", err)
	}
	if _, err := e.acquire("acct_b", "inst_2", "", 10*time.Minute); err != nil {
		t.Fatalf("sibling inst_2 under its cap: %v", err)
	}
	// Settled usage stays counted: each ran its whole life.
	e.clock.Advance(10 * time.Minute)
	for _, w := range ws {
		e.release(w, sandgate.ReasonExpired)
	}
	if _, err := e.acquire("acct_b", "inst_1", "", 10*time.Minute); code(err) != protocol.BudgetExhausted {
		t.Fatalf("inst_1 spent its cap: %v, want budget_exhausted", err)
	}
	e.clock.Set(time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC))
	if _, err := e.acquire("acct_b", "inst_1", "", 10*time.Minute); err != nil {
		t.Fatalf("next month: %v", err)
	}
	e.bill.FlushAlerts(ctx, "acct_b")
	got := map[string]int{}
	err := e.db.AuditRange(ctx, time.Time{}, time.Time{}, 0, func(raw []byte) error {
		var ev struct {
			Action string        `json:"action"`
			After  billing.Alert `json:"after"`
		}
		if err := json.Unmarshal(raw, &ev); err != nil {
			return err
		}
		if ev.Action == "budget.alert" {
			got[fmt.Sprintf("%s:%s:%d", ev.After.Month, ev.After.Scope, ev.After.Threshold)]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"202603:i:inst_1:50", "202603:i:inst_1:80", "202603:i:inst_1:100", "202603:i:inst_2:50"} {
		if got[want] != 1 {
			t.Errorf("alert %s written %d times, want once (all: %v)", want, got[want], got)
		}
	}
	e.noDrift("acct_b")
}

// Property: random credits, acquires, releases and reaper expiries
// conserve money at every step, and every workspace that ran appears in
// the ledger exactly once.
func TestMoneyConservedUnderRandomOperations(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const acct = "acct_p"
	e.account(acct, 7, false)
	rng := rand.New(rand.NewPCG(1, 2))
	var live []sandgate.Workspace
	all := map[string]bool{}
	credits := int64(0)
	for step := range 400 {
		switch op := rng.IntN(10); {
		case op < 2:
			amt := int64(rng.IntN(50_000) + 1)
			e.credit(acct, amt, fmt.Sprintf("c%d", step))
			e.credit(acct, amt, fmt.Sprintf("c%d", step)) // a replay changes nothing
			credits += amt
		case op < 6:
			w, err := e.acquire(acct, fmt.Sprintf("inst_%d", rng.IntN(3)), "", time.Duration(rng.IntN(600)+1)*time.Second)
			if err == nil {
				live, all[w.ID] = append(live, w), true
			} else if code(err) != protocol.InsufficientFunds {
				t.Fatalf("step %d: acquire: %v", step, err)
			}
		case op < 9 && len(live) > 0:
			i := rng.IntN(len(live))
			reason := sandgate.ReasonReleased
			if op == 8 {
				reason = sandgate.ReasonExpired // as the reaper ends it
			}
			e.release(live[i], reason)
			e.release(live[i], reason) // a second end settles nothing
			live = append(live[:i], live[i+1:]...)
		default:
			e.clock.Advance(time.Duration(rng.IntN(90_000)) * time.Millisecond)
		}
		b := e.balance(acct)
		if b.AvailableMicros+b.HoldsMicros+b.SettledMicros != credits || b.CreditsMicros != credits {
			t.Fatalf("step %d: available %d + holds %d + settled %d != credits %d", step, b.AvailableMicros, b.HoldsMicros, b.SettledMicros, credits)
		}
		if b.AvailableMicros < 0 {
			t.Fatalf("step %d: available %d < 0", step, b.AvailableMicros)
		}
	}
	for _, w := range live {
		e.release(w, sandgate.ReasonEmergencyStopped)
	}
	seen := map[string]int{}
	err := e.bill.Ledger().Scan(ctx, acct, time.Time{}, time.Time{}, func(u billing.UsageEntry) error {
		seen[u.WorkspaceID]++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for id := range all {
		if seen[id] != 1 {
			t.Fatalf("workspace %s appears %d times in the ledger", id, seen[id])
		}
	}
	if len(seen) != len(all) {
		t.Fatalf("ledger has %d workspaces, want %d", len(seen), len(all))
	}
	if b := e.balance(acct); b.HoldsMicros != 0 {
		t.Fatalf("holds %d after every release", b.HoldsMicros)
	}
	e.noDrift(acct)
}

// Statements read funds from billing's journals.
func TestFundsReaderFromJournals(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.account("acct_f", 10, false)
	t0 := e.clock.Now()
	e.credit("acct_f", 5_000_000, "c1")
	w, err := e.acquire("acct_f", "inst_1", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	holds, err := e.bill.HoldsAt(ctx, "acct_f", t0.Add(time.Second))
	if err != nil || len(holds) != 1 || holds[0].AmountMicros != 10*3600 {
		t.Fatalf("HoldsAt = %+v, %v; want the one hold of 0.036", holds, err)
	}
	e.clock.Advance(100 * time.Second)
	e.release(w, sandgate.ReasonReleased)
	end := e.clock.Now().Add(time.Second)
	bal, cur, err := e.bill.BalanceAt(ctx, "acct_f", end)
	if err != nil || bal != 5_000_000-1000 || cur != "USD" {
		t.Fatalf("BalanceAt = %d %s %v; want 4999000 USD", bal, cur, err)
	}
	if b, _, _ := e.bill.BalanceAt(ctx, "acct_f", t0.Add(-time.Hour)); b != 0 {
		t.Fatalf("BalanceAt before the credit = %d, want 0", b)
	}
	cs, err := e.bill.Credits(ctx, "acct_f", t0, end)
	if err != nil || len(cs) != 1 || cs[0].AmountMicros != 5_000_000 {
		t.Fatalf("Credits = %+v, %v", cs, err)
	}
}

// TestFundsDatedByClock: a credit given no time is dated by billing's
// clock, the one every other decision reads, not the host's: a balance at
// that clock's time counts it, and one before it does not.
func TestFundsDatedByClock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.account("acct_c", 10, false)
	got, applied, err := e.bill.Adjust(ctx, "acct_c", billing.FundsEntry{Key: "k", Kind: billing.KindCredit, AmountMicros: 2_000_000, Reason: "test"})
	if err != nil || !applied {
		t.Fatalf("Adjust = %v, applied %v", err, applied)
	}
	if want := e.clock.Now(); !got.At.Equal(want) {
		t.Errorf("credit dated %v; want the clock's %v", got.At, want)
	}
	if b, _, err := e.bill.BalanceAt(ctx, "acct_c", e.clock.Now().Add(time.Second)); err != nil || b != 2_000_000 {
		t.Errorf("BalanceAt a second later = %d, %v; want 2000000", b, err)
	}
	if b, _, _ := e.bill.BalanceAt(ctx, "acct_c", e.clock.Now().Add(-time.Second)); b != 0 {
		t.Errorf("BalanceAt a second before = %d; want 0", b)
	}
}

// TestAdjustPastInt64AppliesNothing: a credit or an adjustment that would
// take a counter past int64 is refused whole: no counter moves, nothing is
// appended, and its key stays unused, so a retry is refused again rather
// than answered as done.
func TestAdjustPastInt64AppliesNothing(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.account("acct_o", 10, false)
	const big = 9_000_000_000_000_000_000
	if _, _, err := e.bill.Adjust(ctx, "acct_o", billing.FundsEntry{Key: "k1", Kind: billing.KindCredit, AmountMicros: big, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	before := e.balance("acct_o")
	for range 2 {
		_, applied, err := e.bill.Adjust(ctx, "acct_o", billing.FundsEntry{Key: "k2", Kind: billing.KindCredit, AmountMicros: 300_000_000_000_000_000, Reason: "test"})
		if !errors.Is(err, billing.ErrAmountOverflow) || applied {
			t.Fatalf("credit past int64 = applied %t, %v; want ErrAmountOverflow", applied, err)
		}
	}
	if after := e.balance("acct_o"); after != before {
		t.Errorf("balance after the refused credit = %+v; want %+v", after, before)
	}
	if cs, err := e.bill.Credits(ctx, "acct_o", time.Time{}, e.clock.Now().Add(time.Hour)); err != nil || len(cs) != 1 {
		t.Errorf("funds ledger = %d entries, %v; want the first credit alone", len(cs), err)
	}

	// An adjustment's charge that takes settled past int64 (a refund
	// cannot: it takes back at most what an entry charged).
	w, err := e.acquire("acct_o", "inst_1", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(10 * time.Second)
	e.release(w, sandgate.ReasonReleased)
	before = e.balance("acct_o")
	_, appended, err := e.bill.AdjustUsage(ctx, "acct_o", billing.UsageAdjustment{Corrects: billing.FinalID(w.ID), Key: "charge-big",
		AmountMicros: math.MaxInt64 - before.SettledMicros + 1, Reason: "test", At: e.clock.Now()})
	if !errors.Is(err, billing.ErrAmountOverflow) || appended {
		t.Fatalf("charge past int64 = appended %t, %v; want ErrAmountOverflow", appended, err)
	}
	if after := e.balance("acct_o"); after != before {
		t.Errorf("balance after the refused charge = %+v; want %+v", after, before)
	}
	var n int
	_ = e.bill.Ledger().Scan(ctx, "acct_o", time.Time{}, time.Time{}, func(billing.UsageEntry) error { n++; return nil })
	if n != 1 {
		t.Errorf("usage ledger = %d entries; want the final entry alone", n)
	}
	e.noDrift("acct_o")
}

// TestPriceRefusesInexactHold: a worst case past 2^53 micro-units, which
// the scripts that accrue and settle a hold would round, is not priced;
// one at 2^53 is.
func TestPriceRefusesInexactHold(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.account("acct_h", 1<<20, false)
	now := e.clock.Now()
	if p, err := e.bill.Price(ctx, "acct_h", "small", now, now.Add((1<<33)*time.Second)); err != nil || p.HoldMicros != 1<<53 {
		t.Fatalf("Price of a 2^53 worst case = %+v, %v; want it priced", p, err)
	}
	if _, err := e.bill.Price(ctx, "acct_h", "small", now, now.Add((1<<33+1)*time.Second)); !errors.Is(err, billing.ErrOverflow) {
		t.Fatalf("Price of a worst case past 2^53 = %v; want ErrOverflow", err)
	}
}

// A settlement lost after the end was recorded, and a hold whose create
// was aborted without its release, are repaired; reconcile reports both
// until then.
func TestSettleDanglingRepairsLostSettlements(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.account("acct_d", 10, false)
	e.credit("acct_d", 10_000_000, "c")
	w1, err := e.acquire("acct_d", "inst_1", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	w2, err := e.acquire("acct_d", "inst_1", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	noSettle := termination.New(termination.Config{}, termination.Deps{DB: e.db, Clock: e.clock}) // a crash between finish and settle
	if ok, err := noSettle.Terminate(ctx, w1, sandgate.ReasonReleased); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := e.db.Abort(ctx, w2, w2.ID); err != nil { // a crash between abort and release
		t.Fatal(err)
	}
	rep, err := e.bill.Reconcile(ctx, "acct_d")
	if err != nil || len(rep.Drift) != 2 {
		t.Fatalf("reconcile before repair: %v %v; want 2 dangling holds", rep.Drift, err)
	}
	if n, err := e.bill.SettleDangling(ctx, "acct_d"); n != 2 || err != nil {
		t.Fatalf("SettleDangling = %d, %v; want 2", n, err)
	}
	b := e.balance("acct_d")
	if b.HoldsMicros != 0 || b.SettledMicros != 600 {
		t.Fatalf("after repair: %+v; want holds 0, settled 600 (60 s × 10)", b)
	}
	e.noDrift("acct_d")
}

// An adjustment corrects an entry by appending, once per key, and the
// account still reconciles.
func TestAdjustUsageAppendsOnce(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.account("acct_j", 10, false)
	e.credit("acct_j", 1_000_000, "c")
	w, err := e.acquire("acct_j", "inst_1", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(100 * time.Second)
	e.release(w, sandgate.ReasonReleased)
	for range 2 {
		if _, _, err := e.bill.AdjustUsage(ctx, "acct_j", billing.UsageAdjustment{Corrects: billing.FinalID(w.ID), Key: "refund-1", AmountMicros: -400, Reason: "test", At: e.clock.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := e.bill.AdjustUsage(ctx, "acct_j", billing.UsageAdjustment{Corrects: "ws_nope:final", Key: "x", AmountMicros: -1, Reason: "test", At: e.clock.Now()}); !errors.Is(err, billing.ErrNoEntry) {
		t.Fatalf("adjusting a missing entry: %v, want ErrNoEntry", err)
	}
	var kinds []string
	_ = e.bill.Ledger().Scan(ctx, "acct_j", time.Time{}, time.Time{}, func(u billing.UsageEntry) error {
		kinds = append(kinds, u.Kind+":"+u.Corrects)
		return nil
	})
	if len(kinds) != 2 || kinds[1] != "adjustment:"+billing.FinalID(w.ID) {
		t.Fatalf("ledger kinds = %v", kinds)
	}
	if b := e.balance("acct_j"); b.SettledMicros != 600 || b.BalanceMicros != 1_000_000-600 {
		t.Fatalf("after a 400 refund of 1000: %+v", b)
	}
	e.noDrift("acct_j")
}

// An adjustment's key used again for another entry or amount is refused,
// not answered as done; a retry answers the entry stored first. An
// adjustment carries no egress bytes: they are the final entry's alone,
// and a copy would count the workspace's traffic twice in exports.
func TestAdjustUsageKeyAndEgress(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const acct = "acct_k"
	e.account(acct, 10, false)
	ledger := e.bill.Ledger()
	for _, id := range []string{"ws_a", "ws_b"} {
		fin := billing.UsageEntry{ID: billing.FinalID(id), Kind: billing.KindUsage, Final: true, AccountID: acct, WorkspaceID: id,
			Size: "small", Currency: "USD", UnitPriceMicros: 10, Seconds: 100, AmountMicros: 1000,
			TerminatedAt: e.clock.Now(), EgressBytesOut: 5_000_000, EgressBytesIn: 7_000_000}
		if _, err := ledger.Append(ctx, fin); err != nil {
			t.Fatal(err)
		}
	}
	first, appended, err := e.bill.AdjustUsage(ctx, acct, billing.UsageAdjustment{Corrects: billing.FinalID("ws_a"), Key: "refund", AmountMicros: -400, Reason: "test", At: e.clock.Now()})
	if err != nil || !appended {
		t.Fatalf("adjustment: appended %v, %v", appended, err)
	}
	if first.EgressBytesOut != 0 || first.EgressBytesIn != 0 {
		t.Errorf("adjustment egress bytes = %d out, %d in; want 0, 0", first.EgressBytesOut, first.EgressBytesIn)
	}
	e.clock.Advance(time.Minute)
	again, appended, err := e.bill.AdjustUsage(ctx, acct, billing.UsageAdjustment{Corrects: billing.FinalID("ws_a"), Key: "refund", AmountMicros: -400, Reason: "test", At: e.clock.Now()})
	if err != nil || appended || again != first {
		t.Errorf("the same adjustment again = %+v, appended %v, %v; want the first, %+v, not appended", again, appended, err, first)
	}
	for _, tc := range []struct {
		label    string
		corrects string
		amount   int64
	}{{"another entry", billing.FinalID("ws_b"), -400}, {"another amount", billing.FinalID("ws_a"), -900}} {
		if _, appended, err := e.bill.AdjustUsage(ctx, acct, billing.UsageAdjustment{Corrects: tc.corrects, Key: "refund", AmountMicros: tc.amount, Reason: "test", At: e.clock.Now()}); !errors.Is(err, billing.ErrAdjustmentConflict) || appended {
			t.Errorf("the key reused for %s: appended %v, %v; want ErrAdjustmentConflict", tc.label, appended, err)
		}
	}
	var adjustments int
	var out, in int64
	_ = ledger.Scan(ctx, acct, time.Time{}, time.Time{}, func(u billing.UsageEntry) error {
		out, in = out+u.EgressBytesOut, in+u.EgressBytesIn
		if u.Kind == billing.KindAdjustment {
			adjustments++
		}
		return nil
	})
	if adjustments != 1 || out != 10_000_000 || in != 14_000_000 {
		t.Errorf("ledger: %d adjustments, egress %d out, %d in; want 1, and the two final entries' 10000000, 14000000", adjustments, out, in)
	}
}

// Egress bytes a broker process recorded on the workspace's record while
// it ran (store.DB.AddEgress, from its proxy's Record) are on the final
// ledger entry when another process, whose meter counted only the rest,
// ends the workspace: a restart loses none of what was recorded, and a
// count sent twice is recorded once. The client's release (one script
// that ends and settles) keeps them too, and an end whose count's last
// keep is in doubt charges what the record holds, not the count twice.
func TestSettleKeepsRecordedEgressBytes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.account("acct_r", 10, false)
	e.credit("acct_r", 10_000_000, "c")
	add := func(w sandgate.Workspace, counter string, out, in int64) {
		t.Helper()
		res, err := e.db.AddEgress(ctx, []store.EgressAdd{{AccountID: "acct_r", WorkspaceID: w.ID, Egress: store.Egress{Counter: counter, Out: out, In: in}}})
		if err != nil || len(res) != 1 || res[0] != store.EgressAdded {
			t.Fatalf("AddEgress = %v, %v; want added", res, err)
		}
	}
	final := func(w sandgate.Workspace) billing.UsageEntry {
		var f billing.UsageEntry
		_ = e.bill.Ledger().Scan(ctx, "acct_r", time.Time{}, time.Time{}, func(u billing.UsageEntry) error {
			if u.ID == billing.FinalID(w.ID) {
				f = u
			}
			return nil
		})
		return f
	}
	check := func(what string, w sandgate.Workspace, out, in int64) {
		t.Helper()
		if f := final(w); f.EgressBytesOut != out || f.EgressBytesIn != in {
			t.Errorf("%s: final entry %q egress out %d, in %d; want %d, %d", what, f.ID, f.EgressBytesOut, f.EgressBytesIn, out, in)
		}
		if rec, err := e.db.Workspace(ctx, "acct_r", w.ID); err != nil || rec.EgressBytesOut != out || rec.EgressBytesIn != in {
			t.Errorf("%s: record egress out %d, in %d (%v); want %d, %d", what, rec.EgressBytesOut, rec.EgressBytesIn, err, out, in)
		}
	}
	counts := map[string]termination.EgressCount{}
	term := termination.New(termination.Config{}, termination.Deps{DB: e.db, Clock: e.clock, Settler: e.bill,
		EgressMeter: func(id string) termination.EgressCount { return counts[id] }})

	w, err := e.acquire("acct_r", "inst_1", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// The process that served the workspace's proxy sent its count twice
	// (a retry), then was gone.
	add(w, "p1.1", 1000, 50000)
	add(w, "p1.1", 1000, 50000)
	e.clock.Advance(time.Minute)
	// The process that ends it counted 7 and 9 bytes since.
	counts[w.ID] = termination.EgressCount{Egress: store.Egress{Counter: "p2.1", Out: 7, In: 9}, NewOut: 7, NewIn: 9, Exact: true}
	if ok, err := term.Terminate(ctx, w, sandgate.ReasonReleased); !ok || err != nil {
		t.Fatal(ok, err)
	}
	check("Terminate", w, 1007, 50009)
	// Terminate (the reaper's and the operator's path), given a copy of
	// the record read before the adds, reports them too.
	w2, err := e.acquire("acct_r", "inst_1", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	add(w2, "p1.2", 300, 400)
	counts[w2.ID] = counts[w.ID]
	if ok, err := term.Terminate(ctx, w2, sandgate.ReasonExpired); !ok || err != nil {
		t.Fatal(ok, err)
	}
	check("Terminate from a stale copy", w2, 307, 409)
	// Bytes the first process still held are refused once it has ended.
	if res, err := e.db.AddEgress(ctx, []store.EgressAdd{{AccountID: "acct_r", WorkspaceID: w.ID, Egress: store.Egress{Counter: "p1.1", Out: 1001, In: 50001}}}); err != nil || res[0] != store.EgressEnded {
		t.Errorf("AddEgress after the end = %v, %v; want ended", res, err)
	}

	// A client's release, its own process having recorded part of its
	// count: the end adds the rest, once.
	w3, err := e.acquire("acct_r", "inst_1", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	add(w3, "p3.1", 100, 200)
	counts[w3.ID] = termination.EgressCount{Egress: store.Egress{Counter: "p3.1", Out: 150, In: 260}, NewOut: 50, NewIn: 60, Exact: true}
	if _, err := term.Release(ctx, "acct_r", "inst_1", w3.ID); err != nil {
		t.Fatal(err)
	}
	check("Release", w3, 150, 260)
	// The same, but the process never learned that its last keep landed
	// (the reply was lost): its count is not exact, and the end adds only
	// what the record lacks of it.
	w4, err := e.acquire("acct_r", "inst_1", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	add(w4, "p3.2", 100, 200)
	counts[w4.ID] = termination.EgressCount{Egress: store.Egress{Counter: "p3.2", Out: 150, In: 260}, NewOut: 150, NewIn: 260}
	if got, err := term.Release(ctx, "acct_r", "inst_1", w4.ID); err != nil || got.EgressBytesOut != 150 || got.EgressBytesIn != 260 {
		t.Errorf("Release in doubt = egress out %d, in %d (%v); want 150, 260", got.EgressBytesOut, got.EgressBytesIn, err)
	}
	check("Release in doubt", w4, 150, 260)
	e.noDrift("acct_r")
}

// The egress bytes the Terminator's meter reports at the end land on the
// workspace's final ledger entry, and in its statement line.
func TestSettleRecordsEgressBytes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.account("acct_e", 10, false)
	e.credit("acct_e", 10_000_000, "c")
	w, err := e.acquire("acct_e", "inst_1", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	asked := map[string]int{}
	term := termination.New(termination.Config{}, termination.Deps{DB: e.db, Clock: e.clock, Settler: e.bill,
		EgressMeter: func(id string) termination.EgressCount {
			asked[id]++
			return termination.EgressCount{Egress: store.Egress{Counter: "p.1", Out: 1234, In: 56789}, NewOut: 1234, NewIn: 56789, Exact: true}
		}})
	if ok, err := term.Terminate(ctx, w, sandgate.ReasonReleased); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if asked[w.ID] != 1 {
		t.Errorf("egress meter asked %v; want once for %s", asked, w.ID)
	}
	var final billing.UsageEntry
	_ = e.bill.Ledger().Scan(ctx, "acct_e", time.Time{}, time.Time{}, func(u billing.UsageEntry) error {
		if u.Final {
			final = u
		}
		return nil
	})
	if final.ID != billing.FinalID(w.ID) || final.EgressBytesOut != 1234 || final.EgressBytesIn != 56789 {
		t.Errorf("final entry %s: egress out %d, in %d; want %s, 1234, 56789", final.ID, final.EgressBytesOut, final.EgressBytesIn, billing.FinalID(w.ID))
	}
	// The end's script added them to the record too.
	if rec, err := e.db.Workspace(ctx, "acct_e", w.ID); err != nil || rec.EgressBytesOut != 1234 || rec.EgressBytesIn != 56789 {
		t.Errorf("record egress out %d, in %d (%v); want 1234, 56789", rec.EgressBytesOut, rec.EgressBytesIn, err)
	}
	st, err := billing.BuildStatement(ctx, e.bill.Ledger(), nil, "acct_e", e.clock.Now(), e.clock.Now().Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Lines) != 1 || st.Lines[0].EgressBytesOut != 1234 || st.Lines[0].EgressBytesIn != 56789 {
		t.Errorf("statement lines = %+v; want one with egress 1234 out, 56789 in", st.Lines)
	}
	e.noDrift("acct_e")
}

// TestRefundBoundedByEntry: a refund takes back at most what the entry it
// corrects still charges, counting every adjustment of it, including
// adjustments of its adjustments; a refused one applies nothing; a retry of
// one applied earlier is answered as done even when the entry is now fully
// refunded; and concurrent refunds together never exceed the entry.
func TestRefundBoundedByEntry(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const acct = "acct_r"
	e.account(acct, 10, false)
	e.credit(acct, 1_000_000, "c")
	final := func() string {
		w, err := e.acquire(acct, "inst_1", "", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(100 * time.Second) // 1000 micros
		e.release(w, sandgate.ReasonReleased)
		return billing.FinalID(w.ID)
	}
	adjust := func(corrects, key string, amount int64) (billing.UsageEntry, bool, error) {
		return e.bill.AdjustUsage(ctx, acct, billing.UsageAdjustment{Corrects: corrects, Key: key, AmountMicros: amount, Reason: "test", At: e.clock.Now()})
	}
	entries := func() int {
		n := 0
		_ = e.bill.Ledger().Scan(ctx, acct, time.Time{}, time.Time{}, func(billing.UsageEntry) error { n++; return nil })
		return n
	}

	fin := final()
	first, _, err := adjust(fin, "r1", -600)
	if err != nil {
		t.Fatal(err)
	}
	before, n := e.balance(acct), entries()
	if _, appended, err := adjust(fin, "r2", -401); !errors.Is(err, billing.ErrRefundExceedsEntry) || appended {
		t.Fatalf("a refund of 401 after 600 of 1000 = appended %t, %v; want ErrRefundExceedsEntry", appended, err)
	}
	if after := e.balance(acct); after != before || entries() != n {
		t.Errorf("the refused refund moved the balance (%+v → %+v) or the ledger (%d → %d entries)", before, after, n, entries())
	}
	if got, appended, err := adjust(fin, "r1", -600); err != nil || appended || got.ID != first.ID {
		t.Errorf("a retry of the first refund = %s, appended %t, %v; want %s answered again", got.ID, appended, err, first.ID)
	}
	// Undoing part of the refund (an adjustment of the adjustment) makes
	// room again, exactly.
	if _, _, err := adjust(first.ID, "undo", 200); err != nil {
		t.Fatal(err)
	}
	if _, _, err := adjust(fin, "r3", -600); err != nil {
		t.Fatalf("a refund of the 600 left: %v", err)
	}
	if got, appended, err := adjust(fin, "r1", -600); err != nil || appended || got.ID != first.ID {
		t.Errorf("a retry of the first refund once the entry is fully refunded = %s, appended %t, %v; want %s answered again", got.ID, appended, err, first.ID)
	}
	if _, _, err := adjust(first.ID, "r4", -1); !errors.Is(err, billing.ErrRefundExceedsEntry) {
		t.Errorf("a refund of a fully refunded entry, through its adjustment: %v; want ErrRefundExceedsEntry", err)
	}

	// Eight refunds of 300 at once: three fit in 1000.
	fin = final()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { _, _, errs[i] = adjust(fin, fmt.Sprint("c", i), -300) })
	}
	wg.Wait()
	ok, refused := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, billing.ErrRefundExceedsEntry):
			refused++
		default:
			t.Errorf("concurrent refund: %v", err)
		}
	}
	if ok != 3 || refused != 5 {
		t.Errorf("concurrent refunds of 300 of 1000: %d applied, %d refused; want 3, 5", ok, refused)
	}
	e.noDrift(acct)
}

// TestCurrencyLockedOnceMoneyMoves: an account's currency cannot change
// (another card's currency, or free) once it has funds or priced usage in
// it, since balances and statements would relabel that money; with no
// money moved, or from free usage only, it can.
func TestCurrencyLockedOnceMoneyMoves(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	prices := map[string]int64{}
	for _, s := range sandgate.StandardSizes {
		prices[s.Name] = 10
	}
	if _, err := e.bill.CreateRateCard(ctx, "eur", "EUR", prices, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	toEUR := func(acct string) error {
		return e.bill.SetSettings(ctx, billing.Settings{AccountID: acct, RateCard: "eur", Currency: "EUR"})
	}
	toFree := func(acct string) error {
		return e.bill.SetSettings(ctx, billing.Settings{AccountID: acct, Free: true})
	}

	e.account("acct_new", 10, false) // USD, nothing moved yet
	if err := toEUR("acct_new"); err != nil {
		t.Errorf("an account with no money moved, to EUR: %v", err)
	}

	e.account("acct_paid", 10, false)
	e.credit("acct_paid", 1_000_000, "c")
	w, err := e.acquire("acct_paid", "inst_1", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(10 * time.Minute)
	e.release(w, sandgate.ReasonReleased)
	month := billing.MonthOf(e.clock.Now())
	for name, change := range map[string]func(string) error{"to EUR": toEUR, "to free": toFree} {
		if err := change("acct_paid"); !errors.Is(err, billing.ErrCurrencyInUse) {
			t.Errorf("an account with USD funds and usage, %s: %v; want ErrCurrencyInUse", name, err)
		}
	}
	if s, err := e.bill.Settings(ctx, "acct_paid"); err != nil || s.Currency != "USD" {
		t.Errorf("settings after the refused changes = %+v, %v; want USD kept", s, err)
	}
	if _, err := billing.BuildStatement(ctx, e.bill.Ledger(), e.bill, "acct_paid", month, month.AddDate(0, 1, 0)); err != nil {
		t.Errorf("statement after the refused changes: %v", err)
	}

	// Usage priced at 0 in USD moves no funds, but its ledger entries are
	// in USD: statements would meet them.
	e.account("acct_zero", 0, true)
	w, err = e.acquire("acct_zero", "inst_3", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	e.release(w, sandgate.ReasonReleased)
	if err := toEUR("acct_zero"); !errors.Is(err, billing.ErrCurrencyInUse) {
		t.Errorf("an account with USD usage at price 0, to EUR: %v; want ErrCurrencyInUse", err)
	}

	// A free account's usage costs 0 in XXX and fits any currency.
	if err := e.bill.SetSettings(ctx, billing.Settings{AccountID: "acct_trial", Free: true}); err != nil {
		t.Fatal(err)
	}
	w, err = e.acquire("acct_trial", "inst_2", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	e.release(w, sandgate.ReasonReleased)
	if err := toEUR("acct_trial"); err != nil {
		t.Errorf("a free account with free usage, to EUR: %v", err)
	}
}

// TestAgentBudgetOnlyAlerts: agent is attribution the client chooses and
// may omit (spec §Conventions: never a control), so an agent budget is
// soft: a hard one is refused when set, one stored hard before is not
// enforced, and the same Acquire is admitted with the agent or without;
// its alerts still reach the queue.
func TestAgentBudgetOnlyAlerts(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const acct = "acct_ag"
	e.account(acct, 100, true)
	if err := e.bill.SetBudget(ctx, acct, billing.Budget{Agent: "coder", MonthlyMicros: 1}); !errors.Is(err, billing.ErrAgentBudgetHard) {
		t.Fatalf("a hard agent budget: %v; want ErrAgentBudgetHard", err)
	}
	if err := e.bill.SetBudget(ctx, acct, billing.Budget{Agent: "coder", MonthlyMicros: 1, Soft: true}); err != nil {
		t.Fatalf("a soft agent budget: %v", err)
	}
	// One stored hard by an earlier version, within an instance.
	if err := e.db.Redis().HSet(ctx, "sg:{"+acct+"}:budgets", "i:inst_1:g:coder", 1).Err(); err != nil {
		t.Fatal(err)
	}
	for _, agent := range []string{"coder", ""} {
		if _, err := e.acquire(acct, "inst_1", agent, 10*time.Minute); err != nil {
			t.Errorf("acquire with agent %q over the agent's budgets: %v; want admitted", agent, err)
		}
	}
	if n, err := e.db.Redis().LLen(ctx, "sg:{"+acct+"}:alerts").Result(); err != nil || n == 0 {
		t.Errorf("alerts queued for the agent's budgets = %d, %v; want some", n, err)
	}
}
