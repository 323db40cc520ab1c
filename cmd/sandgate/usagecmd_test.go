package main

import (
	"strings"
	"testing"

	"github.com/sandgate/sandgate/adminapi"
)

// TestSummaryTableShowsThePool checks that `sandgate usage summary` prints
// the warm pools' lines apart from the account groups, priced when a rate
// card priced them and without an amount when none did.
func TestSummaryTableShowsThePool(t *testing.T) {
	sum := adminapi.UsageSummary{
		GroupBy: "account", From: "2026-12-01T00:00:00Z", To: "2027-01-01T00:00:00Z",
		Groups: []adminapi.SummaryGroup{{Key: "acct_1", Currency: "USD", Entries: 2, Workspaces: 2, Seconds: 25, AmountMicros: 25_000}},
		Pool: []adminapi.PoolLine{
			{Provider: "local", Size: "small", Image: "host", Seconds: 50, RateCard: "dev", Currency: "USD", AmountMicros: 50_000},
			{Provider: "fly", Size: "large", Image: "img", Seconds: 7},
		},
	}
	out := summaryTable(sum)
	groups, pool, ok := strings.Cut(out, "warm pool (billed to no account):")
	if !ok {
		t.Fatalf("no warm pool part in:\n%s", out)
	}
	if !strings.Contains(groups, "acct_1") || strings.Contains(groups, "local") {
		t.Errorf("the groups part should hold the account and no pool line:\n%s", groups)
	}
	for _, want := range [][]string{{"local", "small", "host", "50", "0.05 USD"}, {"fly", "large", "img", "7", "-"}} {
		found := false
		for _, line := range strings.Split(pool, "\n") {
			if f := strings.Fields(line); len(f) >= len(want) && strings.Join(f[:3], " ") == strings.Join(want[:3], " ") {
				found = strings.Join(f, " ") == strings.Join(want, " ")
				if !found {
					t.Errorf("pool line %q, want %q", strings.Join(f, " "), strings.Join(want, " "))
				}
			}
		}
		if !found {
			t.Errorf("no pool line for %v in:\n%s", want[:3], pool)
		}
	}
	if out := summaryTable(adminapi.UsageSummary{GroupBy: "account"}); strings.Contains(out, "warm pool") {
		t.Errorf("a summary without pool time prints a pool part:\n%s", out)
	}
}
