package telemetry

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// jsonHandler is slog's JSON handler with millis as its ReplaceAttr, with
// a faster way to write the records most lines are: attributes of plain
// kinds (strings of printable ASCII without a quote or a backslash,
// integers, booleans, durations, floats) and no group. It appends those
// into a pooled buffer, byte for byte as slog's handler would write them
// (TestJSONHandlerMatchesSlog), and hands every other record to slog's
// handler, which writes to the same writer under the same lock, so that
// lines never interleave and keep their order.
type jsonHandler struct {
	std   slog.Handler // slog's JSON handler over lw, with pre's attributes
	lw    io.Writer    // the writer, whose writes are serialised (lockedWriter, or a LogWriter)
	level slog.Leveler
	pre   []byte      // attributes of WithAttrs, encoded: `"k":v,"k2":v2`
	secs  *timePrefix // the last second's time written, shared with WithAttrs's handlers
	held  *LogWriter  // lw, when it is a LogWriter: HandleAttrs's lines wait in it unencoded
	// opts and with (every attribute of WithAttrs) make slog's handler
	// again over a buffer, for a held line the fast path cannot encode
	// (appendHeld).
	opts *slog.HandlerOptions
	with []slog.Attr
}

// lockedWriter serialises the fast path's writes with slog's handler's.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func newJSONHandler(w io.Writer, opts *slog.HandlerOptions) *jsonHandler {
	// A LogWriter serialises its writes itself, and both paths write a
	// line in one Write: no second lock.
	var lw io.Writer
	if l, ok := w.(*LogWriter); ok {
		lw = l
	} else {
		lw = &lockedWriter{w: w}
	}
	held, _ := lw.(*LogWriter)
	return &jsonHandler{std: slog.NewJSONHandler(lw, opts), lw: lw, level: opts.Level, secs: new(timePrefix), held: held, opts: opts}
}

func (h *jsonHandler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= h.level.Level()
}

// jsonBufs are the fast path's line buffers.
var jsonBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// maxPooledLine is the largest line buffer kept for reuse.
const maxPooledLine = 16 << 10

func (h *jsonHandler) Handle(ctx context.Context, r slog.Record) error {
	if ids, ok := spanIDs(ctx); ok {
		r = r.Clone()
		r.AddAttrs(ids[:]...)
	}
	bp := jsonBufs.Get().(*[]byte)
	buf, ok := h.appendRecord((*bp)[:0], r)
	var err error
	if ok {
		_, err = h.lw.Write(buf)
	} else {
		err = h.std.Handle(ctx, r)
	}
	h.putBuf(bp, buf)
	return err
}

// appendRecord appends r's line as slog's handler writes it, or reports
// false when r has what only slog's handler writes.
func (h *jsonHandler) appendRecord(buf []byte, r slog.Record) ([]byte, bool) {
	buf, ok := h.appendHead(buf, r.Time, r.Level, r.Message)
	if ok {
		r.Attrs(func(a slog.Attr) bool {
			buf = append(buf, ',')
			buf, ok = appendJSONAttr(buf, a)
			return ok
		})
	}
	return append(buf, '}', '\n'), ok
}

// HandleAttrs writes the line Handle writes for a record of t, level, msg
// and attrs, without the record: the access log's lines are written from
// their attributes alone. At a level the handler is not Enabled for it
// writes nothing (the caller need not ask Enabled first). Only the lines
// it cannot encode itself are made a record, for slog's handler. It keeps
// nothing of attrs once it returns.
func (h *jsonHandler) HandleAttrs(ctx context.Context, t time.Time, level slog.Level, msg string, attrs []slog.Attr) error {
	if level < h.level.Level() {
		return nil
	}
	if ids, ok := spanIDs(ctx); ok {
		attrs = append(attrs[:len(attrs):len(attrs)], ids[:]...)
	}
	if h.held != nil {
		if size, ok := deferrable(t, msg, attrs); ok {
			if ok, err := h.held.writeLine(h, t, level, msg, attrs, size); ok {
				return err
			}
		}
	}
	bp := jsonBufs.Get().(*[]byte)
	buf, ok := h.appendHead((*bp)[:0], t, level, msg)
	for i := 0; ok && i < len(attrs); i++ {
		buf = append(buf, ',')
		buf, ok = appendJSONAttr(buf, attrs[i])
	}
	var err error
	if ok {
		_, err = h.lw.Write(append(buf, '}', '\n'))
	} else {
		r := slog.NewRecord(t, level, msg, 0)
		r.AddAttrs(attrs...)
		err = h.std.Handle(ctx, r)
	}
	h.putBuf(bp, buf)
	return err
}

// appendLine appends the line HandleAttrs writes, for attributes that
// deferrable accepted: as the fast path encodes it, or, when a string of
// it needs escaping (which deferrable does not look for), as slog's
// handler does (appendHeld).
func (h *jsonHandler) appendLine(buf []byte, t time.Time, level slog.Level, msg string, attrs []slog.Attr) []byte {
	start := len(buf)
	buf, ok := h.appendHead(buf, t, level, msg)
	for i := 0; ok && i < len(attrs); i++ {
		buf = append(buf, ',')
		buf, ok = appendJSONAttr(buf, attrs[i])
	}
	if !ok {
		return h.appendHeld(buf[:start], t, level, msg, attrs)
	}
	return append(buf, '}', '\n')
}

