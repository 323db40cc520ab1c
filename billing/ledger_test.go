package billing_test

import (
	"context"
	"fmt"
	"strings"
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

// TestLedgerAppendOutOfOrder: an entry that terminated before the newest
// one already in the stream is appended at the newest one's time, so ids
// stay ordered and a scan from its own time still finds it.
func TestLedgerAppendOutOfOrder(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	l := billing.NewLedger(rdb)
	t1 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	t0 := t1.Add(-time.Hour)
	for i, at := range []time.Time{t1, t0, t0, t1.Add(time.Minute)} {
		e := billing.UsageEntry{ID: fmt.Sprintf("e%d", i), Kind: billing.KindUsage, AccountID: "acct_a", Currency: "USD", TerminatedAt: at}
		if ok, err := l.Append(ctx, e); err != nil || !ok {
			t.Fatalf("Append(%s) = %v, %v", e.ID, ok, err)
		}
	}
	msgs, err := rdb.XRange(ctx, "sg:{acct_a}:usage", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	wantMS := []int64{t1.UnixMilli(), t1.UnixMilli(), t1.UnixMilli(), t1.Add(time.Minute).UnixMilli()}
	if len(msgs) != len(wantMS) {
		t.Fatalf("stream holds %d entries; want %d", len(msgs), len(wantMS))
	}
	for i, m := range msgs {
		if !strings.HasPrefix(m.ID, fmt.Sprintf("%d-", wantMS[i])) {
			t.Errorf("entry %d has id %s; want its time %d", i, m.ID, wantMS[i])
		}
	}
	var got []string
	if err := l.Scan(ctx, "acct_a", t0, t0.Add(time.Minute), func(e billing.UsageEntry) error {
		got = append(got, e.ID)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[e1 e2]" {
		t.Errorf("Scan from the earlier time = %v; want [e1 e2]", got)
	}
}
