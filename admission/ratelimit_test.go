package admission_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/protocol"
)

// scriptCounter counts the EVALSHA calls a client sends, and keeps the
// requests each one asked for (borrowScript's ARGV[3], its last argument).
type scriptCounter struct {
	n atomic.Int64

	mu    sync.Mutex
	wants []int64
}

func (c *scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.EqualFold(cmd.Name(), "evalsha") {
			c.n.Add(1)
			args := cmd.Args()
			want, _ := args[len(args)-1].(int)
			c.mu.Lock()
			c.wants = append(c.wants, int64(want))
			c.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

// takeWants returns the wants recorded since the last call.
func (c *scriptCounter) takeWants() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.wants
	c.wants = nil
	return w
}
func (c *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestLimiterBorrowsInBatches: a limiter spends requests it borrowed from
// Redis in batches of Burst/20 to Burst/4, so a token's requests cost one
// script call per batch (the request that leaves half a batch borrows the
// next one ahead, in the background), and the limit still refuses past
// the burst.
func TestLimiterBorrowsInBatches(t *testing.T) {
	rdb := redistest.Start(t).Client()
	sc := &scriptCounter{}
	rdb.AddHook(sc)
	rate := admission.Rate{PerSecond: 0.001, Burst: 100} // no refill within the test
	l := admission.NewLimiter(map[admission.Class]admission.Rate{admission.ClassRead: rate}, rdb)
	ctx := context.Background()
	for i := range 100 {
		if err := l.Allow(ctx, "lease_a", admission.ClassRead); err != nil {
			t.Fatalf("request %d within the burst: %v", i+1, err)
		}
	}
	err := l.Allow(ctx, "lease_a", admission.ClassRead)
	if protocol.CodeOf(err) != protocol.RateLimited {
		t.Fatalf("request past the burst: %v; want rate_limited", err)
	}
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.RetryAfter <= 0 {
		t.Errorf("refusal %+v; want a Retry-After", err)
	}
	// One call per batch (of Batch to MaxBatch), then the borrows ahead
	// the last requests started (which Redis refused: the burst is spent;
	// one at a time, at most one per request that left half a batch or
	// less), and the refused request's own.
	if got, least, most := sc.n.Load(), int64(100/rate.MaxBatch()+1), int64(100/rate.Batch()+rate.MaxBatch()/2+2); got < least || got > most {
		t.Errorf("101 requests cost %d script calls; want %d to %d (batches of %d to %d, then the refused borrows ahead and the refusal)", got, least, most, rate.Batch(), rate.MaxBatch())
	}
	for _, w := range sc.takeWants() {
		if w < 1 || w > int64(rate.MaxBatch()) {
			t.Errorf("a borrow asked for %d requests; want 1 to MaxBatch (%d)", w, rate.MaxBatch())
		}
	}
	if err := l.Allow(ctx, "lease_b", admission.ClassRead); err != nil {
		t.Errorf("another token: %v; want its own limit", err)
	}
}

// TestRateBatches: a batch is a share of the burst, and the largest one
// grows with a fast rate to what it grants in BatchHorizon, never past
// the burst.
func TestRateBatches(t *testing.T) {
	for _, tc := range []struct {
		rate       admission.Rate
		batch, max int
	}{
		{admission.DefaultRates[admission.ClassRead], 10, 50},
		{admission.DefaultRates[admission.ClassExec], 20, 64},
		{admission.Rate{PerSecond: 2, Burst: 200}, 10, 50},
		{admission.Rate{PerSecond: 1000, Burst: 400}, 20, 100}, // 100 ms of the rate
		{admission.Rate{PerSecond: 1e9, Burst: 200}, 10, 200},  // at most the burst
		{admission.Rate{PerSecond: 100, Burst: 1}, 1, 1},
		{admission.Rate{PerSecond: 100, Burst: 0}, 1, 1}, // a burst of 0 is 1
		{admission.Rate{PerSecond: 0.001, Burst: 100}, 5, 25},
	} {
		if got := tc.rate.Batch(); got != tc.batch {
			t.Errorf("%+v: Batch() = %d; want %d", tc.rate, got, tc.batch)
		}
		if got := tc.rate.MaxBatch(); got != tc.max {
			t.Errorf("%+v: MaxBatch() = %d; want %d", tc.rate, got, tc.max)
		}
	}
}

// TestLimiterBatchFollowsRate: a token whose requests come no faster than
// Batch per BatchHorizon borrows batches of Batch; one that comes faster
// borrows up to MaxBatch at once, and back to Batch when it slows down
// again. The limiter's clock is the test's: each request advances it.
func TestLimiterBatchFollowsRate(t *testing.T) {
	rdb := redistest.Start(t).Client()
	sc := &scriptCounter{}
	rdb.AddHook(sc)
	rate := admission.Rate{PerSecond: 1e6, Burst: 200} // nothing refused: Redis refills on its own clock; batches of 10 to 200
	l := admission.NewLimiter(map[admission.Class]admission.Rate{admission.ClassRead: rate}, rdb)
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	admission.SetClock(l, func() time.Time { return time.Unix(0, clock.Load()) })
	ctx := context.Background()
	batch, most := int64(rate.Batch()), int64(rate.MaxBatch())
	// every sends n requests, the clock advancing by step before each,
	// and returns the batches asked for once the last borrow landed. It
	// pauses a millisecond after every 20: Redis refills on its own clock,
	// in whole milliseconds, so that no more than the burst is asked for
	// within one.
	every := func(n int, step time.Duration) []int64 {
		t.Helper()
		for i := range n {
			if i%20 == 19 {
				time.Sleep(time.Millisecond)
			}
			clock.Add(int64(step))
			if err := l.Allow(ctx, "lease_a", admission.ClassRead); err != nil {
				t.Fatalf("request %d: %v (borrows asked: %v)", i+1, err, sc.takeWants())
			}
		}
		admission.WaitBorrow(l, "lease_a", admission.ClassRead)
		return sc.takeWants()
	}
	// Slow: 5 requests per BatchHorizon, half of Batch.
	for _, w := range every(100, admission.BatchHorizon/5) {
		if w != batch {
			t.Errorf("slow token: a borrow asked for %d; want Batch (%d)", w, batch)
		}
	}
	// Fast: twice MaxBatch per BatchHorizon. After the first borrow
	// ahead of the fast stream, every batch is MaxBatch.
	fast := 8 * int(most)
	wants := every(fast, admission.BatchHorizon/time.Duration(2*most))
	if len(wants) < 2 || len(wants) > fast/int(most)+3 {
		t.Errorf("fast token: %d requests asked %d borrows %v; want 2 to %d (batches of %d)", fast, len(wants), wants, fast/int(most)+3, most)
	}
	for i, w := range wants {
		if w > most || (i >= 2 && w != most) {
			t.Errorf("fast token: borrow %d asked for %d (all: %v); want MaxBatch (%d) from the third", i, w, wants, most)
		}
	}
	// Slow again: back to Batch after the first borrow ahead of it, once
	// what the fast stream left held (at most 1.5 × MaxBatch) is spent.
	slow := int(most+most/2) + 5*int(batch)
	wants = every(slow, admission.BatchHorizon/5)
	if len(wants) < 3 {
		t.Errorf("slowed token: %d requests asked %d borrows %v; want at least 3", slow, len(wants), wants)
	}
	for i, w := range wants {
		if i >= 1 && w != batch {
			t.Errorf("slowed token: borrow %d asked for %d (all: %v); want Batch (%d) from the second", i, w, wants, batch)
		}
	}
}

// TestLimiterBucket: a Bucket spends from the requests Allow holds for its
// lease and class, and after the buckets start over from the new bucket
// of its key, so that a process never holds two batches of one key.
func TestLimiterBucket(t *testing.T) {
	rdb := redistest.Start(t).Client()
	sc := &scriptCounter{}
	rdb.AddHook(sc)
	rate := admission.Rate{PerSecond: 1e6, Burst: 200} // batches of 10: a borrow ahead once 5 are left
	l := admission.NewLimiter(map[admission.Class]admission.Rate{admission.ClassRead: rate}, rdb)
	ctx := context.Background()
	h := l.Bucket("lease_a", admission.ClassRead)
	step := func(name string, allow func() error, want []int64) {
		t.Helper()
		if err := allow(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		admission.WaitBorrow(l, "lease_a", admission.ClassRead)
		if got := sc.takeWants(); !slices.Equal(got, want) {
			t.Errorf("%s: borrows asked %v; want %v", name, got, want)
		}
	}
	bucket := func() error { return l.AllowBucket(ctx, h, time.Time{}) }
	bucketAt := func() error { return l.AllowBucket(ctx, h, time.Now()) }
	allow := func() error { return l.Allow(ctx, "lease_a", admission.ClassRead) }
	batch := []int64{int64(rate.Batch())}
	step("first, through the Bucket", bucket, batch)
	step("Allow", allow, nil)
	step("the Bucket at the caller's clock reading", bucketAt, nil)
	step("Allow again", allow, nil)
	admission.DropBuckets(l)
	step("the Bucket, buckets started over", bucket, batch)
	step("Allow, buckets started over", allow, nil)
	if err := l.AllowBucket(ctx, l.Bucket("lease_b", admission.ClassAcquire), time.Time{}); err != nil {
		t.Fatalf("another class: %v", err)
	}
}

// TestLimiterRemembersRefusal: once Redis refuses a token, its requests
// are refused in process until the refusal's Retry-After has passed, each
// with what is left of it, costing Redis nothing (a token over its limit
// cannot make every request a script call); after it, Redis is asked
// again and lets the next one through. Another gateway's limiter knows
// nothing of it and asks Redis, which refuses it too.
func TestLimiterRemembersRefusal(t *testing.T) {
	rs := redistest.Start(t)
	rdb := rs.Client()
	sc := &scriptCounter{}
	rdb.AddHook(sc)
	rate := admission.Rate{PerSecond: 1, Burst: 1} // one request a second, borrowed one at a time
	rates := map[admission.Class]admission.Rate{admission.ClassExec: rate}
	l := admission.NewLimiter(rates, rdb)
	ctx := context.Background()
	if err := l.Allow(ctx, "lease_a", admission.ClassExec); err != nil {
		t.Fatalf("first request: %v", err)
	}
	first := l.Allow(ctx, "lease_a", admission.ClassExec)
	var pe *protocol.Error
	if !errors.As(first, &pe) || pe.Code != protocol.RateLimited || pe.RetryAfter <= 0 || pe.RetryAfter > time.Second {
		t.Fatalf("second request at once: %v; want rate_limited with a Retry-After of at most 1s", first)
	}
	calls := sc.n.Load()
	if calls != 2 {
		t.Fatalf("two requests cost %d script calls; want 2", calls)
	}
	refused := func(name string, err error) {
		t.Helper()
		var e *protocol.Error
		if !errors.As(err, &e) || e.Code != protocol.RateLimited || e.RetryAfter <= 0 || e.RetryAfter > pe.RetryAfter {
			t.Errorf("%s: %v; want rate_limited with a Retry-After in (0, %v]", name, err, pe.RetryAfter)
		}
	}
	for range 5 {
		refused("Allow", l.Allow(ctx, "lease_a", admission.ClassExec))
		refused("AllowBucket", l.AllowBucket(ctx, l.Bucket("lease_a", admission.ClassExec), time.Time{}))
		refused("Refused", l.Refused("lease_a", admission.ClassExec))
		p := rdb.Pipeline()
		refused("Queue", l.Queue(ctx, p, "lease_a", admission.ClassExec)())
		if p.Len() != 0 {
			t.Errorf("Queue while refused queued %d commands; want none", p.Len())
		}
	}
	if got := sc.n.Load(); got != calls {
		t.Errorf("20 refused requests cost %d script calls; want none", got-calls)
	}
	if err := l.Refused("lease_b", admission.ClassExec); err != nil {
		t.Errorf("Refused of another token: %v; want nil (nothing known of it)", err)
	}

	other := admission.NewLimiter(rates, rs.Client())
	if err := other.Allow(ctx, "lease_a", admission.ClassExec); protocol.CodeOf(err) != protocol.RateLimited {
		t.Errorf("another gateway's request: %v; want Redis's refusal", err)
	}

	time.Sleep(pe.RetryAfter + 10*time.Millisecond) // Redis's own clock decides: let it pass
	if err := l.Refused("lease_a", admission.ClassExec); err != nil {
		t.Errorf("Refused after the Retry-After: %v; want nil", err)
	}
	if err := l.Allow(ctx, "lease_a", admission.ClassExec); err != nil {
		t.Errorf("request after the Retry-After: %v; want it let through", err)
	}
	if got := sc.n.Load(); got != calls+1 {
		t.Errorf("the request after the Retry-After cost %d script calls; want 1", got-calls)
	}
}

// TestLimiterAcrossGateways: two gateways (two limiters, two clients) share
// one token's limit in Redis. Together they let through no more than the
// limit allows in the time it took (burst + rate × elapsed) plus one and
// a half of the largest batch (MaxBatch) per gateway, and no fewer than
// the burst minus what each may hold unspent.
func TestLimiterAcrossGateways(t *testing.T) {
	rs := redistest.Start(t)
	rate := admission.Rate{PerSecond: 2, Burst: 200} // batches of 10 to 50
	rates := map[admission.Class]admission.Rate{admission.ClassExec: rate}
	sc := &scriptCounter{}
	// The gateways' clock moves a microsecond a reading, so that their
	// requests come fast to them whatever the host's load and they borrow
	// their largest batches: the bound at its worst. Redis refills on its
	// own clock.
	var tick atomic.Int64
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var gateways []*admission.Limiter
	for range 2 {
		rdb := rs.Client()
		rdb.AddHook(sc)
		l := admission.NewLimiter(rates, rdb)
		admission.SetClock(l, func() time.Time { return base.Add(time.Duration(tick.Add(1)) * time.Microsecond) })
		gateways = append(gateways, l)
	}
	ctx := context.Background()
	var allowed, refused atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for _, l := range gateways {
		for range 4 {
			wg.Go(func() {
				for range 100 {
					err := l.Allow(ctx, "lease_shared", admission.ClassExec)
					switch protocol.CodeOf(err) {
					case "":
						allowed.Add(1)
					case protocol.RateLimited:
						refused.Add(1)
					default:
						t.Errorf("Allow: %v", err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	b := int64(rate.MaxBatch())
	held := (b + b/2) * int64(len(gateways)) // at most one and a half of the largest batch per gateway
	most := int64(rate.Burst) + int64(math.Ceil(elapsed.Seconds()*rate.PerSecond)) + held
	least := int64(rate.Burst) - held
	if got := allowed.Load(); got > most || got < least {
		t.Errorf("two gateways let %d of 800 requests through in %v; want %d to %d (burst %d, %g/s, batches up to %d per gateway)",
			got, elapsed, least, most, rate.Burst, rate.PerSecond, b)
	}
	if refused.Load() == 0 {
		t.Errorf("no request refused; want the limit to hold")
	}
	// The bound is checked at its worst: the gateways borrowed their
	// largest batches.
	wants := sc.takeWants()
	if !slices.Contains(wants, b) || slices.Max(wants) > b {
		t.Errorf("the gateways asked for %v; want batches up to MaxBatch (%d), and it among them", wants, b)
	}
}