// appendHeld appends the line slog's handler writes for a record of t,
// level, msg and attrs: through a handler of slog's made as h's, with
// h's options and WithAttrs's attributes, over a buffer of its own, since
// h's writes to the LogWriter that is writing the line.
func (h *jsonHandler) appendHeld(buf []byte, t time.Time, level slog.Level, msg string, attrs []slog.Attr) []byte {
	var b bytes.Buffer
	sh := slog.Handler(slog.NewJSONHandler(&b, h.opts))
	if len(h.with) > 0 {
		sh = sh.WithAttrs(h.with)
	}
	r := slog.NewRecord(t, level, msg, 0)
	r.AddAttrs(attrs...)
	_ = sh.Handle(context.Background(), r) // a buffer's writes do not fail
	return append(buf, b.Bytes()...)
}

// Unix seconds well inside the years slog's handler writes (0 to 9999),
// in any location.
const (
	minDeferUnix = -62135596800 + 2*86400 // 0001-01-03
	maxDeferUnix = 253402300799 - 2*86400 // 9999-12-29
)

// deferrable reports whether a line of t, msg and attrs can wait to be
// encoded: its time is one the fast path writes, and every attribute has a
// key and is a value that cannot change before it is encoded, of the kinds
// string, integer, boolean, finite float and duration. Whether a string
// of it needs escaping (the fast path's other refusal) is not looked at
// here: the line's encoding finds that out (appendLine), off the logging
// request's path, and hands that line to slog's handler then. size is
// about what the line takes encoded (LogWriter.writeLine's count), found
// in the same pass over attrs.
func deferrable(t time.Time, msg string, attrs []slog.Attr) (size int, ok bool) {
	if !t.IsZero() {
		if u := t.Unix(); u < minDeferUnix || u > maxDeferUnix {
			return 0, false
		}
	}
	size = 64 + len(msg) // what the line's head, time and level take, about
	for i := range attrs {
		a := &attrs[i]
		if a.Key == "" {
			return 0, false
		}
		size += 24 + len(a.Key)
		switch a.Value.Kind() {
		case slog.KindString:
			size += len(a.Value.String())
		case slog.KindInt64, slog.KindUint64, slog.KindBool, slog.KindDuration:
		case slog.KindFloat64:
			if f := a.Value.Float64(); math.IsNaN(f) || math.IsInf(f, 0) {
				return 0, false
			}
		default:
			return 0, false
		}
	}
	return size, true
}

// putBuf keeps buf, the line buffer of bp, for reuse unless it grew large.
func (h *jsonHandler) putBuf(bp *[]byte, buf []byte) {
	if cap(buf) <= maxPooledLine {
		*bp = buf
		jsonBufs.Put(bp)
	}
}

// appendHead appends the start of a line as slog's handler writes it, up
// to its attributes (WithAttrs's included), or reports false when it has
// what only slog's handler writes.
func (h *jsonHandler) appendHead(buf []byte, t time.Time, level slog.Level, msg string) ([]byte, bool) {
	buf = append(buf, '{')
	if !t.IsZero() {
		t = t.Round(0)
		var ok bool
		buf = append(buf, `"time":"`...)
		if buf, ok = h.secs.appendTime(buf, t); !ok {
			return buf, false
		}
		buf = append(buf, `",`...)
	}
	buf = append(buf, `"level":`...)
	var ok bool
	if buf, ok = appendJSONString(buf, level.String()); !ok {
		return buf, false
	}
	buf = append(buf, `,"msg":`...)
	if buf, ok = appendJSONString(buf, msg); !ok {
		return buf, false
	}
	if len(h.pre) > 0 {
		buf = append(buf, ',')
		buf = append(buf, h.pre...)
	}
	return buf, true
}

// timePrefix holds the last second written, formatted: lines come many
// a second, and most of t.AppendFormat's work is the same for each.
type timePrefix struct {
	last atomic.Pointer[formattedSecond]
}

// formattedSecond is one second of one location in RFC 3339: text is
// "2006-01-02T15:04:05" and then the zone ("Z", or "-07:00").
type formattedSecond struct {
	unix int64
	loc  *time.Location
	text []byte
}

