package billing

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// FundsReader is what a monthly statement reads of an account's prepaid
// funds; the funds store implements it (cmd wires it). Amounts are int64
// micro-units of the account's currency. Every method may be called for a
// past instant, so an implementation answers from a journal of funds
// movements, not from the current balance alone.
type FundsReader interface {
	// BalanceAt returns acct's balance at instant t and its currency: every
	// credit posted before t, minus every debit posted and every charge
	// settled before t. Holds are not subtracted (HoldsAt lists them). An
	// account that had no funds at t has balance 0 and its currency.
	BalanceAt(ctx context.Context, acct string, t time.Time) (micros int64, currency string, err error)
	// Credits returns the operator's credits (top-ups, grants) and debits
	// posted to acct in [from, to), oldest first, a debit with a negative
	// AmountMicros. Settlement charges are not among them: they are the
	// usage ledger's. A month has few of them.
	Credits(ctx context.Context, acct string, from, to time.Time) ([]Credit, error)
	// HoldsAt returns the holds open on acct at instant t: money reserved
	// for workspaces still running, not yet charged.
	HoldsAt(ctx context.Context, acct string, t time.Time) ([]Hold, error)
}

// Credit is one operator credit or debit of an account's funds.
type Credit struct {
	ID           string    `json:"id"`
	Kind         string    `json:"kind"` // "credit" or "debit"
	At           time.Time `json:"at"`
	AmountMicros int64     `json:"amount_micros"` // negative for a debit
	Amount       string    `json:"amount"`        // filled by BuildStatement
	Note         string    `json:"note"`
}

// Hold is money reserved against an account's funds for one workspace.
type Hold struct {
	WorkspaceID  string    `json:"workspace_id"`
	InstanceID   string    `json:"instance_id"`
	Size         string    `json:"size"`
	Since        time.Time `json:"since"`
	AmountMicros int64     `json:"amount_micros"`
	Amount       string    `json:"amount"` // filled by BuildStatement
}

// StatementLine is the usage of one size at one unit price in a month:
// the basis of an invoice line.
type StatementLine struct {
	Size            string `json:"size"`
	UnitPriceMicros int64  `json:"unit_price_micros"` // per second
	UnitPrice       string `json:"unit_price"`        // FormatMicros
	Workspaces      int64  `json:"workspaces"`
	Seconds         int64  `json:"seconds"`
	AmountMicros    int64  `json:"amount_micros"`
	Amount          string `json:"amount"` // FormatMinor of AmountMicros
	// EgressBytesOut and EgressBytesIn are the line's workspaces' bytes
	// through the broker's egress proxy; not charged.
	EgressBytesOut int64 `json:"egress_bytes_out"`
	EgressBytesIn  int64 `json:"egress_bytes_in"`
}

// AdjustmentLine is one adjustment entry of the month.
type AdjustmentLine struct {
	ID           string `json:"id"`
	Corrects     string `json:"corrects"`
	TerminatedAt string `json:"terminated_at"`
	AmountMicros int64  `json:"amount_micros"`
	Amount       string `json:"amount"`
	Reason       string `json:"reason"` // why the operator made it
	Actor        string `json:"actor"`  // who made it (the audit log's actor)
}

