package admin_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
)

// usageMonth is the month the usage tests export: October 2026.
var usageMonth = time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)

const monthQuery = "from=2026-10-01T00:00:00Z&to=2026-11-01T00:00:00Z"

// seedUsage appends n usage entries of inst (of acct) terminated in
// usageMonth, agents alternating "coder" and "", and returns their total.
func (e *env) seedUsage(acct, inst string, n int) int64 {
	e.t.Helper()
	l := billing.NewLedger(e.db.Redis())
	var total int64
	for i := range n {
		end := usageMonth.Add(time.Duration(i) * time.Minute)
		ws := fmt.Sprintf("ws_%s_%d", inst, i)
		en := billing.UsageEntry{ID: billing.FinalID(ws), Kind: billing.KindUsage, Final: true,
			AccountID: acct, InstanceID: inst, WorkspaceID: ws, Agent: []string{"coder", ""}[i%2],
			Size: []string{"small", "large"}[i%2], Currency: "USD", UnitPriceMicros: 123, Seconds: int64(i + 1),
			AmountMicros: 123 * int64(i+1), StartedAt: end.Add(-time.Duration(i+1) * time.Second), EndedAt: end,
			TerminatedAt: end, TerminationReason: "released"}
		if _, err := l.Append(context.Background(), en); err != nil {
			e.t.Fatal(err)
		}
		total += en.AmountMicros
	}
	return total
}

// export streams GET path with tok and returns the body.
func (e *env) export(tok, path string) ([]byte, error) {
	e.t.Helper()
	var buf bytes.Buffer
	err := e.client(tok).Stream(context.Background(), path, &buf)
	return buf.Bytes(), err
}

func sumCSV(t *testing.T, b []byte) (rows int, micros int64) {
	t.Helper()
	recs, err := csv.NewReader(bytes.NewReader(b)).ReadAll()
	if err != nil {
		t.Fatalf("encoding/csv cannot read the export: %v", err)
	}
	if len(recs) == 0 || !slices.Equal(recs[0], billing.Columns) {
		t.Fatalf("export header = %q; want %q", recs, billing.Columns)
	}
	col := slices.Index(billing.Columns, "amount_micros")
	for _, r := range recs[1:] {
		m, err := strconv.ParseInt(r[col], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		micros += m
	}
	return len(recs) - 1, micros
}

func TestUsageExportFiltersAndRoles(t *testing.T) {
	e := newEnv(t)
	a1, a2 := e.account(), e.account()
	i1, i2 := e.instance(a1), e.instance(a2)
	t1, t2 := e.seedUsage(a1, i1, 40), e.seedUsage(a2, i2, 30)

	b, err := e.export(financeToken, "/usage?"+monthQuery)
	if err != nil {
		t.Fatal(err)
	}
	if n, sum := sumCSV(t, b); n != 70 || sum != t1+t2 {
		t.Errorf("export of every account: %d rows, %d micros; want 70, %d", n, sum, t1+t2)
	}
	b, err = e.export(adminToken, "/usage?"+monthQuery+"&account="+a2)
	if err != nil {
		t.Fatal(err)
	}
	if n, sum := sumCSV(t, b); n != 30 || sum != t2 {
		t.Errorf("export of %s: %d rows, %d micros; want 30, %d", a2, n, sum, t2)
	}
	b, err = e.export(financeToken, "/usage?"+monthQuery+"&instance="+i1+"&agent=coder&format=jsonl")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != 20 {
		t.Fatalf("JSONL export of %s agent coder: %d lines; want 20", i1, len(lines))
	}
	for _, ln := range lines {
		var r billing.ExportRow
		if err := json.Unmarshal([]byte(ln), &r); err != nil || r.InstanceID != i1 || r.Agent != "coder" {
			t.Errorf("JSONL row %s: %+v, %v", ln, r, err)
		}
	}
	// Half-open range: to = the first entry's termination excludes it.
	b, err = e.export(financeToken, "/usage?from=2026-10-01T00:00:01Z&to=2026-10-01T00:05:00Z&account="+a1)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := sumCSV(t, b); n != 4 {
		t.Errorf("export of [00:00:01, 00:05:00): %d rows; want 4 (minutes 1 to 4)", n)
	}

	for _, tt := range []struct {
		tok, path string
		status    int
	}{
		{operatorToken, "/usage?" + monthQuery, 403},
		{financeToken, "/usage?from=yesterday", 400},
		{financeToken, "/usage?from=2026-11-01T00:00:00Z&to=2026-10-01T00:00:00Z", 400},
		{financeToken, "/usage?format=xlsx", 400},
		{financeToken, "/usage?account=acct_nope", 404},
		{financeToken, "/usage?instance=inst_nope", 404},
		{financeToken, "/usage?account=" + a1 + "&instance=" + i2, 404},
		{financeToken, "/usage/summary?group_by=planet", 400},
		{operatorToken, "/usage/summary?group_by=size", 403},
		{operatorToken, "/accounts/" + a1 + "/statement", 403},
		{financeToken, "/accounts/" + a1 + "/statement?month=October", 400},
		{financeToken, "/accounts/acct_nope/statement", 404},
	} {
		if st, _ := e.refused(tt.tok, http.MethodGet, tt.path, nil); st != tt.status {
			t.Errorf("GET %s = %d; want %d", tt.path, st, tt.status)
		}
	}

	// Exports are audited, successful ones included.
	audit, err := e.export(adminToken, "/audit")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(audit), `"action":"usage.export"`); got < 5 {
		t.Errorf("audit log has %d usage.export entries; want every export (at least 5)", got)
	}
}

