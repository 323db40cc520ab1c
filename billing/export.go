package billing

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Usage exports for finance: every ledger entry of a time range as CSV or
// JSON lines, written as the ledger is read (constant memory), and
// summaries grouped by account, instance, agent, size or day. The README's
// "For finance teams" section is the reader's guide to both.

// Format is the encoding of a usage export.
type Format string

// Export formats.
const (
	FormatCSV   Format = "csv"   // RFC 4180: a header row of [Columns], CRLF line ends
	FormatJSONL Format = "jsonl" // one [ExportRow] JSON object per line, LF line ends
)

// ParseFormat returns the Format named s ("csv" or "jsonl").
func ParseFormat(s string) (Format, error) {
	switch f := Format(s); f {
	case FormatCSV, FormatJSONL:
		return f, nil
	}
	return "", fmt.Errorf("export format %q: want csv or jsonl", s)
}

// ContentType is the media type of an export in format f.
func (f Format) ContentType() string {
	if f == FormatCSV {
		return "text/csv; charset=utf-8; header=present"
	}
	return "application/x-ndjson"
}

// Columns is the CSV header row of a usage export, in order. Each column is
// the [ExportRow] field of the same JSON name. Never reorder or rename a
// column: spreadsheets and finance scripts address them by position.
var Columns = []string{
	"id", "kind", "final", "account_id", "instance_id", "workspace_id", "agent", "run_id",
	"size", "image", "provider", "rate_card", "rate_card_version", "currency",
	"unit_price", "unit_price_micros", "seconds", "amount", "amount_micros",
	"started_at", "ended_at", "terminated_at", "termination_reason", "corrects",
	"egress_bytes_out", "egress_bytes_in", "reason", "actor",
}

// ExportRow is one line of a usage export: a [UsageEntry] plus its two
// amounts rendered as decimal strings. AmountMicros is the exact figure;
// Amount is the same at the currency's minor units (see [FormatMinor]), so
// totals are reconciled on AmountMicros and rounded once at the end.
type ExportRow struct {
	ID                string `json:"id"`
	Kind              string `json:"kind"`
	Final             bool   `json:"final"` // true: the workspace had ended; false: provisional, an interim entry of a running workspace (see [UsageEntry])
	AccountID         string `json:"account_id"`
	InstanceID        string `json:"instance_id"`
	WorkspaceID       string `json:"workspace_id"`
	Agent             string `json:"agent"`
	RunID             string `json:"run_id"`
	Size              string `json:"size"`
	Image             string `json:"image"`
	Provider          string `json:"provider"`
	RateCard          string `json:"rate_card"`
	RateCardVersion   int    `json:"rate_card_version"`
	Currency          string `json:"currency"`
	UnitPrice         string `json:"unit_price"`        // per second, exact: FormatMicros
	UnitPriceMicros   int64  `json:"unit_price_micros"` // per second
	Seconds           int64  `json:"seconds"`
	Amount            string `json:"amount"`        // FormatMinor: minor units, rounded half away from zero
	AmountMicros      int64  `json:"amount_micros"` // exact; negative for a refunding adjustment
	StartedAt         string `json:"started_at"`    // exportTime, "" when unknown
	EndedAt           string `json:"ended_at"`
	TerminatedAt      string `json:"terminated_at"` // what From and To select on
	TerminationReason string `json:"termination_reason"`
	Corrects          string `json:"corrects"`
	EgressBytesOut    int64  `json:"egress_bytes_out"` // through the broker's egress proxy, on the final entry
	EgressBytesIn     int64  `json:"egress_bytes_in"`
	Reason            string `json:"reason"` // an adjustment's reason; "" on usage rows
	Actor             string `json:"actor"`  // the operator who made the adjustment (name:prefix); "" on usage rows
}

// NewExportRow renders e as an export row.
func NewExportRow(e UsageEntry) ExportRow {
	return ExportRow{
		ID: e.ID, Kind: e.Kind, Final: e.Final, AccountID: e.AccountID, InstanceID: e.InstanceID,
		WorkspaceID: e.WorkspaceID, Agent: e.Agent, RunID: e.RunID, Size: e.Size, Image: e.Image,
		Provider: e.Provider, RateCard: e.RateCard, RateCardVersion: e.RateCardVersion, Currency: e.Currency,
		UnitPrice: FormatMicros(e.UnitPriceMicros), UnitPriceMicros: e.UnitPriceMicros, Seconds: e.Seconds,
		Amount: FormatMinor(e.AmountMicros, e.Currency), AmountMicros: e.AmountMicros,
		StartedAt: exportTime(e.StartedAt), EndedAt: exportTime(e.EndedAt), TerminatedAt: exportTime(e.TerminatedAt),
		TerminationReason: e.TerminationReason, Corrects: e.Corrects,
		EgressBytesOut: e.EgressBytesOut, EgressBytesIn: e.EgressBytesIn, Reason: e.Reason, Actor: e.Actor,
	}
}

