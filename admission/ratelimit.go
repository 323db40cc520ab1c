package admission

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
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

// borrowScript is the generic cell rate algorithm over one key, taking up
// to ARGV[3] requests at once: the key holds the theoretical arrival time
// (TAT) of the next request, and it grants as many of the wanted requests
// as fit within the burst. Its one clock is Redis's own TIME, so gateways
// whose clocks differ share one limit exactly. The TAT is stored to the
// microsecond: Lua's tostring keeps 14 digits, a tenth of a millisecond of
// a unix-ms time, which would round away the interval of a limit over
// 10 000 requests a second.
//
// KEYS[1] TAT STRING
// ARGV[1] emission interval (ms per request, may be fractional), ARGV[2]
// burst, ARGV[3] requests wanted (at least 1)
// Returns {granted, 0} with granted ≥ 1, or {0, retry_after_ms} refused.
var borrowScript = redis.NewScript(`
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local t, burst, want = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local room = math.floor((burst * t - (tat - now)) / t + 1e-9)
if room < 1 then return {0, math.ceil(tat + t - now - burst * t)} end
local g = math.min(want, room)
local new = tat + g * t
redis.call('SET', KEYS[1], string.format('%.3f', new), 'PX', math.ceil(new - now) + 1000)
return {g, 0}
`)

// Limiter limits request rates per token and class. The limit itself
// lives in Redis (borrowScript), so it holds across every gateway process;
// each process borrows requests from it in batches and spends them from a
// local bucket per token and class, so that most requests cost no round
// trip. The request that leaves a bucket half spent starts the next
// batch's borrow in the background (Allow), so that a steady stream of
// requests never waits for Redis; one that finds the bucket empty while
// that borrow is in flight waits for it rather than borrowing on its own.
// A refusal is remembered for its Retry-After: until then the token's
// requests that find nothing held are refused in process, so a token
// over its limit costs no round trip per request (Refused lets a handler
// ask before it reads a large body).
//
// A batch follows the token's observed rate on this process: each batch
// borrow takes what the requests since the last one would spend in
// BatchHorizon at the rate they came, between Batch (Burst/20, between
// 1 and 64) and MaxBatch (Burst/4, between 1 and 64, or what the limit's
// rate grants in BatchHorizon, at most the burst). A token spending no
// faster than Batch per BatchHorizon keeps batches of Batch; a faster one
// costs a script call per up to MaxBatch requests.
//
// The bound: every request spends a request borrowed from Redis's limit,
// and a process holds at most one and a half of the largest batch of a
// token's class at a time (the next batch is borrowed once at most half
// of the current one is left, only one borrow is in flight, and no batch
// is larger than MaxBatch), so in any window the requests let through
// are at most what the limit allows in it (burst + rate × window) plus
// 1.5 × MaxBatch × the number of gateway processes. Requests a process borrowed and did
// not spend within BorrowedLifetime are dropped: a limit can only be
// under-used that way (by at most 1.5 × MaxBatch per process), never
// exceeded.
type Limiter struct {
	rdb       redis.UniversalClient
	rates     map[Class]Rate
	intervals map[Class]string // borrowScript's ARGV[1] of each class, formatted once
	// ahead hands a borrow ahead to a worker waiting for one (borrower);
	// when none is waiting, a new one starts.
	ahead chan aheadBorrow
	now   func() time.Time // time.Now; a test's clock (export_test.go)

	mu      sync.Mutex
	buckets map[bucketKey]*bucket
}

// bucketKey names a bucket: a token's lease and a class. The Redis key
// (rateKey) is built only when a bucket borrows.
type bucketKey struct {
	lease string
	class Class
}

// BorrowedLifetime is how long a process keeps requests it borrowed. The
// bound above holds whatever it is (a process never holds more than
// 1.5 × MaxBatch); it only keeps a token that went quiet from holding
// them forever.
const BorrowedLifetime = 10 * time.Second

