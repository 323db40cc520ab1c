package gateway

import (
	"bufio"
	"encoding/base64"
	"io"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate/protocol"
)

// Defaults of the in-flight caps (Config.MaxInflightPerWorkspace and the
// fields after it).
const (
	DefaultInflightPerWorkspace = 8
	DefaultInflightPerInstance  = 16
	DefaultInflightBytes        = 256 << 20
	DefaultBodyReadTimeout      = 60 * time.Second
)

// inflightRetryAfter is the Retry-After of a refusal by the in-flight caps:
// an exec or transfer in flight usually ends within it.
const inflightRetryAfter = time.Second

// inflight bounds what one gateway process holds for execs and file
// transfers in flight: how many run per workspace and per instance, and
// the bytes they may hold at once, per instance, per account and in all,
// each request reserving its worst case once its workspace is known to
// be the caller's and before it reads its body or runs anything. The
// counters are this process's own, not shared through Redis: a broker of
// n gateway processes admits up to n times each cap. It is safe for
// concurrent use.
type inflight struct {
	perWorkspace, perInstance int
	budget                    int64
	instBytes, acctBytes      int64 // an instance's and an account's share of budget
	bodyTimeout               time.Duration

	mu       sync.Mutex
	used     int64
	ws       map[string]int   // workspace id -> requests in flight
	inst     map[string]int   // instance id -> requests in flight
	instUsed map[string]int64 // instance id -> bytes reserved
	acctUsed map[string]int64 // account id -> bytes reserved

	// After a burst: when nothing is in flight any more and the burst
	// reserved at least releaseAbove bytes, giveBack (debug.FreeOSMemory)
	// runs once, at most every releaseEvery. The Go runtime keeps a
	// burst's memory for reuse until two GCs and its scavenger give it
	// back, and an idle broker runs few GCs: without this, a burst of
	// large transfers leaves the process at its peak RSS for minutes.
	giveBack  func()
	high      int64 // the most reserved at once since the last give-back
	givingAt  time.Time
	givingNow bool
}

// Give-back thresholds of inflight (see giveBack).
const (
	releaseAbove = 64 << 20
	releaseEvery = 10 * time.Second
)

func newInflight(cfg Config) *inflight {
	f := &inflight{perWorkspace: cfg.MaxInflightPerWorkspace, perInstance: cfg.MaxInflightPerInstance,
		budget: cfg.InflightBytes, instBytes: cfg.InflightBytesPerInstance, acctBytes: cfg.InflightBytesPerAccount,
		bodyTimeout: cfg.BodyReadTimeout, giveBack: debug.FreeOSMemory,
		ws: map[string]int{}, inst: map[string]int{}, instUsed: map[string]int64{}, acctUsed: map[string]int64{}}
	if f.perWorkspace <= 0 {
		f.perWorkspace = DefaultInflightPerWorkspace
	}
	if f.perInstance <= 0 {
		f.perInstance = DefaultInflightPerInstance
	}
	if f.budget <= 0 {
		f.budget = DefaultInflightBytes
	}
	if f.bodyTimeout <= 0 {
		f.bodyTimeout = DefaultBodyReadTimeout
	}
	if f.instBytes <= 0 {
		f.instBytes = f.budget / 4
	}
	if f.acctBytes <= 0 {
		f.acctBytes = f.budget / 2
	}
	return f
}

// tenant is who a reservation is counted against: the workspace (for the
// count caps only), its instance and the instance's account.
type tenant struct {
	ws, inst, acct string
}

// acquire reserves one request of workspace t.ws, holding at most bytes,
// and returns the function that gives it back (safe to call more than
// once). Past the workspace's or the instance's count cap, or past the
// instance's or the account's share of the bytes, it answers 429
// rate_limited: the tenant holds its own share, whatever others do. Only
// when the bytes do not fit in what is left of the whole budget is it 503
// unavailable (the broker, not the client, is at its limit). Both carry a
// Retry-After.
func (f *inflight) acquire(t tenant, bytes int64) (func(), error) {
	return f.reserve(t, bytes, true)
}

// acquireBytes reserves bytes for t as acquire does, for a request that
// does not count against the count caps (durable commands, and the
// second reservation of a file write): only the shares and the budget
// can refuse it.
func (f *inflight) acquireBytes(t tenant, bytes int64) (func(), error) {
	return f.reserve(t, bytes, false)
}