// exportLayout is how exports write times: RFC 3339 in UTC with exactly
// three fractional digits (the ledger keeps milliseconds), so the column
// sorts as text.
const exportLayout = "2006-01-02T15:04:05.000Z07:00"

func exportTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(exportLayout)
}

// ExportFilter selects the ledger entries of an export or a summary. A
// zero field matches everything.
type ExportFilter struct {
	// From and To select entries by termination time, half-open:
	// From <= terminated_at < To. A zero side is open.
	From, To   time.Time
	InstanceID string
	Agent      string
	Size       string // only entries of workspaces of this size (adjustments carry none)
}

func (f ExportFilter) match(e UsageEntry) bool {
	return (f.InstanceID == "" || e.InstanceID == f.InstanceID) && (f.Agent == "" || e.Agent == f.Agent) &&
		(f.Size == "" || e.Size == f.Size)
}

// Scanner reads an account's usage ledger; *[Ledger] is the one in use.
type Scanner interface {
	// Scan calls fn, in ledger order, for every entry of acct whose
	// TerminatedAt is in [from, to), holding one page of entries at a time.
	// fn's error stops the scan and is returned.
	Scan(ctx context.Context, acct string, from, to time.Time, fn func(UsageEntry) error) error
}

// scanAll scans the accounts in the order given, keeping the entries f matches.
func scanAll(ctx context.Context, sc Scanner, accounts []string, f ExportFilter, fn func(UsageEntry) error) error {
	for _, a := range accounts {
		err := sc.Scan(ctx, a, f.From, f.To, func(e UsageEntry) error {
			if !f.match(e) {
				return nil
			}
			return fn(e)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// ExportStats is what an export wrote.
type ExportStats struct {
	Rows int64
	// Totals is the sum of amount_micros of the rows per currency.
	Totals map[string]int64
}

// exportFlushRows is how many rows an export buffers before it flushes.
const exportFlushRows = 500

// flusher is an HTTP response (echo's, net/http's) that can push what it
// has buffered to the client.
type flusher interface{ Flush() }

// Export writes every ledger entry of the accounts (in the order given;
// callers pass them sorted by id) that f selects to w in format, one row at
// a time as the ledger is read: memory does not grow with the number of
// rows. Within an account rows are in ledger order, which is termination
// order. Every exportFlushRows rows it flushes its buffer and, when w has a
// Flush method, w. A CSV export always has its header row, even when no
// entry matches; a JSONL export of no entry is empty.
//
// When the scan fails midway, what was written so far has reached w;
// callers must treat the output as incomplete (the operator API drops the
// connection, the CLI keeps no file).
func Export(ctx context.Context, sc Scanner, accounts []string, f ExportFilter, format Format, w io.Writer) (ExportStats, error) {
	st := ExportStats{Totals: map[string]int64{}}
	bw := bufio.NewWriterSize(w, 64<<10)
	flush := func() error {
		// Nothing new to send: flushing w anyway would make net/http send
		// an implicit 200 behind its caller's back, and the caller's own
		// WriteHeader for an empty export would then be superfluous.
		if bw.Buffered() == 0 {
			return nil
		}
		if err := bw.Flush(); err != nil {
			return err
		}
		if fl, ok := w.(flusher); ok {
			fl.Flush()
		}
		return nil
	}
	// Each row is appended to row, reused: no allocation per row.
	var appendRow func([]byte, *UsageEntry) []byte
	switch format {
	case FormatCSV:
		var head []byte
		for i, c := range Columns {
			if i > 0 {
				head = append(head, ',')
			}
			head = appendCSVField(head, c)
		}
		if _, err := bw.Write(append(head, '\r', '\n')); err != nil {
			return st, err
		}
		appendRow = appendCSVRow
	case FormatJSONL:
		appendRow = appendJSONRow
	default:
		return st, fmt.Errorf("export format %q: want csv or jsonl", format)
	}
	row := make([]byte, 0, 1024)
	var cur string
	var total int64 // of cur: the totals map is written when the currency changes
	err := scanAll(ctx, sc, accounts, f, func(e UsageEntry) error {
		row = appendRow(row[:0], &e)
		if _, err := bw.Write(row); err != nil {
			return err
		}
		st.Rows++
		if e.Currency != cur {
			if st.Rows > 1 {
				st.Totals[cur] += total
			}
			cur, total = e.Currency, 0
		}
		total += e.AmountMicros
		if st.Rows%exportFlushRows == 0 {
			return flush()
		}
		return nil
	})
	if st.Rows > 0 {
		st.Totals[cur] += total
	}
	if err != nil {
		_ = flush()
		return st, err
	}
	return st, flush()
}

// GroupBy is what a usage summary groups entries by.
type GroupBy string

// Summary groupings. GroupDay is the UTC calendar day of terminated_at.
const (
	GroupAccount  GroupBy = "account"
	GroupInstance GroupBy = "instance"
	GroupAgent    GroupBy = "agent"
	GroupSize     GroupBy = "size"
	GroupDay      GroupBy = "day"
)

// ParseGroupBy returns the GroupBy named s.
func ParseGroupBy(s string) (GroupBy, error) {
	switch g := GroupBy(s); g {
	case GroupAccount, GroupInstance, GroupAgent, GroupSize, GroupDay:
		return g, nil
	}
	return "", fmt.Errorf("group_by %q: want account, instance, agent, size or day", s)
}

func (g GroupBy) key(e UsageEntry) string {
	switch g {
	case GroupAccount:
		return e.AccountID
	case GroupInstance:
		return e.InstanceID
	case GroupAgent:
		return e.Agent
	case GroupSize:
		return e.Size
	}
	return e.TerminatedAt.UTC().Format(time.DateOnly)
}

// SummaryRow totals the entries of one group in one currency.
type SummaryRow struct {
	Key          string // the account, instance, agent, size or day ("" for entries without an agent)
	Currency     string
	Entries      int64 // ledger entries, adjustments included
	Workspaces   int64 // final usage entries: workspaces that ended (interim entries are not counted)
	Seconds      int64 // metered seconds of the usage entries, interim ones included
	AmountMicros int64 // exact sum, adjustments included
}

// ErrTooManyGroups is returned by Summarize when the grouping has more
// than maxSummaryGroups groups; an export is the tool for that.
var ErrTooManyGroups = errors.New("usage summary: too many groups")

// maxSummaryGroups bounds a summary's memory: it holds one row per group.
const maxSummaryGroups = 100_000

// Summarize totals the entries f selects in the accounts by g and
// currency, sorted by key then currency. Its memory grows with the number
// of groups, not of entries; more than 100 000 groups is ErrTooManyGroups.
func Summarize(ctx context.Context, sc Scanner, accounts []string, f ExportFilter, g GroupBy) ([]SummaryRow, error) {
	type k struct{ key, cur string }
	groups := map[k]*SummaryRow{}
	err := scanAll(ctx, sc, accounts, f, func(e UsageEntry) error {
		id := k{g.key(e), e.Currency}
		r := groups[id]
		if r == nil {
			if len(groups) == maxSummaryGroups {
				return ErrTooManyGroups
			}
			r = &SummaryRow{Key: id.key, Currency: id.cur}
			groups[id] = r
		}
		r.Entries++
		if e.Kind == KindUsage {
			if e.Final {
				r.Workspaces++
			}
			r.Seconds += e.Seconds
		}
		r.AmountMicros += e.AmountMicros
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]SummaryRow, 0, len(groups))
	for _, r := range groups {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b SummaryRow) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), strings.Compare(a.Currency, b.Currency))
	})
	return out, nil
}