// borrowTimeout bounds a borrow made in the background, which no request's
// context bounds.
const borrowTimeout = 5 * time.Second

// maxBuckets bounds the local buckets; past it they start over (what
// they held is dropped, which only under-uses a limit).
const maxBuckets = 100_000

// Batch is how many requests a process borrows from r's limit at once
// for a token whose requests come no faster than Batch per BatchHorizon:
// Burst/20, between 1 and 64.
func (r Rate) Batch() int { return min(max(r.Burst/20, 1), 64) }

// MaxBatch is the most requests a process borrows from r's limit at once,
// for a token whose requests come fast: Burst/4, between 1 and 64, or,
// when it is more, what the sustained rate grants in BatchHorizon (at
// most the burst). What a process holds is bounded by its largest batch,
// so it stays a share of the burst, or a fraction of a second of the
// rate: a fast limit costs a script call per BatchHorizon of its requests,
// not per 64.
func (r Rate) MaxBatch() int {
	n := min(max(r.Burst/4, 1), 64)
	if f := r.PerSecond * BatchHorizon.Seconds(); f > float64(n) {
		n = int(min(f, float64(max(r.Burst, 1))))
	}
	return n
}

// BatchHorizon is how far ahead a borrow provides for: a batch is what
// the token's requests would spend in it at the rate they came since the
// last batch borrow (between Batch and MaxBatch).
const BatchHorizon = 100 * time.Millisecond

// bucket holds the requests a process borrowed for one token and class.
type bucket struct {
	mu      sync.Mutex
	tokens  int
	expires time.Time // tokens not spent by then are dropped
	// borrowing is closed when the batch borrow in flight ends; nil when
	// none is. While one is, other requests wait for it (Allow) or borrow
	// one at a time (Queue).
	borrowing chan struct{}
	// batch is the size of the last batch borrowed (0: none yet), spent
	// the requests spent since that borrow started, at batchAt.
	batch   int
	spent   int
	batchAt time.Time
	// refused is when the last refusal Redis gave ends: until then a
	// request that finds nothing held is refused here, and nothing is
	// borrowed ahead. Redis would refuse it too: a limit's arrival time
	// only moves forward, so the refusal is exact to within the round trip
	// that brought it (it ends that much later than Redis's).
	refused time.Time
	dropped bool // no longer the limiter's bucket of its key (maxBuckets)
}

// take spends one held request.
func (b *bucket) take(now time.Time) bool {
	if b.tokens > 0 && now.Before(b.expires) {
		b.tokens--
		b.spent++
		return true
	}
	b.tokens = 0
	return false
}

// refusal is the answer to a request at now that found nothing held:
// a 429 while the last refusal lasts, nil once it has ended.
func (b *bucket) refusal(now time.Time) error {
	if !now.Before(b.refused) {
		return nil
	}
	return rateLimited(b.refused.Sub(now))
}

// size is the bucket's current batch: the last one borrowed, or r's
// Batch before any.
func (b *bucket) size(r Rate) int { return max(b.batch, r.Batch()) }

// nextBatch is the size of a batch borrowed at now: what the requests
// spent since the last batch borrow would spend in BatchHorizon at the
// rate they came, between r's Batch and MaxBatch. It starts the next
// count.
func (b *bucket) nextBatch(r Rate, now time.Time) int {
	n := r.Batch()
	if !b.batchAt.IsZero() {
		if d := now.Sub(b.batchAt); d <= 0 {
			n = r.MaxBatch()
		} else if want := float64(b.spent) * float64(BatchHorizon) / float64(d); want > float64(n) {
			n = int(min(want, float64(r.MaxBatch())))
		}
	}
	n = min(n, r.MaxBatch())
	b.batch, b.spent, b.batchAt = n, 0, now
	return n
}

