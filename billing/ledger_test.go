package billing_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/redistest"
)

func TestLedgerAppendOnceAndScanPages(t *testing.T) {
	ctx := context.Background()
	l := billing.NewLedger(redistest.Start(t).Client())
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	const n = 1203
	for i := range n {
		e := billing.UsageEntry{ID: billing.FinalID(fmt.Sprintf("ws_%d", i)), Kind: billing.KindUsage, Final: true,
			AccountID: "acct_a", WorkspaceID: fmt.Sprintf("ws_%d", i), Currency: "USD",
			TerminatedAt: base.Add(time.Duration(i) * time.Minute)}
		for range 2 {
			if _, err := l.Append(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
	}
	count := func(from, to time.Time) int {
		c := 0
		if err := l.Scan(ctx, "acct_a", from, to, func(billing.UsageEntry) error { c++; return nil }); err != nil {
			t.Fatal(err)
		}
		return c
	}
	if got := count(time.Time{}, time.Time{}); got != n {
		t.Fatalf("Scan(all) = %d entries, want %d (each once)", got, n)
	}
	if got := count(base.Add(10*time.Minute), base.Add(610*time.Minute)); got != 600 {
		t.Fatalf("Scan(range) = %d entries, want 600", got)
	}
}
