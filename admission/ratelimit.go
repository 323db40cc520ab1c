package admission

import (
	"context"
	"math"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/protocol"
)

// Class is a group of operations that share a request-rate limit.
type Class string

// Operation classes. Release is in none: cleanup is never rate limited.
const (
	ClassRead    Class = "read"    // lease, status, list
	ClassAcquire Class = "acquire" // POST /v1/workspaces, snapshots
	ClassExec    Class = "exec"    // exec, files, commands
)

// Rate is one class's limit: a sustained rate and a burst.
type Rate struct {
	PerSecond float64 // 0 means unlimited
	Burst     int     // requests allowed at once; 0 means 1
}

// DefaultRates are the per-token limits when the config sets none. They
// are generous: they stop a runaway client, not real work.
var DefaultRates = map[Class]Rate{
	ClassRead:    {PerSecond: 50, Burst: 200},
	ClassAcquire: {PerSecond: 20, Burst: 400},
	ClassExec:    {PerSecond: 100, Burst: 400},
}

// gcraScript is the generic cell rate algorithm over one key: the key
// holds the theoretical arrival time (TAT) of the next request. Its one
// clock is Redis's own TIME, so gateways whose clocks differ share one
// limit exactly.
//
// KEYS[1] TAT STRING
// ARGV[1] emission interval (ms per request, may be fractional), ARGV[2] burst
// Returns {1, 0} allowed, {0, retry_after_ms} refused.
var gcraScript = redis.NewScript(`
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local t, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local new = tat + t
local ahead = new - now
if ahead > burst * t then return {0, math.ceil(ahead - burst * t)} end
redis.call('SET', KEYS[1], tostring(new), 'PX', math.ceil(ahead) + 1000)
return {1, 0}
`)

// Limiter limits request rates per token and class in Redis, so the limit
// holds across every gateway process.
type Limiter struct {
	rdb   redis.UniversalClient
	rates map[Class]Rate
}

// NewLimiter returns a limiter with rates; a class missing from rates uses DefaultRates.
func NewLimiter(rdb redis.UniversalClient, rates map[Class]Rate) *Limiter {
	all := map[Class]Rate{}
	for c, r := range DefaultRates {
		all[c] = r
	}
	for c, r := range rates {
		all[c] = r
	}
	return &Limiter{rdb: rdb, rates: all}
}

// Queue queues the rate check of one request on a pipeline, so it shares a
// round trip with the request's first read. The returned function, called
// after the pipeline ran, answers like Allow.
func (l *Limiter) Queue(ctx context.Context, p redis.Pipeliner, leaseID string, class Class) func() error {
	r := l.rates[class]
	if r.PerSecond <= 0 {
		return func() error { return nil }
	}
	// EVAL, not EVALSHA: a pipeline cannot fall back when the script cache
	// is cold, and Redis caches the compiled script by its hash anyway.
	cmd := gcraScript.Eval(ctx, p, []string{rateKey(leaseID, class)}, 1000/r.PerSecond, max(r.Burst, 1))
	return func() error { return result(cmd.Slice()) }
}

func rateKey(leaseID string, class Class) string { return "sg:rl:" + leaseID + ":" + string(class) }

// Allow counts one request of class by the lease. It returns a 429
// rate_limited refusal with Retry-After when over the limit. A Redis
// failure is returned as is: the caller decides whether to fail open.
func (l *Limiter) Allow(ctx context.Context, leaseID string, class Class) error {
	r := l.rates[class]
	if r.PerSecond <= 0 {
		return nil
	}
	return result(gcraScript.Run(ctx, l.rdb, []string{rateKey(leaseID, class)}, 1000/r.PerSecond, max(r.Burst, 1)).Slice())
}

func result(res []any, err error) error {
	if err != nil {
		return err
	}
	if ok, _ := res[0].(int64); ok == 1 {
		return nil
	}
	wait, _ := res[1].(int64)
	return &protocol.Error{Code: protocol.RateLimited, Message: "too many requests for this token; honour Retry-After",
		RetryAfter: time.Duration(math.Max(float64(wait), 1)) * time.Millisecond, Reason: "rate"}
}