// NewLimiter returns a limiter with rates; a class missing from rates uses DefaultRates.
func NewLimiter(rates map[Class]Rate, rdb redis.UniversalClient) *Limiter {
	all := map[Class]Rate{}
	for c, r := range DefaultRates {
		all[c] = r
	}
	for c, r := range rates {
		all[c] = r
	}
	intervals := map[Class]string{}
	for c, r := range all {
		// As go-redis would format the float itself, on every call.
		intervals[c] = strconv.FormatFloat(1000/r.PerSecond, 'f', -1, 64)
	}
	return &Limiter{rdb: rdb, rates: all, intervals: intervals, ahead: make(chan aheadBorrow), now: time.Now, buckets: map[bucketKey]*bucket{}}
}

func (l *Limiter) bucket(key bucketKey) *bucket {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[key]
	if !ok {
		if len(l.buckets) >= maxBuckets {
			l.dropBucketsLocked()
		}
		b = &bucket{}
		l.buckets[key] = b
	}
	return b
}

// dropBucketsLocked starts the buckets over; l.mu is held. A Bucket
// still holding one of them looks its key up again.
func (l *Limiter) dropBucketsLocked() {
	for _, b := range l.buckets {
		b.mu.Lock()
		b.dropped = true
		b.mu.Unlock()
	}
	l.buckets = map[bucketKey]*bucket{}
}

// reserve spends a held request of key (0, true), refuses it while the
// last refusal lasts (err), or returns how many to borrow: a batch, or
// one while another batch borrow is in flight.
func (l *Limiter) reserve(key bucketKey, r Rate) (b *bucket, want int, ok bool, err error) {
	b = l.bucket(key)
	b.mu.Lock()
	defer b.mu.Unlock()
	now := l.now()
	if b.take(now) {
		return b, 0, true, nil
	}
	if err := b.refusal(now); err != nil {
		return b, 0, false, err
	}
	want = 1
	if b.borrowing == nil && r.MaxBatch() > 1 {
		if n := b.nextBatch(r, now); n > 1 {
			b.borrowing, want = make(chan struct{}), n
		}
	}
	return b, want, false, nil
}

// settle keeps what a borrow granted beyond the one request it was for
// (keep 1: the borrow was for no request, all of it is held). owner is
// whether the borrow is the batch borrow in flight (b.borrowing).
func (b *bucket) settle(now time.Time, owner bool, keep int, res []any, err error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if owner && b.borrowing != nil {
		close(b.borrowing)
		b.borrowing = nil
	}
	if err != nil {
		return err
	}
	g, _ := res[0].(int64)
	if g > int64(1-keep) {
		b.tokens, b.expires = b.tokens+int(g)-1+keep, now.Add(BorrowedLifetime)
	}
	if g < 1 {
		wait, _ := res[1].(int64)
		b.refused = now.Add(retryAfter(wait))
	}
	return result(res, nil)
}

// borrowArgs is borrowScript's ARGV for a borrow of want of class.
func (l *Limiter) borrowArgs(class Class, want int) []any {
	return []any{l.intervals[class], max(l.rates[class].Burst, 1), want}
}

// Queue queues the rate check of one request on a pipeline, so it shares a
// round trip with the request's first read; with a request held locally
// it queues nothing. The returned function, called after the pipeline ran,
// answers like Allow. Unlike Allow it never borrows in the background, so
// that the request's round trips are its own.
func (l *Limiter) Queue(ctx context.Context, p redis.Pipeliner, leaseID string, class Class) func() error {
	r := l.rates[class]
	if r.PerSecond <= 0 {
		return func() error { return nil }
	}
	b, want, ok, err := l.reserve(bucketKey{leaseID, class}, r)
	if ok || err != nil {
		return func() error { return err }
	}
	// EVAL, not EVALSHA: a pipeline cannot fall back when the script cache
	// is cold, and Redis caches the compiled script by its hash anyway.
	cmd := borrowScript.Eval(ctx, p, []string{rateKey(leaseID, class)}, l.borrowArgs(class, want)...)
	return func() error {
		res, err := cmd.Slice()
		return b.settle(l.now(), want > 1, 0, res, err)
	}
}