func TestUsageSummaryAndStatementMatchTheExport(t *testing.T) {
	e := newEnv(t)
	e.clock.mu.Lock()
	e.clock.t = usageMonth.AddDate(0, 1, 14) // 2026-11-15
	e.clock.mu.Unlock()
	a := e.account()
	in := e.instance(a)
	total := e.seedUsage(a, in, 25)

	var sum adminapi.UsageSummary
	e.do(financeToken, http.MethodGet, "/usage/summary?group_by=size&"+monthQuery, nil, &sum)
	var got int64
	for _, g := range sum.Groups {
		got += g.AmountMicros
	}
	if len(sum.Groups) != 2 || sum.Groups[0].Key != "large" || got != total {
		t.Errorf("summary by size = %+v; want large and small totalling %d", sum.Groups, total)
	}
	// The range it answers is the one it read, fractions of a second kept.
	var frac adminapi.UsageSummary
	e.do(financeToken, http.MethodGet, "/usage/summary?group_by=size&from=2026-10-01T00:00:00.5Z&to=2026-11-01T00:00:00.25Z", nil, &frac)
	if frac.From != "2026-10-01T00:00:00.5Z" || frac.To != "2026-11-01T00:00:00.25Z" {
		t.Errorf("summary of a range with fractions of a second says [%s, %s); want [2026-10-01T00:00:00.5Z, 2026-11-01T00:00:00.25Z)", frac.From, frac.To)
	}

	e.do(adminToken, http.MethodPut, "/accounts/"+a+"/billing", adminapi.BillingSettings{Currency: "USD"}, nil)
	e.do(adminToken, http.MethodPost, "/accounts/"+a+"/funds/credit",
		adminapi.FundsRequest{Amount: "100.00", Reason: "top-up", IdempotencyKey: "k1"}, nil)
	var st billing.Statement
	e.do(financeToken, http.MethodGet, "/accounts/"+a+"/statement?month=2026-10", nil, &st)
	if st.UsageMicros != total || st.Month != "2026-10" || !st.FundsIncluded || len(st.Lines) != 2 || st.Currency != "USD" {
		t.Errorf("statement = usage %d, month %s, funds %v, %d lines, %s; want %d, 2026-10, true, 2, USD",
			st.UsageMicros, st.Month, st.FundsIncluded, len(st.Lines), st.Currency, total)
	}
	// The credit is posted in November: October's funds are its usage
	// alone, and nothing is unexplained.
	if st.OpeningMicros != 0 || st.ClosingMicros != -total || st.UnexplMicros != 0 {
		t.Errorf("statement opening %d closing %d unexplained %d; want 0, %d, 0", st.OpeningMicros, st.ClosingMicros, st.UnexplMicros, -total)
	}
	e.clock.Add(time.Second) // the credit was posted at the clock's now; statements are half-open
	var now billing.Statement
	e.do(financeToken, http.MethodGet, "/accounts/"+a+"/statement", nil, &now)
	if now.CreditsMicros != 100_000_000 || now.OpeningMicros != -total || now.Complete || now.UnexplMicros != 0 {
		t.Errorf("this month's statement: credits %d opening %d complete %v unexplained %d; want 100000000, %d, false, 0",
			now.CreditsMicros, now.OpeningMicros, now.Complete, now.UnexplMicros, -total)
	}
	if st.UsageTotal != billing.FormatMinor(total, "USD") {
		t.Errorf("statement usage_total = %q; want %q", st.UsageTotal, billing.FormatMinor(total, "USD"))
	}
}

// A ledger that cannot be read past the first pages cuts the transfer:
// the client sees an error, never a short export that looks whole.
func TestUsageExportFailureMidwayBreaksTheTransfer(t *testing.T) {
	e := newEnv(t)
	a := e.account()
	in := e.instance(a)
	e.seedUsage(a, in, 1200)
	// An entry the ledger cannot decode, after the first 1200.
	if err := e.db.Redis().XAdd(context.Background(), &redis.XAddArgs{Stream: "sg:{" + a + "}:usage", ID: "*", Values: []string{"e", "not json"}}).Err(); err != nil {
		t.Fatal(err)
	}
	b, err := e.export(financeToken, "/usage?"+monthQuery)
	if err == nil {
		t.Fatalf("export over a broken ledger succeeded with %d bytes; want a broken transfer", len(b))
	}
	if len(b) == 0 {
		t.Errorf("no row reached the client before the failure; the test does not cover a failure midway")
	}
}
