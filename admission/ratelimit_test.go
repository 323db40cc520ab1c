package admission_test

import (
	"context"
	"errors"
	"math"
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

// scriptCounter counts the EVALSHA calls a client sends.
type scriptCounter struct{ n atomic.Int64 }

func (c *scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.EqualFold(cmd.Name(), "evalsha") {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestLimiterBorrowsInBatches: a limiter spends requests it borrowed from
// Redis in batches of Burst/20, so a token's requests cost one script call
// per batch (the request that leaves half a batch borrows the next one
// ahead, in the background), and the limit still refuses past the burst.
func TestLimiterBorrowsInBatches(t *testing.T) {
	rdb := redistest.Start(t).Client()
	sc := &scriptCounter{}
	rdb.AddHook(sc)
	rate := admission.Rate{PerSecond: 0.001, Burst: 100} // no refill within the test
	l := admission.NewLimiter(rdb, map[admission.Class]admission.Rate{admission.ClassRead: rate})
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
	// One call per batch, then the borrows ahead the last requests started
	// (which Redis refused: the burst is spent; one at a time, at most one
	// per request that left half a batch or less), and the refused
	// request's own.
	if got, least, most := sc.n.Load(), int64(100/rate.Batch()+1), int64(100/rate.Batch()+rate.Batch()/2+2); got < least || got > most {
		t.Errorf("101 requests cost %d script calls; want %d to %d (batches of %d, then the refused borrows ahead and the refusal)", got, least, most, rate.Batch())
	}
	if err := l.Allow(ctx, "lease_b", admission.ClassRead); err != nil {
		t.Errorf("another token: %v; want its own limit", err)
	}
}

// TestLimiterAcrossGateways: two gateways (two limiters, two clients) share
// one token's limit in Redis. Together they let through no more than the
// limit allows in the time it took (burst + rate × elapsed) plus a batch
// and a half per gateway, and no fewer than the burst minus what each may
// hold unspent.
func TestLimiterAcrossGateways(t *testing.T) {
	rs := redistest.Start(t)
	rate := admission.Rate{PerSecond: 2, Burst: 200} // batches of 10
	rates := map[admission.Class]admission.Rate{admission.ClassExec: rate}
	gateways := []*admission.Limiter{admission.NewLimiter(rs.Client(), rates), admission.NewLimiter(rs.Client(), rates)}
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
	b := int64(rate.Batch())
	held := (b + b/2) * int64(len(gateways)) // at most a batch and a half per gateway
	most := int64(rate.Burst) + int64(math.Ceil(elapsed.Seconds()*rate.PerSecond)) + held
	least := int64(rate.Burst) - held
	if got := allowed.Load(); got > most || got < least {
		t.Errorf("two gateways let %d of 800 requests through in %v; want %d to %d (burst %d, %g/s, batch %d per gateway)",
			got, elapsed, least, most, rate.Burst, rate.PerSecond, b)
	}
	if refused.Load() == 0 {
		t.Errorf("no request refused; want the limit to hold")
	}
}