// QueueOn returns the rate check of one request of class by the lease as
// a store read's queue (store.DB.WorkspacePipelined, ExecBegin), so that
// the check shares the read's round trip without the store knowing the
// limiter; limited, called once the read returned, answers like Queue's
// function (nil before queue ran). With early, a check answered without
// Redis that refuses stops the read before it is sent: a refusal Redis
// gave another request meanwhile costs no round trip. A nil Limiter, or
// class "", checks nothing: queue is nil.
func (l *Limiter) QueueOn(ctx context.Context, leaseID string, class Class, early bool) (queue func(redis.Pipeliner) error, limited func() error) {
	limited = func() error { return nil }
	if l == nil || class == "" {
		return nil, limited
	}
	queue = func(p redis.Pipeliner) error {
		limited = l.Queue(ctx, p, leaseID, class)
		if !early || p.Len() > 0 {
			return nil // answered by the pipeline
		}
		if err := limited(); protocol.CodeOf(err) == protocol.RateLimited {
			return err
		}
		return nil
	}
	return queue, func() error { return limited() }
}

// Allow counts one request of class by the lease. It returns a 429
// rate_limited refusal with Retry-After when over the limit. A Redis
// failure is returned as is: the caller decides whether to fail open.
//
// A request that leaves at most half a batch held starts the next batch's
// borrow in the background; one that finds the bucket empty waits for a
// batch borrow in flight, then tries again, and borrows itself only when
// none is.
func (l *Limiter) Allow(ctx context.Context, leaseID string, class Class) error {
	r := l.rates[class]
	if r.PerSecond <= 0 {
		return nil
	}
	key := bucketKey{leaseID, class}
	return l.allow(ctx, r, key, l.bucket(key), nil, time.Time{})
}

// Refused returns the 429 a request of class by the lease gets without
// asking Redis: nothing held for it, and the last refusal Redis gave still
// lasting. It spends nothing, and nil means the request is to be counted
// as usual (Allow, Queue). A handler whose request carries a large body
// asks it first, so that a token over its limit is refused before the
// body is read.
func (l *Limiter) Refused(leaseID string, class Class) error {
	if l.rates[class].PerSecond <= 0 {
		return nil
	}
	b := l.bucket(bucketKey{leaseID, class})
	b.mu.Lock()
	defer b.mu.Unlock()
	now := l.now()
	if b.tokens > 0 && now.Before(b.expires) {
		return nil
	}
	return b.refusal(now)
}

// Bucket is a lease's bucket of one class, looked up once (Limiter.Bucket)
// so that AllowBucket spends from it without looking it up again: the
// gateway keeps one with each token it caches. It spends from the same
// requests held as Allow and Queue of the lease and class do.
type Bucket struct {
	key bucketKey
	r   Rate
	b   atomic.Pointer[bucket] // the limiter's bucket of key, found again once dropped
}

// Bucket returns the lease's bucket of class, for AllowBucket.
func (l *Limiter) Bucket(leaseID string, class Class) *Bucket {
	h := &Bucket{key: bucketKey{leaseID, class}, r: l.rates[class]}
	if h.r.PerSecond > 0 {
		h.b.Store(l.bucket(h.key))
	}
	return h
}

// AllowBucket is Allow of h's lease and class. now is a reading of
// time.Now (the limiter's clock) the caller made for the request just
// before, which the first try spends at instead of reading it again; the
// zero time: none.
func (l *Limiter) AllowBucket(ctx context.Context, h *Bucket, now time.Time) error {
	if h.r.PerSecond <= 0 {
		return nil
	}
	return l.allow(ctx, h.r, h.key, h.b.Load(), h, now)
}