// overShare reports whether reserving bytes more would take a tenant that
// holds used past its share. A tenant with nothing in flight may always
// reserve (within the whole budget): a scope whose one request is larger
// than the share still runs, one request at a time.
func overShare(used, bytes, share int64) bool {
	return used > 0 && used+bytes > share
}

func (f *inflight) reserve(t tenant, bytes int64, counted bool) (func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case counted && f.ws[t.ws] >= f.perWorkspace:
		return nil, &protocol.Error{Code: protocol.RateLimited, RetryAfter: inflightRetryAfter,
			Message: "this workspace has as many execs and file transfers in flight as the broker allows; retry after Retry-After"}
	case counted && f.inst[t.inst] >= f.perInstance:
		return nil, &protocol.Error{Code: protocol.RateLimited, RetryAfter: inflightRetryAfter,
			Message: "this instance has as many execs and file transfers in flight as the broker allows; retry after Retry-After"}
	case overShare(f.instUsed[t.inst], bytes, f.instBytes):
		return nil, &protocol.Error{Code: protocol.RateLimited, RetryAfter: inflightRetryAfter,
			Message: "this instance holds as much exec output and file content in flight as the broker allows one instance; retry after Retry-After"}
	case overShare(f.acctUsed[t.acct], bytes, f.acctBytes):
		return nil, &protocol.Error{Code: protocol.RateLimited, RetryAfter: inflightRetryAfter,
			Message: "this account holds as much exec output and file content in flight as the broker allows one account; retry after Retry-After"}
	case bytes > f.budget-f.used:
		// 429, not 503: a refusal that proves nothing ran (a client reads
		// a 5xx on exec as "may have run"), and is retried all the same.
		return nil, &protocol.Error{Code: protocol.RateLimited, RetryAfter: inflightRetryAfter,
			Message: "the broker holds as much exec output and file content as it allows; retry after Retry-After"}
	}
	f.used += bytes
	f.instUsed[t.inst] += bytes
	f.acctUsed[t.acct] += bytes
	f.high = max(f.high, f.used)
	if counted {
		f.ws[t.ws]++
		f.inst[t.inst]++
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.used -= bytes
			giveBackBytes(f.instUsed, t.inst, bytes)
			giveBackBytes(f.acctUsed, t.acct, bytes)
			f.maybeGiveBack()
			if !counted {
				return
			}
			if f.ws[t.ws]--; f.ws[t.ws] == 0 {
				delete(f.ws, t.ws)
			}
			if f.inst[t.inst]--; f.inst[t.inst] == 0 {
				delete(f.inst, t.inst)
			}
		})
	}, nil
}

// bodyDeadline makes reading c's body fail once the body read timeout has
// passed, so that a body that never comes cannot hold a reservation, and
// returns the function that lifts the deadline once the body is read (the
// connection's later reads, such as net/http's watch for the client going
// away, must not time out). Where the connection cannot take a deadline
// it does nothing.
func (s *Server) bodyDeadline(c echo.Context) func() {
	rc := http.NewResponseController(c.Response().Writer)
	if rc.SetReadDeadline(time.Now().Add(s.inflight.bodyTimeout)) != nil {
		return func() {}
	}
	return func() { _ = rc.SetReadDeadline(time.Time{}) }
}

// dropUnreadBody makes the answer to a request refused with its body
// unread close the connection (HTTP/1): net/http would otherwise read up
// to 256 KiB of that body before it sends the answer, waiting as long as
// a client that never sends it likes.
func dropUnreadBody(c echo.Context) {
	if r := c.Request(); r.ContentLength != 0 && r.ProtoMajor == 1 {
		c.Response().Header().Set(echo.HeaderConnection, "close")
	}
}

// giveBackBytes takes bytes off key's count in m, forgetting it at zero.
func giveBackBytes(m map[string]int64, key string, bytes int64) {
	if m[key] -= bytes; m[key] <= 0 {
		delete(m, key)
	}
}