// Statement is an account's monthly statement: what a reseller turns into
// an invoice. Every amount is given exactly in micro-units (…Micros) and
// rendered at the currency's minor units (FormatMinor); totals are summed
// in micro-units and rounded once, so a total may differ by a minor unit
// from the sum of its rounded lines.
//
// Usage is the month's ledger entries selected by termination time, the
// same rows as the month's usage export of the account, so
// UsageMicros + AdjustmentsMicros equals that export's amount_micros total.
// Opening, credits, holds and closing come from the [FundsReader]; the
// closing balance and the holds are those at To. While the month is not
// over the statement ends at GeneratedAt instead: usage, credits, holds
// and closing are those of [From, GeneratedAt). Complete is false until
// the month is over and its usage is all in the ledger: AccrualGrace
// after To at the earliest, and, with a FundsReader that is a
// [UsageFiler], once every running workspace's periods of the month are
// written and every workspace that ended in it is settled.
// Credits are net of the operator's debits.
// Unexplained is Closing − (Opening + Credits − Usage − Adjustments): zero
// when every funds movement of the month is on the statement; otherwise it
// is what the month's funds moved by outside it (with billing's journals,
// which charge usage by terminated_at, it is always zero).
type Statement struct {
	AccountID     string           `json:"account_id"`
	Month         string           `json:"month"` // "2026-10"
	From          time.Time        `json:"from"`  // the month's first instant, UTC
	To            time.Time        `json:"to"`    // the next month's first instant (excluded)
	Currency      string           `json:"currency"`
	MinorUnits    int              `json:"minor_units"`
	OpeningMicros int64            `json:"opening_balance_micros"`
	Opening       string           `json:"opening_balance"`
	Credits       []Credit         `json:"credits"`
	CreditsMicros int64            `json:"credits_total_micros"`
	CreditsTotal  string           `json:"credits_total"`
	Lines         []StatementLine  `json:"usage_lines"` // by size, then unit price
	UsageMicros   int64            `json:"usage_total_micros"`
	UsageTotal    string           `json:"usage_total"`
	Adjustments   []AdjustmentLine `json:"adjustments"`
	AdjustMicros  int64            `json:"adjustments_total_micros"`
	AdjustTotal   string           `json:"adjustments_total"`
	Holds         []Hold           `json:"holds"` // open at To (or GeneratedAt)
	HoldsMicros   int64            `json:"holds_total_micros"`
	HoldsTotal    string           `json:"holds_total"`
	ClosingMicros int64            `json:"closing_balance_micros"`
	Closing       string           `json:"closing_balance"`
	AvailMicros   int64            `json:"available_micros"` // Closing − Holds
	Available     string           `json:"available"`
	UnexplMicros  int64            `json:"unexplained_micros"`
	Unexplained   string           `json:"unexplained"`
	GeneratedAt   time.Time        `json:"generated_at"`
	Complete      bool             `json:"complete"` // false until the month is over and its usage all in the ledger
	// FundsIncluded is false when the statement was built without a
	// FundsReader: only the usage lines and adjustments are filled.
	FundsIncluded bool `json:"funds_included"`
}

// ParseMonth returns the first instant (UTC) of a month written "2026-10".
func ParseMonth(s string) (time.Time, error) {
	t, err := time.Parse("2006-01", s)
	if err != nil {
		return time.Time{}, fmt.Errorf("month %q: want YYYY-MM", s)
	}
	return t.UTC(), nil
}

