package billing

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// TestParseEntryAsJSON checks the fast decoder against encoding/json on
// entries as json.Marshal writes them (old and new alike: the stored form
// did not change), and that it declines what it does not know.
func TestParseEntryAsJSON(t *testing.T) {
	t0 := time.Date(2026, 10, 3, 4, 5, 6, 789_000_000, time.UTC)
	entries := []UsageEntry{
		{},
		{ID: "ws_a:final", Kind: KindUsage, Final: true, AccountID: "acct_a", InstanceID: "inst_a", WorkspaceID: "ws_a",
			Agent: "coder", RunID: "r", Size: "small", Image: "python:3.12", Provider: "local", RateCard: "std",
			RateCardVersion: 3, Currency: "USD", UnitPriceMicros: 97, Seconds: 3600, AmountMicros: math.MinInt64,
			StartedAt: t0.Add(-time.Hour), EndedAt: t0, TerminatedAt: t0, TerminationReason: "released", Corrects: "x"},
		{ID: "adj:1", Kind: KindAdjustment, Reason: "double charge", Actor: "ops:sgop_ab12", Agent: "quote \" backslash \\ line\n <&> é \u2028", AmountMicros: math.MaxInt64},
	}
	for _, want := range entries {
		b, err := json.Marshal(want.normalized())
		if err != nil {
			t.Fatal(err)
		}
		var ref, got UsageEntry
		if err := json.Unmarshal(b, &ref); err != nil {
			t.Fatal(err)
		}
		if err := decodeEntryJSON(string(b), &got); err != nil || !reflect.DeepEqual(got, ref) {
			t.Errorf("decodeEntryJSON(%s) = %+v, %v; want %+v", b, got, err, ref)
		}
	}
	for _, s := range []string{`{"id":"a\"b"}`, `{"unknown":1}`, `{"seconds":1.5}`, `{"seconds":1e3}`, `[]`, `{"id":"a"} x`, `{"final":null}`} {
		var e UsageEntry
		if parseEntry(s, &e) {
			t.Errorf("parseEntry(%s) = true; want it to leave the entry to encoding/json", s)
		}
	}
}

// TestRowEncodersAsExportRow checks the hand-written encoders against
// encoding/csv and encoding/json of the documented ExportRow (in CSV, the
// reason as csvText makes it), on entries with every kind of character a
// field may hold.
func TestRowEncodersAsExportRow(t *testing.T) {
	var odd []string
	for r := rune(0); r < 0x80; r++ {
		odd = append(odd, "a"+string(r)+"b", string(r))
	}
	odd = append(odd, "", " x", "\u00a0x", "\u2028", "\u2029", "\xff", "a\xc3", "é漢😀", `\.`, "x\r\ny")
	for i, s := range odd {
		e := UsageEntry{ID: s, Kind: s, Agent: s, RunID: s, Image: s, Corrects: s, Reason: s, Actor: s, Currency: "USD",
			AmountMicros: int64(i) * -12345, UnitPriceMicros: int64(i), TerminatedAt: time.UnixMilli(int64(i) * 1_000_003).UTC(),
			EgressBytesOut: int64(i) * 1001, EgressBytesIn: int64(i) * 77}
		row := NewExportRow(e)
		var jb bytes.Buffer
		enc := json.NewEncoder(&jb)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(&row); err != nil {
			t.Fatal(err)
		}
		if got := appendJSONRow(nil, &e); !bytes.Equal(got, jb.Bytes()) {
			t.Errorf("JSONL row of %q:\n got %q\nwant %q", s, got, jb.Bytes())
		}
		var cb bytes.Buffer
		cw := csv.NewWriter(&cb)
		cw.UseCRLF = true
		cw.Write([]string{row.ID, row.Kind, strconv.FormatBool(row.Final), row.AccountID, row.InstanceID, row.WorkspaceID,
			row.Agent, row.RunID, row.Size, row.Image, row.Provider, row.RateCard, strconv.Itoa(row.RateCardVersion), row.Currency,
			row.UnitPrice, strconv.FormatInt(row.UnitPriceMicros, 10), strconv.FormatInt(row.Seconds, 10), row.Amount,
			strconv.FormatInt(row.AmountMicros, 10), row.StartedAt, row.EndedAt, row.TerminatedAt, row.TerminationReason, row.Corrects,
			strconv.FormatInt(row.EgressBytesOut, 10), strconv.FormatInt(row.EgressBytesIn, 10), csvText(row.Reason), row.Actor})
		cw.Flush()
		if got := appendCSVRow(nil, &e); !bytes.Equal(got, cb.Bytes()) {
			t.Errorf("CSV row of %q:\n got %q\nwant %q", s, got, cb.Bytes())
		}
	}
}

