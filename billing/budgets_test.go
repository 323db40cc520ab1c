package billing_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/store"
)

// alertEntries counts the budget.alert entries of the audit log by
// threshold.
func alertEntries(t *testing.T, db *store.DB) map[int]int {
	t.Helper()
	out := map[int]int{}
	err := db.AuditRange(context.Background(), time.Time{}, time.Time{}, 0, func(b []byte) error {
		var e store.AuditEvent
		if err := json.Unmarshal(b, &e); err != nil {
			return err
		}
		if e.Action != "budget.alert" {
			return nil
		}
		var a billing.Alert
		if err := json.Unmarshal(e.After, &a); err != nil {
			return err
		}
		out[a.Threshold]++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAlertsWrittenOnce queues the 50, 80 and 100 % alerts of a soft
// budget and flushes them through what a flush meets: the audit log
// failing (the alerts stay queued, where they were dropped before), a
// flush that died between writing and taking them off the queue (written
// again, they are not duplicated), and flushes of several gateways at
// once. Each threshold ends up once in the audit log and once at the
// webhook, and the queue empty.
func TestAlertsWrittenOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, r := newAlertedEnv(t, "acct_o")
	rdb := e.db.Redis()
	queue := "sg:{acct_o}:alerts"
	queued := func() []string {
		t.Helper()
		q, err := rdb.LRange(ctx, queue, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	first := queued()
	if len(first) != 3 {
		t.Fatalf("queued alerts = %d; want 3 (50, 80, 100 %%)", len(first))
	}

	// The audit log cannot be written: nothing is lost.
	if err := rdb.Set(ctx, "sg:audit", "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	e.bill.FlushAlerts(ctx, "acct_o")
	if got := len(queued()); got != 3 {
		t.Fatalf("queued alerts after a flush whose audit write failed = %d; want 3", got)
	}
	if err := rdb.Del(ctx, "sg:audit").Err(); err != nil {
		t.Fatal(err)
	}
	e.bill.FlushAlerts(ctx, "acct_o")
	if got := queued(); len(got) != 0 {
		t.Fatalf("queued alerts after a flush = %d; want 0", len(got))
	}

	// A flush that wrote the alerts and died before dequeuing them: the
	// next one finds them queued still, and several gateways flush at once.
	for _, raw := range first {
		if err := rdb.RPush(ctx, queue, raw).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { e.bill.FlushAlerts(ctx, "acct_o") })
	}
	wg.Wait()
	if got := queued(); len(got) != 0 {
		t.Errorf("queued alerts after the concurrent flushes = %d; want 0", len(got))
	}
	if got := alertEntries(t, e.db); len(got) != 3 || got[50] != 1 || got[80] != 1 || got[100] != 1 {
		t.Errorf("budget.alert audit entries by threshold = %v; want 50, 80 and 100 once each", got)
	}
	e.runWebhooks()
	waitEvents(t, r, 3)
	time.Sleep(300 * time.Millisecond) // room for a duplicate delivery to show up
	if got := r.delivered(); len(got) != 3 {
		t.Errorf("%d webhook events delivered; want 3", len(got))
	}
}

// TestChargeSentTwiceFlushesAlerts: an accrual whose charge script is
// sent twice (the first answer lost) is answered by the second run,
// which appends nothing; the alerts the first run queued are still
// flushed, not left in the queue until some later alert.
func TestChargeSentTwiceFlushesAlerts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const acct = "acct_twice"
	e.account(acct, 10, false)
	e.credit(acct, 10_000_000, "c")
	if err := e.bill.SetBudget(ctx, acct, billing.Budget{MonthlyMicros: 50_000, Soft: true}); err != nil {
		t.Fatal(err)
	}
	// Admitted in March; its April hours cross April's thresholds.
	e.clock.Advance(time.Date(2026, 3, 31, 22, 30, 0, 0, time.UTC).Sub(e.clock.Now()))
	if _, err := e.acquire(acct, "inst_1", "", 4*time.Hour); err != nil {
		t.Fatal(err)
	}
	e.bill.FlushAlerts(ctx, acct) // the admission's March alerts
	march := alertEntries(t, e.db)
	e.db.Redis().AddHook(redistest.ScriptHook(resendScripts))
	e.clock.Advance(3 * time.Hour)
	if _, err := e.bill.Accrue(ctx, acct, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if q, err := e.db.Redis().LLen(ctx, "sg:{"+acct+"}:alerts").Result(); err != nil || q != 0 {
		t.Errorf("alerts left queued after the accrual = %d, %v; want 0", q, err)
	}
	after := alertEntries(t, e.db)
	if after[50] <= march[50] {
		t.Errorf("budget.alert entries by threshold: %v after the accrual, %v before; want April's 50 %% written", after, march)
	}
}