// MonthOf returns the first instant (UTC) of the calendar month of t.
func MonthOf(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// UsageFiler reports whether every usage entry an account files before t
// is in the ledger at now. [Billing] is one; a [FundsReader] that is one
// makes a statement complete only once its month's usage is all in.
type UsageFiler interface {
	UsageFiledBefore(ctx context.Context, acct string, t, now time.Time) (bool, error)
}

// BuildStatement builds acct's statement of the month starting at month
// (see [MonthOf]), reading the ledger through sc and funds through fr; now
// is when it is generated. Usage in a currency other than the funds' is an
// error: one statement has one currency. A nil fr builds the usage part
// alone: FundsIncluded is false and the balances, credits and holds are
// zero.
func BuildStatement(ctx context.Context, sc Scanner, fr FundsReader, acct string, month, now time.Time) (Statement, error) {
	from := MonthOf(month)
	to := from.AddDate(0, 1, 0)
	st := Statement{AccountID: acct, Month: from.Format("2006-01"), From: from, To: to,
		GeneratedAt: now.UTC(), FundsIncluded: fr != nil}
	closingAt := to
	if now.Before(to) {
		closingAt = now.UTC()
	}
	// The month's last accrual periods are written AccrualGrace after it
	// ends, and only by a billing pass; until they are in, the statement
	// is not final.
	if !now.Before(to.Add(AccrualGrace)) {
		st.Complete = true
		if uf, ok := fr.(UsageFiler); ok {
			var err error
			if st.Complete, err = uf.UsageFiledBefore(ctx, acct, to, now); err != nil {
				return Statement{}, fmt.Errorf("statement %s %s: %w", acct, st.Month, err)
			}
		}
	}
	if fr != nil {
		var err error
		if st.OpeningMicros, st.Currency, err = fr.BalanceAt(ctx, acct, from); err != nil {
			return Statement{}, fmt.Errorf("statement %s %s: opening balance: %w", acct, st.Month, err)
		}
		var cur string
		if st.ClosingMicros, cur, err = fr.BalanceAt(ctx, acct, closingAt); err != nil {
			return Statement{}, fmt.Errorf("statement %s %s: closing balance: %w", acct, st.Month, err)
		}
		if st.Currency == "" {
			st.Currency = cur
		}
		if st.Credits, err = fr.Credits(ctx, acct, from, closingAt); err != nil {
			return Statement{}, fmt.Errorf("statement %s %s: credits: %w", acct, st.Month, err)
		}
		if st.Holds, err = fr.HoldsAt(ctx, acct, closingAt); err != nil {
			return Statement{}, fmt.Errorf("statement %s %s: holds: %w", acct, st.Month, err)
		}
	}
	type lineKey struct {
		size  string
		price int64
	}
	lines := map[lineKey]*StatementLine{}
	counted := map[lineKey]map[string]bool{} // a workspace's interim entries count it once
	err := sc.Scan(ctx, acct, from, closingAt, func(e UsageEntry) error {
		// A workspace admitted without a price is in NoCurrency, at 0: it
		// fits any statement.
		free := e.Currency == NoCurrency && e.AmountMicros == 0
		if st.Currency == "" && !free {
			st.Currency = e.Currency
		}
		if !free && !strings.EqualFold(e.Currency, st.Currency) {
			return fmt.Errorf("ledger entry %s is in %s, the account's funds in %s", e.ID, e.Currency, st.Currency)
		}
		if e.Kind == KindAdjustment {
			st.Adjustments = append(st.Adjustments, AdjustmentLine{ID: e.ID, Corrects: e.Corrects,
				TerminatedAt: exportTime(e.TerminatedAt), AmountMicros: e.AmountMicros, Reason: e.Reason, Actor: e.Actor})
			st.AdjustMicros += e.AmountMicros
			return nil
		}
		k := lineKey{e.Size, e.UnitPriceMicros}
		l := lines[k]
		if l == nil {
			l = &StatementLine{Size: e.Size, UnitPriceMicros: e.UnitPriceMicros}
			lines[k] = l
		}
		if counted[k] == nil {
			counted[k] = map[string]bool{}
		}
		if !counted[k][e.WorkspaceID] {
			counted[k][e.WorkspaceID] = true
			l.Workspaces++
		}
		l.Seconds += e.Seconds
		l.EgressBytesOut += e.EgressBytesOut
		l.EgressBytesIn += e.EgressBytesIn
		l.AmountMicros += e.AmountMicros
		st.UsageMicros += e.AmountMicros
		return nil
	})
	if err != nil {
		return Statement{}, fmt.Errorf("statement %s %s: usage: %w", acct, st.Month, err)
	}
	cu := st.Currency
	st.MinorUnits = MinorUnits(cu)
	for _, l := range lines {
		l.UnitPrice, l.Amount = FormatMicros(l.UnitPriceMicros), FormatMinor(l.AmountMicros, cu)
		st.Lines = append(st.Lines, *l)
	}
	slices.SortFunc(st.Lines, func(a, b StatementLine) int {
		return cmp.Or(strings.Compare(a.Size, b.Size), cmp.Compare(a.UnitPriceMicros, b.UnitPriceMicros))
	})
	for i := range st.Adjustments {
		st.Adjustments[i].Amount = FormatMinor(st.Adjustments[i].AmountMicros, cu)
	}
	for i := range st.Credits {
		st.Credits[i].Amount = FormatMinor(st.Credits[i].AmountMicros, cu)
		st.CreditsMicros += st.Credits[i].AmountMicros
	}
	for i := range st.Holds {
		st.Holds[i].Amount = FormatMinor(st.Holds[i].AmountMicros, cu)
		st.HoldsMicros += st.Holds[i].AmountMicros
	}
	// Empty lists render as [], not null.
	st.Lines, st.Adjustments = nonNil(st.Lines), nonNil(st.Adjustments)
	st.Credits, st.Holds = nonNil(st.Credits), nonNil(st.Holds)
	st.AvailMicros = st.ClosingMicros - st.HoldsMicros
	if fr != nil {
		st.UnexplMicros = st.ClosingMicros - (st.OpeningMicros + st.CreditsMicros - st.UsageMicros - st.AdjustMicros)
	}
	st.Opening, st.Closing = FormatMinor(st.OpeningMicros, cu), FormatMinor(st.ClosingMicros, cu)
	st.CreditsTotal, st.UsageTotal = FormatMinor(st.CreditsMicros, cu), FormatMinor(st.UsageMicros, cu)
	st.AdjustTotal, st.HoldsTotal = FormatMinor(st.AdjustMicros, cu), FormatMinor(st.HoldsMicros, cu)
	st.Available, st.Unexplained = FormatMinor(st.AvailMicros, cu), FormatMinor(st.UnexplMicros, cu)
	return st, nil
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