// appendTime appends t as t.AppendFormat(buf, time.RFC3339Nano) does, or
// reports false for a year outside 0-9999, which slog's handler refuses.
// A location's offset changes only on a whole second, so one second of
// one location is one prefix and one zone.
func (p *timePrefix) appendTime(buf []byte, t time.Time) ([]byte, bool) {
	unix, loc := t.Unix(), t.Location()
	f := p.last.Load()
	if f == nil || f.unix != unix || f.loc != loc {
		if y := t.Year(); y < 0 || y >= 10000 {
			return buf, false
		}
		f = &formattedSecond{unix: unix, loc: loc, text: t.Truncate(time.Second).AppendFormat(nil, time.RFC3339)}
		p.last.Store(f)
	}
	const date = len("2006-01-02T15:04:05")
	buf = append(buf, f.text[:date]...)
	if ns := t.Nanosecond(); ns != 0 {
		var frac [10]byte
		frac[0] = '.'
		for i := 9; i > 0; i-- {
			frac[i] = byte('0' + ns%10)
			ns /= 10
		}
		n := len(frac)
		for frac[n-1] == '0' {
			n--
		}
		buf = append(buf, frac[:n]...)
	}
	return append(buf, f.text[date:]...), true
}

// appendJSONAttr appends a's key and value as slog's handler does after
// millis, or reports false when a is not of the plain kinds.
func appendJSONAttr(buf []byte, a slog.Attr) ([]byte, bool) {
	kind := a.Value.Kind() // a type switch: found once
	switch kind {
	case slog.KindString, slog.KindInt64, slog.KindUint64, slog.KindBool, slog.KindFloat64:
		// Resolving and millis leave these as they are: most attributes
		// are of these kinds.
	case slog.KindGroup:
		return buf, false
	default:
		a.Value = a.Value.Resolve()
		if a.Value.Kind() == slog.KindGroup {
			return buf, false
		}
		a = millis(nil, a)
		a.Value = a.Value.Resolve()
		kind = a.Value.Kind()
	}
	if a.Key == "" {
		return buf, false // slog elides an empty attribute and keeps an empty key: leave both to it
	}
	var ok bool
	if buf, ok = appendJSONString(buf, a.Key); !ok {
		return buf, false
	}
	buf = append(buf, ':')
	switch v := a.Value; kind {
	case slog.KindString:
		return appendJSONString(buf, v.String())
	case slog.KindInt64:
		return strconv.AppendInt(buf, v.Int64(), 10), true
	case slog.KindUint64:
		return strconv.AppendUint(buf, v.Uint64(), 10), true
	case slog.KindBool:
		return strconv.AppendBool(buf, v.Bool()), true
	case slog.KindFloat64:
		return appendJSONFloat(buf, v.Float64())
	}
	return buf, false
}

// plainJSON says which bytes a JSON string holds as they are: printable
// ASCII but the quote and the backslash.
var plainJSON = func() (t [256]bool) {
	for b := 0x20; b < 0x80; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// appendJSONString appends s quoted when no byte of it needs escaping.
func appendJSONString(buf []byte, s string) ([]byte, bool) {
	if !plainString(s) {
		return buf, false
	}
	buf = append(buf, '"')
	buf = append(buf, s...)
	return append(buf, '"'), true
}

// plainString reports whether every byte of s is plainJSON: eight bytes
// at a time (a word with a byte of 0x80 or more is refused at once, so
// the tests for the others may assume bytes under 0x80), then the table.
func plainString(s string) bool {
	const (
		ones = 0x0101010101010101
		high = 0x80 * ones
	)
	i := 0
	for ; i+8 <= len(s); i += 8 {
		w := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		quote, backslash := w^('"'*ones), w^('\\'*ones)
		bad := w | // a byte of 0x80 or more
			(w-0x20*ones)&^w | // a byte under 0x20
			(quote-ones)&^quote | // a zero byte of w^quotes: a quote
			(backslash-ones)&^backslash
		if bad&high != 0 {
			return false
		}
	}
	for ; i < len(s); i++ {
		if !plainJSON[s[i]] {
			return false
		}
	}
	return true
}

// appendJSONFloat appends f as encoding/json writes a float64 (which is
// what slog's handler calls): the shortest decimal, in exponent form
// below 1e-6 and from 1e21, with a one-digit negative exponent unpadded.
// NaN and infinities, which encoding/json refuses, are left to slog.
func appendJSONFloat(buf []byte, f float64) ([]byte, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return buf, false
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	buf = strconv.AppendFloat(buf, f, format, -1, 64)
	if format == 'e' {
		if n := len(buf); n >= 4 && buf[n-4] == 'e' && buf[n-3] == '-' && buf[n-2] == '0' {
			buf[n-2] = buf[n-1]
			buf = buf[:n-1]
		}
	}
	return buf, true
}

func (h *jsonHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	n := &jsonHandler{std: h.std.WithAttrs(attrs), lw: h.lw, level: h.level, secs: h.secs, held: h.held, opts: h.opts,
		with: h.with[:len(h.with):len(h.with)]}
	pre := append([]byte(nil), h.pre...)
	for _, a := range attrs {
		if len(pre) > 0 {
			pre = append(pre, ',')
		}
		var ok bool
		if pre, ok = appendJSONAttr(pre, a); !ok {
			return spanHandler{n.std} // slog's handler alone from here on
		}
		a.Value = a.Value.Resolve() // as pre has it: a LogValuer is not asked again
		n.with = append(n.with, a)
	}
	n.pre = pre
	return n
}

func (h *jsonHandler) WithGroup(name string) slog.Handler {
	return spanHandler{h.std.WithGroup(name)}
}
