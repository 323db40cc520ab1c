package billing_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/store"
)

// funds is a FundsReader over a fixed journal: credits and charges, each
// at an instant, plus the holds open at any time.
type funds struct {
	currency string
	credits  []billing.Credit
	charges  map[time.Time]int64
	holds    []billing.Hold
}

func (f *funds) BalanceAt(_ context.Context, _ string, t time.Time) (int64, string, error) {
	var b int64
	for _, c := range f.credits {
		if c.At.Before(t) {
			b += c.AmountMicros
		}
	}
	for at, m := range f.charges {
		if at.Before(t) {
			b -= m
		}
	}
	return b, f.currency, nil
}

func (f *funds) Credits(_ context.Context, _ string, from, to time.Time) ([]billing.Credit, error) {
	var out []billing.Credit
	for _, c := range f.credits {
		if !c.At.Before(from) && c.At.Before(to) {
			out = append(out, c)
		}
	}
	return out, nil
}

func (f *funds) HoldsAt(context.Context, string, time.Time) ([]billing.Hold, error) {
	return slices.Clone(f.holds), nil
}

func TestStatementReconcilesWithExportAndLedger(t *testing.T) {
	ctx := context.Background()
	l := billing.NewLedger(redistest.Start(t).Client())
	in := seed(t, l, "acct_st")
	// A workspace admitted without a price: NoCurrency, 0, on any statement.
	free := billing.UsageEntry{ID: "ws_free:final", Kind: billing.KindUsage, Final: true, AccountID: "acct_st",
		WorkspaceID: "ws_free", Size: "small", Currency: billing.NoCurrency, Seconds: 60, TerminatedAt: month.Add(time.Hour)}
	if _, err := l.Append(ctx, free); err != nil {
		t.Fatal(err)
	}
	in = append(in, free)
	f := &funds{currency: "USD", charges: map[time.Time]int64{}}
	f.credits = []billing.Credit{
		{ID: "cr_1", At: month.AddDate(0, -1, 0), AmountMicros: 500_000_000, Note: "opening top-up"},
		{ID: "cr_2", Kind: "credit", At: month.Add(48 * time.Hour), AmountMicros: 250_000_000, Note: "top-up"},
		{ID: "db_1", Kind: "debit", At: month.Add(96 * time.Hour), AmountMicros: -10_000_000, Note: "manual debit"},
	}
	// The funds journal charges each entry at its termination, like settlement.
	f.charges[month.Add(-time.Millisecond)] = 970 // the entry before the month
	for _, e := range in {
		f.charges[e.TerminatedAt] += e.AmountMicros
	}
	f.holds = []billing.Hold{{WorkspaceID: "ws_running", InstanceID: "inst_acct_st_0", Size: "small",
		Since: month.AddDate(0, 1, 0).Add(-time.Hour), AmountMicros: 349_200}}

	st, err := billing.BuildStatement(ctx, l, f, "acct_st", month.Add(17*time.Hour), month.AddDate(0, 2, 0))
	if err != nil {
		t.Fatal(err)
	}
	if st.Month != "2026-10" || !st.From.Equal(month) || !st.To.Equal(month.AddDate(0, 1, 0)) || !st.Complete {
		t.Errorf("statement period = %s [%v, %v) complete %v; want 2026-10, the whole month, complete", st.Month, st.From, st.To, st.Complete)
	}

	// The export of the same account and month.
	var buf bytes.Buffer
	if _, err := billing.Export(ctx, l, []string{"acct_st"}, monthFilter(), billing.FormatCSV, &buf); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	amt := slices.Index(billing.Columns, "amount_micros")
	var exportTotal, ledgerTotal, usage, adjust int64
	for _, r := range recs[1:] {
		m, _ := strconv.ParseInt(r[amt], 10, 64)
		exportTotal += m
	}
	for _, e := range in {
		ledgerTotal += e.AmountMicros
		if e.Kind == billing.KindAdjustment {
			adjust += e.AmountMicros
		} else {
			usage += e.AmountMicros
		}
	}
	var lines int64
	for _, ln := range st.Lines {
		lines += ln.AmountMicros
		if ln.AmountMicros != ln.UnitPriceMicros*ln.Seconds {
			t.Errorf("line %s: %d micros; want %d × %d s", ln.Size, ln.AmountMicros, ln.UnitPriceMicros, ln.Seconds)
		}
	}
	if got := st.UsageMicros + st.AdjustMicros; got != exportTotal || got != ledgerTotal {
		t.Errorf("statement usage+adjustments = %d; export total %d, ledger total %d", got, exportTotal, ledgerTotal)
	}
	if st.UsageMicros != usage || lines != usage || st.AdjustMicros != adjust {
		t.Errorf("statement usage %d (lines %d), adjustments %d; want %d, %d", st.UsageMicros, lines, st.AdjustMicros, usage, adjust)
	}
	if len(st.Lines) != 4 || st.Lines[0].Size != "large" || st.Lines[2].Size != "small" || st.Lines[2].Workspaces != 1 || st.Lines[3].Size != "small" {
		t.Errorf("lines = %+v; want large, medium, small at 0 (the free workspace), small", st.Lines)
	}
	wantOpening := int64(500_000_000 - 970)
	if st.OpeningMicros != wantOpening || st.CreditsMicros != 240_000_000 || len(st.Credits) != 2 || st.Currency != "USD" {
		t.Errorf("opening %d credits %d (%d), %s; want %d, 240000000 (2), USD", st.OpeningMicros, st.CreditsMicros, len(st.Credits), st.Currency, wantOpening)
	}
	if want := wantOpening + 240_000_000 - ledgerTotal; st.ClosingMicros != want {
		t.Errorf("closing = %d; want %d", st.ClosingMicros, want)
	}
	if st.UnexplMicros != 0 {
		t.Errorf("unexplained = %d; want 0 when every movement is on the statement", st.UnexplMicros)
	}
	if st.HoldsMicros != 349_200 || st.AvailMicros != st.ClosingMicros-349_200 || st.HoldsTotal != "0.35" {
		t.Errorf("holds %d (%s), available %d", st.HoldsMicros, st.HoldsTotal, st.AvailMicros)
	}
	if st.UsageTotal != billing.FormatMinor(usage, "USD") || st.MinorUnits != 2 {
		t.Errorf("usage total %q, minor units %d", st.UsageTotal, st.MinorUnits)
	}
}

