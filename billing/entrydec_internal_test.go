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
		{ID: "adj:1", Kind: KindAdjustment, Agent: "quote \" backslash \\ line\n <&> é \u2028", AmountMicros: math.MaxInt64},
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
// encoding/csv and encoding/json of the documented ExportRow, on entries
// with every kind of character a field may hold.
func TestRowEncodersAsExportRow(t *testing.T) {
	var odd []string
	for r := rune(0); r < 0x80; r++ {
		odd = append(odd, "a"+string(r)+"b", string(r))
	}
	odd = append(odd, "", " x", "\u00a0x", "\u2028", "\u2029", "\xff", "a\xc3", "é漢😀", `\.`, "x\r\ny")
	for i, s := range odd {
		e := UsageEntry{ID: s, Kind: s, Agent: s, RunID: s, Image: s, Corrects: s, Currency: "USD",
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
			strconv.FormatInt(row.EgressBytesOut, 10), strconv.FormatInt(row.EgressBytesIn, 10)})
		cw.Flush()
		if got := appendCSVRow(nil, &e); !bytes.Equal(got, cb.Bytes()) {
			t.Errorf("CSV row of %q:\n got %q\nwant %q", s, got, cb.Bytes())
		}
	}
}
