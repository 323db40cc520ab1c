package billing_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/store"
)

// poolBroker is one broker process's billing over a shared Redis.
func poolBroker(t *testing.T, srv *redistest.Server, clock *sgtest.Clock, card string) *billing.Billing {
	t.Helper()
	db := store.New(store.Config{}, srv.Client())
	return billing.New(billing.Config{PoolRateCard: card}, billing.Deps{DB: db, Clock: clock})
}

// The pools' time is recorded in Redis by hour: two brokers' meters sum,
// a restarted broker reads (and adds to) what the others wrote, lines are
// per provider, size and image, each priced at the pool card's version
// of its hour, and a range counts the hours that start in it.
func TestPoolUsage(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	t0 := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	clock := sgtest.NewClock(t0)
	a, b := poolBroker(t, srv, clock, "pool"), poolBroker(t, srv, clock, "pool")
	if _, err := a.CreateRateCard(ctx, "pool", "USD", flatPrices(100), t0.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	ma, mb := a.PoolMeter(), b.PoolMeter()
	small := func(provider string, warm time.Duration) billing.PoolTotal {
		return billing.PoolTotal{Provider: provider, Size: "small", Image: "host", Warm: warm}
	}
	// Broker a: 40s of one sandbox, then 2.5s more; broker b: 20s.
	must(t, ma.Record(ctx, t0.Add(10*time.Minute), []billing.PoolTotal{small("local", 40*time.Second)}))
	must(t, ma.Record(ctx, t0.Add(11*time.Minute), []billing.PoolTotal{small("local", 42500*time.Millisecond)}))
	must(t, mb.Record(ctx, t0.Add(12*time.Minute), []billing.PoolTotal{small("local", 20*time.Second),
		{Provider: "fly", Size: "large", Image: "img", Warm: 3 * time.Second}}))
	// A total that did not grow, or went down, adds nothing.
	must(t, ma.Record(ctx, t0.Add(13*time.Minute), []billing.PoolTotal{small("local", 42*time.Second)}))

	// A new card version prices the next hour only.
	clock.Set(t0.Add(30 * time.Minute))
	if _, err := a.CreateRateCard(ctx, "pool", "USD", flatPrices(1000), t0.Add(30*time.Minute)); err != nil {
		t.Fatal(err)
	}
	// A restarted broker a: a new meter whose totals start again at 0.
	restarted := poolBroker(t, srv, clock, "pool")
	must(t, restarted.PoolMeter().Record(ctx, t0.Add(time.Hour+time.Minute), []billing.PoolTotal{small("local", 7*time.Second)}))

	lines, err := restarted.PoolUsage(ctx, t0, t0.Add(2*time.Hour), "")
	must(t, err)
	want := []billing.PoolLine{
		{Provider: "fly", Size: "large", Image: "img", Seconds: 3, RateCard: "pool", Currency: "USD", AmountMicros: 300},
		// 62.5s at 100 in hour 12, 7s at 1000 in hour 13: 6250 + 7000.
		{Provider: "local", Size: "small", Image: "host", Seconds: 70, RateCard: "pool", Currency: "USD", AmountMicros: 13250},
	}
	if !slices.Equal(lines, want) {
		t.Errorf("pool lines\n got %+v\nwant %+v", lines, want)
	}
	// The hour 12:00 starts before 12:01: left out, as is every size but small.
	lines, err = a.PoolUsage(ctx, t0.Add(time.Minute), t0.Add(2*time.Hour), "small")
	must(t, err)
	if want := []billing.PoolLine{{Provider: "local", Size: "small", Image: "host", Seconds: 7, RateCard: "pool",
		Currency: "USD", AmountMicros: 7000}}; !slices.Equal(lines, want) {
		t.Errorf("pool lines from 12:01, small\n got %+v\nwant %+v", lines, want)
	}
	// Without a pool card the seconds stand alone.
	lines, err = poolBroker(t, srv, clock, "").PoolUsage(ctx, t0, t0.Add(time.Hour), "")
	must(t, err)
	if len(lines) != 2 || lines[1].Seconds != 63 || lines[1].RateCard != "" || lines[1].AmountMicros != 0 {
		t.Errorf("unpriced pool lines = %+v; want local small 63s, no card, no amount", lines)
	}
	// The day's hash expires with the usage data's retention.
	at, err := srv.Client().PExpireTime(ctx, "sg:pool:20260310").Result()
	must(t, err)
	if want := time.Date(2026, 3, 11, 0, 0, 0, 0, time.UTC).Add(billing.PoolRetention); at != time.Duration(want.UnixMilli())*time.Millisecond {
		t.Errorf("the day's pool hash expires at unix ms %d; want %d, PoolRetention after the day", at.Milliseconds(), want.UnixMilli())
	}
}

// A failed write keeps what it counted for the next Record.
func TestPoolMeterRetries(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	t0 := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	b := poolBroker(t, srv, sgtest.NewClock(t0), "")
	m := b.PoolMeter()
	srv.Kill()
	if err := m.Record(ctx, t0, []billing.PoolTotal{{Provider: "local", Size: "small", Image: "host", Warm: 5 * time.Second}}); err == nil {
		t.Fatal("Record with Redis down succeeded")
	}
	srv.Restart()
	must(t, m.Record(ctx, t0.Add(time.Minute), []billing.PoolTotal{{Provider: "local", Size: "small", Image: "host", Warm: 6 * time.Second}}))
	lines, err := b.PoolUsage(ctx, t0, t0.Add(time.Hour), "")
	must(t, err)
	if len(lines) != 1 || lines[0].Seconds != 6 {
		t.Errorf("pool lines after a failed write = %+v; want 6s", lines)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
