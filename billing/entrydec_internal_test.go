package billing

import (
	"encoding/json"
	"math"
	"reflect"
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