// maybeGiveBack starts giveBack when the burst is over (see giveBack).
// f.mu is held.
func (f *inflight) maybeGiveBack() {
	now := time.Now()
	if f.used != 0 || f.high < releaseAbove || f.givingNow || (!f.givingAt.IsZero() && now.Sub(f.givingAt) < releaseEvery) {
		return
	}
	f.high, f.givingNow, f.givingAt = 0, true, now
	go func() {
		f.giveBack()
		f.mu.Lock()
		f.givingNow = false
		f.mu.Unlock()
	}()
}

// bodyCost is what a request's body may cost in memory before it reaches
// the provider: the body as read, its decoded JSON strings (twice: the
// strict field check decodes it once more) and the base64-decoded bytes.
// A body without a declared length counts at the body limit.
func bodyCost(c echo.Context) int64 {
	n := c.Request().ContentLength
	if n < 0 || n > protocol.MaxBodyBytes {
		n = protocol.MaxBodyBytes
	}
	return 4 * n
}

// chunkSize is the size of outBuf's chunks.
const chunkSize = 64 << 10

// chunks are outBuf's chunks, reused across requests.
var chunks = sync.Pool{New: func() any { return new([chunkSize]byte) }}

// writers holds b64JSON.write's buffered writers, 32 KiB each, so that an
// answer does not allocate one.
var writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 32<<10) }}

// outBuf holds one stream of an exec's output in fixed-size chunks taken
// from a pool: it never copies what it holds to grow, and its chunks go
// back to the pool (free) once the answer is written. Its capacity is
// bounded by what the provider passes on (at most max_output_bytes). One
// goroutine writes it at a time.
type outBuf struct {
	chunks []*[chunkSize]byte
	n      int
}

// Write implements io.Writer; it never fails.
func (b *outBuf) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		if b.n == len(b.chunks)*chunkSize {
			b.chunks = append(b.chunks, chunks.Get().(*[chunkSize]byte))
		}
		c := copy(b.chunks[len(b.chunks)-1][b.n%chunkSize:], p)
		b.n += c
		p = p[c:]
	}
	return total, nil
}

// parts returns the held bytes, chunk by chunk. They are valid until free.
func (b *outBuf) parts() [][]byte {
	out := make([][]byte, 0, len(b.chunks))
	for i, c := range b.chunks {
		out = append(out, c[:min(chunkSize, b.n-i*chunkSize)])
	}
	return out
}

// free gives the chunks back to the pool.
func (b *outBuf) free() {
	for i, c := range b.chunks {
		chunks.Put(c)
		b.chunks[i] = nil
	}
	b.chunks, b.n = nil, 0
}

// b64JSON is a JSON object written as literal text with base64 fields
// between: text[0], the standard base64 of b64[0], text[1], …, text[n].
// It lets a handler encode output straight into the response instead of
// into a string, and that string into a marshalled body.
type b64JSON struct {
	text []string
	b64  [][][]byte // each field's bytes, in parts
}

// write answers status with the object, its exact length declared.
// A failure to write means the client went away; nothing is left to do.
func (o b64JSON) write(c echo.Context, status int) error {
	size := 0
	for _, t := range o.text {
		size += len(t)
	}
	for _, f := range o.b64 {
		n := 0
		for _, p := range f {
			n += len(p)
		}
		size += base64.StdEncoding.EncodedLen(n)
	}
	h := c.Response().Header()
	h[echo.HeaderContentType] = jsonType
	h.Set(echo.HeaderContentLength, strconv.Itoa(size))
	c.Response().WriteHeader(status)
	if c.Request().Method == http.MethodHead {
		return nil
	}
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(c.Response())
	defer func() { bw.Reset(nil); writers.Put(bw) }()
	for i, t := range o.text {
		if _, err := io.WriteString(bw, t); err != nil {
			return nil
		}
		if i == len(o.b64) {
			break
		}
		enc := base64.NewEncoder(base64.StdEncoding, bw)
		for _, p := range o.b64[i] {
			if _, err := enc.Write(p); err != nil {
				return nil
			}
		}
		if err := enc.Close(); err != nil {
			return nil
		}
	}
	_ = bw.Flush()
	return nil
}

// jsonBool and jsonInt render scalar fields of a b64JSON.
func jsonBool(b bool) string    { return strconv.FormatBool(b) }
func jsonInt(n int64) string    { return strconv.FormatInt(n, 10) }
func onepart(b []byte) [][]byte { return [][]byte{b} }