// minorUnits is the number of decimal digits of each currency's minor unit
// (ISO 4217) where it is not 2. A currency not listed has 2.
var minorUnits = map[string]int{
	"BIF": 0, "CLP": 0, "DJF": 0, "GNF": 0, "ISK": 0, "JPY": 0, "KMF": 0, "KRW": 0, "PYG": 0,
	"RWF": 0, "UGX": 0, "UYI": 0, "VND": 0, "VUV": 0, "XAF": 0, "XOF": 0, "XPF": 0,
	"BHD": 3, "IQD": 3, "JOD": 3, "KWD": 3, "LYD": 3, "OMR": 3, "TND": 3,
	"CLF": 4, "UYW": 4,
}

// MinorUnits returns the number of decimal digits of currency's minor unit:
// 2 for USD and EUR, 0 for JPY, 3 for KWD; 2 for a code it does not know.
func MinorUnits(currency string) int {
	if d, ok := minorUnits[strings.ToUpper(currency)]; ok {
		return d
	}
	return 2
}

// FormatMinor renders micro-units of currency as a decimal string with the
// currency's minor units: FormatMinor(1_234_567, "USD") = "1.23",
// FormatMinor(1_235_000, "USD") = "1.24", FormatMinor(1_500_000, "JPY") = "2".
// It rounds half away from zero (half up on the magnitude), so a refund
// renders as the negation of the charge it refunds. The rendering may lose
// up to half a minor unit; the exact figure is the micro-unit integer.
func FormatMinor(micros int64, currency string) string {
	return string(appendMinor(nil, micros, currency))
}

// FormatMicros renders micro-units exactly as a decimal string with six
// fractional digits: FormatMicros(150) = "0.000150". Unit prices (per
// second) are shown this way, since they are usually below a minor unit.
func FormatMicros(micros int64) string { return string(appendMicros(nil, micros)) }

// Interface guards
var _ Scanner = (*Ledger)(nil)