// allow is Allow of key at r, starting from b, its bucket; h (nil: none)
// is the Bucket b came from, given the key's bucket anew when b was
// dropped. first is the clock reading of the first try; zero: read it.
func (l *Limiter) allow(ctx context.Context, r Rate, key bucketKey, b *bucket, h *Bucket, first time.Time) error {
	leaseID, class := key.lease, key.class
	for {
		b.mu.Lock()
		if b.dropped {
			b.mu.Unlock()
			b = l.bucket(key)
			if h != nil {
				h.b.Store(b)
			}
			continue
		}
		now := first
		if first = (time.Time{}); now.IsZero() {
			now = l.now()
		}
		if b.take(now) {
			if b.borrowing == nil && r.MaxBatch() > 1 && b.tokens <= b.size(r)/2 && !now.Before(b.refused) {
				b.borrowing = make(chan struct{})
				l.borrowAhead(aheadBorrow{ctx: context.WithoutCancel(ctx), key: rateKey(leaseID, class), class: class, want: b.nextBatch(r, now), b: b})
			}
			b.mu.Unlock()
			return nil
		}
		if err := b.refusal(now); err != nil {
			b.mu.Unlock()
			return err
		}
		wait := b.borrowing
		if wait == nil {
			want := 1
			if r.MaxBatch() > 1 {
				if n := b.nextBatch(r, now); n > 1 {
					b.borrowing, want = make(chan struct{}), n
				}
			}
			b.mu.Unlock()
			res, err := borrowScript.Run(ctx, l.rdb, []string{rateKey(leaseID, class)}, l.borrowArgs(class, want)...).Slice()
			return b.settle(l.now(), want > 1, 0, res, err)
		}
		b.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// aheadBorrow is a borrow ahead for bucket b of key.
type aheadBorrow struct {
	ctx   context.Context
	key   string
	class Class
	want  int // the batch
	b     *bucket
}

// borrowerIdle is how long a borrower waits for the next borrow ahead
// before it ends.
const borrowerIdle = time.Second

// borrowAhead has a borrower borrow the next batch of a.key for a.b, for
// no request in particular. Borrowers are goroutines that serve one
// borrow after another until idle for borrowerIdle: a fresh goroutine per
// borrow would grow its stack through go-redis's calls every time.
func (l *Limiter) borrowAhead(a aheadBorrow) {
	select {
	case l.ahead <- a:
	default:
		go l.borrower(a)
	}
}

func (l *Limiter) borrower(a aheadBorrow) {
	idle := time.NewTimer(borrowerIdle)
	defer idle.Stop()
	for {
		l.borrow(a)
		idle.Reset(borrowerIdle)
		select {
		case a = <-l.ahead:
		case <-idle.C:
			return
		}
	}
}

// borrow makes the borrow ahead a. A refusal or an error leaves the
// bucket empty: the next request borrows itself, and answers with what
// Redis says then.
func (l *Limiter) borrow(a aheadBorrow) {
	ctx, cancel := context.WithTimeout(a.ctx, borrowTimeout)
	defer cancel()
	res, err := borrowScript.Run(ctx, l.rdb, []string{a.key}, l.borrowArgs(a.class, a.want)...).Slice()
	_ = a.b.settle(l.now(), true, 1, res, err)
}

func result(res []any, err error) error {
	if err != nil {
		return err
	}
	if ok, _ := res[0].(int64); ok >= 1 {
		return nil
	}
	wait, _ := res[1].(int64)
	return rateLimited(retryAfter(wait))
}

// retryAfter is borrowScript's retry_after_ms of a refusal, at least 1 ms.
func retryAfter(ms int64) time.Duration { return time.Duration(max(ms, 1)) * time.Millisecond }

// rateLimited is the 429 of a request refused for d, rounded up to the
// millisecond as Redis's refusals are.
func rateLimited(d time.Duration) error {
	return &protocol.Error{Code: protocol.RateLimited, Message: "too many requests for this token; honour Retry-After",
		RetryAfter: max((d + time.Millisecond - 1).Truncate(time.Millisecond), time.Millisecond), Reason: "rate"}
}