// BenchmarkRowCodec is the export's work per row without Redis: decode a
// stored entry (the benchmark's seeded form) and append its CSV and JSONL
// rows. BenchmarkExport measures it beside a raw XRANGE.
func BenchmarkRowCodec(b *testing.B) {
	end := time.Date(2026, 10, 3, 4, 5, 6, 789_000_000, time.UTC)
	e := UsageEntry{ID: "ws_c9vv7k8g:final", Kind: KindUsage, Final: true, AccountID: "acct_bench", InstanceID: "inst_bench3",
		WorkspaceID: "ws_c9vv7k8g", Agent: "coder", RunID: "3f1e2d4c-0000-4000-8000-000000000000", Size: "medium",
		Image: "python:3.12", Provider: "local", RateCard: "standard", RateCardVersion: 1, Currency: "USD",
		UnitPriceMicros: 389, Seconds: 1234, AmountMicros: 389 * 1234, StartedAt: end.Add(-1234 * time.Second),
		EndedAt: end, TerminatedAt: end, TerminationReason: "released"}
	j, err := json.Marshal(e)
	if err != nil {
		b.Fatal(err)
	}
	s := string(j)
	row := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		var got UsageEntry
		if err := decodeEntryJSON(s, &got); err != nil {
			b.Fatal(err)
		}
		row = appendCSVRow(row[:0], &got)
		row = appendJSONRow(row[:0], &got)
	}
}

// TestPlain checks the eight-bytes-at-a-time scan against the byte loop
// for every byte value at every offset of strings of several lengths.
func TestPlain(t *testing.T) {
	naive := func(v string) bool {
		for i := 0; i < len(v); i++ {
			if v[i] == '\\' || v[i] < 0x20 {
				return false
			}
		}
		return true
	}
	for _, n := range []int{1, 7, 8, 9, 16, 23} {
		for pos := 0; pos < n; pos++ {
			for c := 0; c < 256; c++ {
				b := bytes.Repeat([]byte{'a'}, n)
				b[pos] = byte(c)
				if pos > 0 {
					b[pos-1] = 0xff // a high byte beside it must not hide it
				}
				if got, want := plain(string(b)), naive(string(b)); got != want {
					t.Fatalf("plain(%q) = %v; want %v", b, got, want)
				}
			}
		}
	}
}

// TestAppendExportTime checks the digit-by-digit writer against
// AppendFormat of the export layout, years beyond four digits included.
func TestAppendExportTime(t *testing.T) {
	loc := time.FixedZone("x", -5*3600-30*60)
	times := []time.Time{
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(1, 2, 3, 4, 5, 6, 7_000_000, time.UTC),
		time.Date(999, 12, 31, 23, 59, 59, 999_999_999, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999_000_000, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 6, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 12, 1, 19, 0, 0, 120_000_000, loc),
	}
	for i := range 2000 {
		times = append(times, time.UnixMilli(int64(i)*1_234_567_891_3).UTC())
	}
	for _, tm := range times {
		if got, want := string(appendExportTime(nil, tm)), tm.UTC().Format(exportLayout); got != want {
			t.Errorf("appendExportTime(%v) = %q; want %q", tm, got, want)
		}
	}
}