func TestStatementRefusesMixedCurrencies(t *testing.T) {
	ctx := context.Background()
	l := billing.NewLedger(redistest.Start(t).Client())
	seed(t, l, "acct_eur")
	_, err := billing.BuildStatement(ctx, l, &funds{currency: "EUR"}, "acct_eur", month, month.AddDate(0, 2, 0))
	if err == nil {
		t.Fatal("BuildStatement over USD usage with EUR funds succeeded; want an error")
	}
}

// TestStatementCompleteOnceUsageIsIn: a workspace runs across the end of
// March. March's statement is not complete until its last hour is in the
// ledger: not a moment after midnight (the hour is accrued a minute
// later), not while accrual has not run since (a billing pass missed), and
// not while a workspace that ended in March waits for its settlement.
// Once complete, a later statement of March says the same.
func TestStatementCompleteOnceUsageIsIn(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const acct = "acct_st"
	e.account(acct, 10, false)
	e.credit(acct, 100_000_000, "c")
	e.clock.Advance(time.Date(2026, 3, 31, 22, 30, 0, 0, time.UTC).Sub(e.clock.Now()))
	if _, err := e.acquire(acct, "inst_1", "", 4*time.Hour); err != nil {
		t.Fatal(err)
	}
	ended, err := e.acquire(acct, "inst_1", "", 4*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	march := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	statement := func(label string) billing.Statement { return e.statementNow(acct, march, label) }
	accrue := func() { e.accrueNow(acct) }
	// The second workspace ends at 23:50; its end is recorded, its
	// settlement not (a broker died between the two).
	e.clock.Advance(80 * time.Minute)
	if _, _, err := e.db.BeginTerminate(ctx, ended, sandgate.ReasonReleased, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if err := e.db.FinishTerminate(ctx, ended, e.clock.Now(), store.Egress{}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(10*time.Minute + 30*time.Second) // 00:00:30 April 1st
	accrue()
	if st := statement("just after midnight"); st.Complete {
		t.Errorf("March's statement 30 s after midnight is complete; its last hour is accrued only after %v", billing.AccrualGrace)
	}
	e.clock.Advance(5 * time.Minute)
	if st := statement("before accrual ran"); st.Complete {
		t.Error("March's statement is complete before accrual wrote its last hour")
	}
	accrue()
	if st := statement("before the ended workspace is settled"); st.Complete {
		t.Error("March's statement is complete while a workspace that ended in March is not settled")
	}
	rec, err := e.db.Workspace(ctx, acct, ended.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.bill.Settle(ctx, rec); err != nil {
		t.Fatal(err)
	}
	first := statement("once settled")
	if !first.Complete {
		t.Fatal("March's statement is not complete with every March entry in the ledger")
	}
	e.clock.Advance(2 * time.Hour)
	accrue()
	if later := statement("two hours later"); later.UsageMicros != first.UsageMicros || later.ClosingMicros != first.ClosingMicros || !later.Complete {
		t.Errorf("March later: usage %d, closing %d, complete %v; want the complete statement's %d, %d",
			later.UsageMicros, later.ClosingMicros, later.Complete, first.UsageMicros, first.ClosingMicros)
	}
}

// TestStatementIncompleteWhileEnding: a workspace whose release began in
// the last minutes of March, with the provider slow to end it, files its
// last March hour only at its settlement (accrual writes only running
// workspaces): March's statement is not complete until then, and once
// complete it keeps its usage.
func TestStatementIncompleteWhileEnding(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const acct = "acct_ending"
	w := e.runningFrom(acct, time.Date(2026, 3, 31, 22, 10, 0, 0, time.UTC))
	accrue := func() { e.accrueNow(acct) }
	march := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	statement := func(label string) billing.Statement { return e.statementNow(acct, march, label) }
	e.clock.Set(time.Date(2026, 3, 31, 23, 2, 0, 0, time.UTC))
	accrue() // 22:10-23:00
	e.clock.Set(time.Date(2026, 3, 31, 23, 59, 30, 0, time.UTC))
	if _, _, err := e.db.BeginTerminate(ctx, w, sandgate.ReasonReleased, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	e.clock.Set(time.Date(2026, 4, 1, 0, 4, 30, 0, time.UTC))
	accrue() // nothing: it no longer runs
	if st := statement("while ending"); st.Complete {
		t.Errorf("March's statement is complete (usage %d) while a workspace that ran in its last hour is still ending", st.UsageMicros)
	}
	cur, err := e.db.Workspace(ctx, acct, w.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := e.term.Finish(ctx, cur); err != nil || !ok {
		t.Fatalf("Finish = %t, %v", ok, err)
	}
	first := statement("once ended")
	if !first.Complete {
		t.Fatal("March's statement is not complete once the workspace is settled")
	}
	e.clock.Advance(2 * time.Hour)
	accrue()
	if later := statement("later"); later.UsageMicros != first.UsageMicros {
		t.Errorf("March's usage moved from %d to %d after its statement was complete", first.UsageMicros, later.UsageMicros)
	}
}

// runningFrom configures acct (prepaid, 10 micros a second, funds for
// days) and admits a workspace of 4 h at start, the clock set there.
func (e *env) runningFrom(acct string, start time.Time) sandgate.Workspace {
	e.t.Helper()
	e.account(acct, 10, false)
	e.credit(acct, 100_000_000, "c")
	e.clock.Set(start)
	w, err := e.acquire(acct, "inst_1", "", 4*time.Hour)
	if err != nil {
		e.t.Fatal(err)
	}
	return w
}

// accrueNow runs a billing pass's accrual of acct at the clock's time.
func (e *env) accrueNow(acct string) {
	e.t.Helper()
	if _, err := e.bill.Accrue(context.Background(), acct, e.clock.Now()); err != nil {
		e.t.Fatal(err)
	}
}

// statementNow is acct's statement of the month starting at month, as
// built at the clock's time.
func (e *env) statementNow(acct string, month time.Time, label string) billing.Statement {
	e.t.Helper()
	st, err := billing.BuildStatement(context.Background(), e.bill.Ledger(), e.bill, acct, month, e.clock.Now())
	if err != nil {
		e.t.Fatalf("%s: %v", label, err)
	}
	return st
}
