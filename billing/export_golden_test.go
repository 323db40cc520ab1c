package billing_test

import (
	"bytes"
	"context"
	"flag"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/redistest"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden export files in testdata")

// goldenEntries are ledger entries whose fields exercise every encoding
// rule of the two formats: quoting in CSV (commas, quotes, line breaks, a
// leading space), escaping in JSON (quotes, backslashes, control
// characters, <>&, U+2028, non-ASCII), negative and extreme amounts,
// currencies of 0, 2, 3 and 4 minor digits, and unknown times.
func goldenEntries() []billing.UsageEntry {
	t0 := time.Date(2026, 10, 3, 4, 5, 6, 789_000_000, time.UTC)
	base := billing.UsageEntry{Kind: billing.KindUsage, Final: true, AccountID: "acct_golden", InstanceID: "inst_a",
		Agent: "coder", RunID: "run-1", Size: "small", Image: "python:3.12", Provider: "local", RateCard: "standard",
		RateCardVersion: 3, Currency: "USD", UnitPriceMicros: 97, Seconds: 3600, AmountMicros: 97 * 3600,
		StartedAt: t0.Add(-time.Hour), EndedAt: t0, TerminatedAt: t0, TerminationReason: "released"}
	var out []billing.UsageEntry
	add := func(id string, f func(e *billing.UsageEntry)) {
		e := base
		e.ID, e.WorkspaceID = id, id[:len(id)-len(":final")]
		f(&e)
		out = append(out, e)
		base.TerminatedAt = base.TerminatedAt.Add(time.Minute)
		base.EndedAt = base.TerminatedAt
	}
	add("ws_plain:final", func(e *billing.UsageEntry) {})
	add("ws_egress:final", func(e *billing.UsageEntry) { e.EgressBytesOut = 12345; e.EgressBytesIn = 9223372036854775807 })
	add("ws_comma:final", func(e *billing.UsageEntry) { e.Agent = "a,b"; e.RunID = `say "hi"` })
	add("ws_lines:final", func(e *billing.UsageEntry) { e.Agent = "line\nbreak"; e.RunID = "cr\rlf\r\n" })
	add("ws_space:final", func(e *billing.UsageEntry) { e.Agent = " leading"; e.RunID = "\ttab"; e.Image = "" })
	add("ws_escape:final", func(e *billing.UsageEntry) {
		e.Agent = `back\slash <b>&amp;`
		e.RunID = "ctl\x01\x1f\b\f"
		e.Image = "sep\u2028para\u2029 é 漢字 😀"
	})
	add("ws_quote1:final", func(e *billing.UsageEntry) { e.Agent = `\.`; e.RunID = `"` })
	add("ws_jpy:final", func(e *billing.UsageEntry) {
		e.Currency, e.UnitPriceMicros, e.Seconds, e.AmountMicros = "JPY", 1_500_000, 1, 1_500_000
	})
	add("ws_kwd:final", func(e *billing.UsageEntry) {
		e.Currency, e.UnitPriceMicros, e.Seconds, e.AmountMicros = "KWD", 1_234_500, 1, 1_234_500
	})
	add("ws_clf:final", func(e *billing.UsageEntry) { e.Currency, e.AmountMicros = "CLF", 123 })
	add("ws_max:final", func(e *billing.UsageEntry) {
		e.UnitPriceMicros, e.Seconds, e.AmountMicros = math.MaxInt64, 1, math.MaxInt64
	})
	add("ws_min:final", func(e *billing.UsageEntry) {
		e.Kind, e.Final, e.Corrects, e.AmountMicros, e.Seconds = billing.KindAdjustment, false, "ws_max:final", math.MinInt64, 0
		e.UnitPriceMicros, e.RateCard, e.RateCardVersion, e.Size = -7, "", 0, ""
		e.Reason, e.Actor = `double charge, see "INC-7"`, "alice:sgop_ab12"
	})
	add("ws_interim:final", func(e *billing.UsageEntry) {
		e.ID, e.Final = "ws_interim:1791000000", false
		e.StartedAt, e.TerminationReason = time.Time{}, ""
	})
	add("ws_ms:final", func(e *billing.UsageEntry) {
		e.StartedAt = time.Date(2026, 10, 9, 0, 0, 0, 1_000_000, time.UTC)
		e.EndedAt = time.Date(2026, 10, 9, 0, 0, 0, 0, time.UTC)
	})
	return out
}

// TestExportGolden checks both formats byte for byte against the files in
// testdata, written by the export before rows were encoded by hand: an
// export's bytes are a contract with finance tooling. Run with -update to
// rewrite them (and review the diff).
func TestExportGolden(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	l := billing.NewLedger(rdb)
	for _, e := range goldenEntries() {
		if ok, err := l.Append(ctx, e); err != nil || !ok {
			t.Fatalf("Append %s = %v, %v", e.ID, ok, err)
		}
	}
	for _, f := range []billing.Format{billing.FormatCSV, billing.FormatJSONL} {
		var buf bytes.Buffer
		st, err := billing.Export(ctx, l, []string{"acct_golden"}, billing.ExportFilter{}, f, &buf)
		if err != nil {
			t.Fatalf("Export %s: %v", f, err)
		}
		if st.Rows != int64(len(goldenEntries())) {
			t.Errorf("Export %s rows = %d; want %d", f, st.Rows, len(goldenEntries()))
		}
		name := filepath.Join("testdata", "export."+string(f))
		if *updateGolden {
			if err := os.WriteFile(name, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), want) {
			t.Errorf("Export %s differs from %s:\n got %q\nwant %q", f, name, buf.Bytes(), want)
		}
	}
}
