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
)

// inflightRetryAfter is the Retry-After of a refusal by the in-flight caps:
// an exec or transfer in flight usually ends within it.
const inflightRetryAfter = time.Second

// inflight bounds what one gateway process holds for execs and file
// transfers in flight: how many run per workspace and per instance, and
// the bytes all of them may hold at once, each request reserving its worst
// case before it reads its body or runs anything. The counters are this
// process's own, not shared through Redis: a broker of n gateway processes
// admits up to n times each cap. It is safe for concurrent use.
type inflight struct {
	perWorkspace, perInstance int
	budget                    int64

	mu   sync.Mutex
	used int64
	ws   map[string]int // workspace id -> requests in flight
	inst map[string]int // instance id -> requests in flight

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
		budget: cfg.InflightBytes, ws: map[string]int{}, inst: map[string]int{}, giveBack: debug.FreeOSMemory}
	if f.perWorkspace <= 0 {
		f.perWorkspace = DefaultInflightPerWorkspace
	}
	if f.perInstance <= 0 {
		f.perInstance = DefaultInflightPerInstance
	}
	if f.budget <= 0 {
		f.budget = DefaultInflightBytes
	}
	return f
}

// acquire reserves one request of workspace ws of instance inst, holding
// at most bytes, and returns the function that gives it back (safe to call
// more than once). Past the workspace's or the instance's cap it answers
// 429 rate_limited; when the bytes do not fit in what is left of the
// budget, 503 unavailable (the broker, not the client, is at its limit),
// both with a Retry-After.
func (f *inflight) acquire(ws, inst string, bytes int64) (func(), error) {
	return f.reserve(ws, inst, bytes, true)
}

// acquireBytes reserves bytes from the budget alone, for a request that
// does not count against the caps (durable commands); 503 unavailable
// when they do not fit.
func (f *inflight) acquireBytes(bytes int64) (func(), error) {
	return f.reserve("", "", bytes, false)
}

func (f *inflight) reserve(ws, inst string, bytes int64, counted bool) (func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case counted && f.ws[ws] >= f.perWorkspace:
		return nil, &protocol.Error{Code: protocol.RateLimited, RetryAfter: inflightRetryAfter,
			Message: "this workspace has as many execs and file transfers in flight as the broker allows; retry after Retry-After"}
	case counted && f.inst[inst] >= f.perInstance:
		return nil, &protocol.Error{Code: protocol.RateLimited, RetryAfter: inflightRetryAfter,
			Message: "this instance has as many execs and file transfers in flight as the broker allows; retry after Retry-After"}
	case bytes > f.budget-f.used:
		return nil, &protocol.Error{Code: protocol.Unavailable, RetryAfter: inflightRetryAfter,
			Message: "the broker holds as much exec output and file content as it allows; retry shortly"}
	}
	f.used += bytes
	f.high = max(f.high, f.used)
	if counted {
		f.ws[ws]++
		f.inst[inst]++
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.used -= bytes
			f.maybeGiveBack()
			if !counted {
				return
			}
			if f.ws[ws]--; f.ws[ws] == 0 {
				delete(f.ws, ws)
			}
			if f.inst[inst]--; f.inst[inst] == 0 {
				delete(f.inst, inst)
			}
		})
	}, nil
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
