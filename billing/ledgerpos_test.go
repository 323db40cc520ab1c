package billing_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/redistest"
)

// TestLedgerScanAfter walks the ledger by position: every entry once, in
// stream order, though an entry appended later is filed earlier; a bad
// message is returned with its error instead of stopping the walk; At
// reads one position.
func TestLedgerScanAfter(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	l := billing.NewLedger(rdb)
	t1 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	// e1 is filed an hour before e0 (an interim entry appended late).
	for i, at := range []time.Time{t1, t1.Add(-time.Hour), t1.Add(time.Minute)} {
		e := billing.UsageEntry{ID: fmt.Sprintf("e%d", i), Kind: billing.KindUsage, AccountID: "acct_p", Currency: "USD", TerminatedAt: at}
		if _, err := l.Append(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "sg:{acct_p}:usage", Values: []any{"e", "{not json"}}).Err(); err != nil {
		t.Fatal(err)
	}
	var got []string
	after := ""
	for {
		ps, err := l.ScanAfter(ctx, "acct_p", after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) == 0 {
			break
		}
		for _, p := range ps {
			id := p.Entry.ID
			if p.Err != nil {
				id = "bad"
			}
			got = append(got, id)
			after = p.StreamID
		}
	}
	if want := "[e0 e1 e2 bad]"; fmt.Sprint(got) != want {
		t.Fatalf("ScanAfter pages = %v; want %s", got, want)
	}
	first, err := l.ScanAfter(ctx, "acct_p", "", 1)
	if err != nil || len(first) != 1 {
		t.Fatalf("ScanAfter(\"\", 1) = %v, %v", first, err)
	}
	p, ok, err := l.At(ctx, "acct_p", first[0].StreamID)
	if err != nil || !ok || p.Entry.ID != "e0" {
		t.Fatalf("At(%s) = %+v, %v, %v; want e0", first[0].StreamID, p, ok, err)
	}
	if _, ok, err := l.At(ctx, "acct_p", "1-1"); ok || err != nil {
		t.Fatalf("At(1-1) = %v, %v; want not found", ok, err)
	}
}
