package billing_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/termination"
)

// TestWatchDrift: the leader's periodic reconciliation reports the
// accounts with drift as a gauge, and counts its passes by outcome; the
// gauge follows a repair, and a gateway that does not lead reports none.
func TestWatchDrift(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reader := sdkmetric.NewManualReader()
	bill := billing.New(billing.Config{Meter: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test")}, billing.Deps{DB: e.db, Clock: e.clock})
	for _, id := range []string{"acct_w", "acct_ok"} {
		if err := e.db.CreateAccount(ctx, sandgate.Account{ID: id, Name: id, CreatedAt: e.clock.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	e.account("acct_w", 10, false)
	e.credit("acct_w", 10_000_000, "c")
	e.account("acct_ok", 10, false)
	w, err := e.acquire("acct_w", "inst_1", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	noSettle := termination.New(termination.Config{}, termination.Deps{DB: e.db, Clock: e.clock}) // a crash between finish and settle
	if ok, err := noSettle.Terminate(ctx, w, sandgate.ReasonReleased); !ok || err != nil {
		t.Fatal(ok, err)
	}

	var leading atomic.Bool
	leading.Store(true)
	done := make(chan struct{})
	go func() { defer close(done); bill.WatchDrift(ctx, 10*time.Millisecond, leading.Load) }()
	read := func() (drift int64, found bool, passes map[string]int64) {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		passes = map[string]int64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch d := m.Data.(type) {
				case metricdata.Gauge[int64]:
					if m.Name == billing.MetricDriftAccounts && len(d.DataPoints) == 1 {
						drift, found = d.DataPoints[0].Value, true
					}
				case metricdata.Sum[int64]:
					if m.Name == billing.MetricReconcilePasses {
						for _, p := range d.DataPoints {
							o, _ := p.Attributes.Value("outcome")
							passes[o.AsString()] = p.Value
						}
					}
				}
			}
		}
		return drift, found, passes
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				d, f, p := read()
				t.Fatalf("timed out waiting for %s: drift %d (reported %v), passes %v", what, d, f, p)
			}
		}
	}
	waitUntil("one account with drift", func() bool { d, f, p := read(); return f && d == 1 && p["drift"] > 0 })
	if n, err := bill.SettleDangling(ctx, "acct_w"); n != 1 || err != nil {
		t.Fatalf("SettleDangling = %d, %v", n, err)
	}
	waitUntil("no drift after the repair", func() bool { d, f, p := read(); return f && d == 0 && p["ok"] > 0 })
	leading.Store(false)
	waitUntil("no gauge off the leader", func() bool { _, f, _ := read(); return !f })
	cancel()
	<-done
}
