package telemetry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"
)

// NewLogger returns the process's structured logger writing to w: format
// "json" (the default) or "text", at level ("debug", "info", "warn",
// "error"). A duration attribute is written in milliseconds with the unit
// in its key: "duration" becomes "duration_ms": 12.5. It is the one
// logger constructor, so that what tests and benchmarks log through is what
// `sandgate serve` logs through. The JSON lines are slog's JSONHandler's,
// byte for byte; most are encoded without it (jsonHandler). A line
// logged with a context that carries a valid span names it: trace_id and
// span_id, last.
func NewLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: l, ReplaceAttr: millis}
	switch format {
	case "", "json":
		return slog.New(newJSONHandler(w, opts)), nil
	case "text":
		return slog.New(spanHandler{slog.NewTextHandler(w, opts)}), nil
	}
	return nil, fmt.Errorf("log format %q: want json or text", format)
}

// millis writes durations as milliseconds, the unit in the key. It also
// hands the record's level on as the string it is written as: a handler
// with a ReplaceAttr passes the level as an any, which the JSON handler
// would otherwise encode through encoding/json on every line.
func millis(groups []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindDuration:
		key := "duration_ms" // the access log's, on every line: no concatenation
		if a.Key != "duration" {
			key = a.Key + "_ms"
		}
		return slog.Float64(key, float64(a.Value.Duration())/float64(time.Millisecond))
	case slog.KindAny:
		if l, ok := a.Value.Any().(slog.Level); ok && len(groups) == 0 && a.Key == slog.LevelKey {
			return slog.String(a.Key, l.String())
		}
	}
	return a
}

// LogWriter coalesces a logger's writes: lines are written to the
// underlying writer together, at most Linger after the first of them, or at
// once when Flush is called, so that a busy broker pays one write system
// call for many access-log lines instead of one each. The lines of the JSON
// handler's fast path wait unencoded and are encoded together when written
// (writeLine). Once LogMaxBuffered bytes (for those, an estimate) are
// waiting they are written without waiting for the linger, by
// the timer's goroutine rather than the line's caller; a caller writes
// them itself only once four times as many wait. Lines keep their order.
// [NewBufferedLogger] flushes after every warning and error line, so only
// info and debug lines ever wait. Close flushes and makes later writes go
// straight through. It is safe for concurrent use.
type LogWriter struct {
	w      io.Writer
	linger time.Duration

	// writing is held while lines are written to w, taken before mu: one
	// write at a time, in the order the lines came.
	writing sync.Mutex

	mu        sync.Mutex
	buf       []byte
	spare     []byte // the last buffer written, reused for the next lines
	scheduled bool   // the timer will flush
	soon      bool   // ... without waiting for the linger
	closed    bool
	timer     *time.Timer
	// lines are the lines of jsonHandler's fast path held unencoded
	// (writeLine), each at its place in buf; held is what buf and they
	// would take written. spareLines is lines's last array, reused.
	lines      []pendingLine
	spareLines []pendingLine
	attrs      []slog.Attr // the held lines' attributes, one array for all
	spareAttrs []slog.Attr
	held       int

	// enc is the buffer flush encodes held lines into, l.writing held.
	enc []byte
}

// pendingLine is a line held unencoded: its place in the buffer and what
// its handler encodes it from, once flushed. Its attributes are of the
// plain kinds only (jsonHandler.deferrable), which are values: nothing a
// caller can change after it hands them over. A string of them may need
// escaping: that line is encoded as slog's handler writes it.
type pendingLine struct {
	at    int // the line goes after buf[:at]
	h     *jsonHandler
	t     time.Time
	level slog.Level
	msg   string
	attrs []slog.Attr
}

// LogLinger is how long a line may wait in a LogWriter: what a crash can
// lose of the info lines, and no longer than an operator tailing the log
// could notice.
const LogLinger = 10 * time.Millisecond

// LogMaxBuffered is how many bytes a LogWriter holds before it writes
// them without waiting for the linger.
const LogMaxBuffered = 64 << 10

// NewLogWriter returns a LogWriter over w that holds lines up to linger.
func NewLogWriter(w io.Writer, linger time.Duration) *LogWriter {
	l := &LogWriter{w: w, linger: linger}
	l.timer = time.AfterFunc(time.Hour, func() { _ = l.Flush() })
	l.timer.Stop()
	return l
}

// Write implements io.Writer. It returns the error of a write it had to
// make at once; a write the timer makes has no caller to tell.
func (l *LogWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.writing.Lock() // after what Close writes
		defer l.writing.Unlock()
		return l.w.Write(p)
	}
	l.buf = append(l.buf, p...)
	return len(p), l.heldLocked(len(p))
}

// heldLocked counts n more bytes held, l.mu held, and schedules their
// write; it unlocks l.mu, and returns the error of a write it made at once.
func (l *LogWriter) heldLocked(n int) error {
	l.held += n
	switch {
	case l.held >= 4*LogMaxBuffered:
		l.mu.Unlock()
		return l.Flush()
	case l.held >= LogMaxBuffered:
		if !l.soon {
			l.scheduled, l.soon = true, true
			l.timer.Reset(0)
		}
	case !l.scheduled:
		l.scheduled = true
		l.timer.Reset(l.linger)
	}
	l.mu.Unlock()
	return nil
}

// writeLine holds the line h encodes from t, level, msg and attrs, and
// encodes it when the lines are written: an info line waits for the
// linger anyway, and a batch of lines is encoded in one hot loop, off the
// path of the request that logged it, where one at a time each would be
// encoded cold. attrs are copied; size is about what the line takes
// encoded (deferrable's count). It reports false, holding nothing, once
// the writer is closed.
func (l *LogWriter) writeLine(h *jsonHandler, t time.Time, level slog.Level, msg string, attrs []slog.Attr, size int) (bool, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false, nil
	}
	start := len(l.attrs)
	l.attrs = append(l.attrs, attrs...)
	l.lines = append(l.lines, pendingLine{at: len(l.buf), h: h, t: t, level: level, msg: msg, attrs: l.attrs[start:len(l.attrs):len(l.attrs)]})
	return true, l.heldLocked(size)
}

// Flush writes every line held.
func (l *LogWriter) Flush() error {
	l.writing.Lock()
	defer l.writing.Unlock()
	return l.flush(false)
}

// flush writes the lines held, l.writing held, and makes l closed with
// close. Lines that come meanwhile wait in the spare buffer.
func (l *LogWriter) flush(close bool) error {
	l.mu.Lock()
	if l.scheduled {
		l.scheduled, l.soon = false, false
		l.timer.Stop()
	}
	buf, lines, attrs := l.buf, l.lines, l.attrs
	l.buf, l.spare = l.spare[:0], nil
	l.lines, l.spareLines = l.spareLines[:0], nil
	l.attrs, l.spareAttrs = l.spareAttrs[:0], nil
	l.held = 0
	l.closed = l.closed || close
	l.mu.Unlock()
	if len(buf) == 0 && len(lines) == 0 {
		l.mu.Lock()
		l.spare, l.spareLines, l.spareAttrs = buf, lines, attrs
		l.mu.Unlock()
		return nil
	}
	out := buf
	if len(lines) > 0 {
		out = l.encode(l.enc[:0], buf, lines)
		if cap(out) <= 4*LogMaxBuffered {
			l.enc = out[:0]
		}
	}
	_, err := l.w.Write(out)
	clear(lines) // their strings are not kept past the write
	clear(attrs)
	l.mu.Lock()
	if cap(buf) <= 4*LogMaxBuffered { // a burst's buffer is not kept
		l.spare = buf[:0]
	}
	if cap(lines) <= 4096 && cap(attrs) <= 8*4096 {
		l.spareLines, l.spareAttrs = lines[:0], attrs[:0]
	}
	l.mu.Unlock()
	return err
}

// encode appends buf with the held lines encoded, each at its place.
func (l *LogWriter) encode(out, buf []byte, lines []pendingLine) []byte {
	at := 0
	for i := range lines {
		p := &lines[i]
		out = append(out, buf[at:p.at]...)
		at = p.at
		out = p.h.appendLine(out, p.t, p.level, p.msg, p.attrs)
	}
	return append(out, buf[at:]...)
}

// Close flushes; writes after it go straight to the underlying writer.
func (l *LogWriter) Close() error {
	l.writing.Lock()
	defer l.writing.Unlock()
	return l.flush(true)
}

// NewBufferedLogger is NewLogger writing through a LogWriter over w with
// LogLinger, flushed after every line at warn or above. The caller closes
// the LogWriter when it is done logging (before the process exits).
func NewBufferedLogger(w io.Writer, level, format string) (*slog.Logger, *LogWriter, error) {
	lw := NewLogWriter(w, LogLinger)
	log, err := NewLogger(lw, level, format)
	if err != nil {
		return nil, nil, err
	}
	return slog.New(newFlushing(log.Handler(), lw)), lw, nil
}

// flushing is a handler that flushes its LogWriter after every warning or
// error, so that those are written at once, as an unbuffered log would.
type flushing struct {
	slog.Handler
	w *LogWriter
	// attrs is Handler as an attrsHandler, found once; nil when it is not one.
	attrs attrsHandler
}

func newFlushing(h slog.Handler, w *LogWriter) flushing {
	a, _ := h.(attrsHandler)
	return flushing{Handler: h, w: w, attrs: a}
}

func (f flushing) Handle(ctx context.Context, r slog.Record) error {
	err := f.Handler.Handle(ctx, r)
	if r.Level >= slog.LevelWarn {
		if ferr := f.w.Flush(); err == nil {
			err = ferr
		}
	}
	return err
}

// HandleAttrs is Handle of a record of t, level, msg and attrs, made only
// if the handler it wraps cannot write the line without it. Like the
// handler's own, it writes nothing at a level the handler is not Enabled
// for.
func (f flushing) HandleAttrs(ctx context.Context, t time.Time, level slog.Level, msg string, attrs []slog.Attr) error {
	var err error
	if f.attrs != nil {
		err = f.attrs.HandleAttrs(ctx, t, level, msg, attrs)
	} else {
		if !f.Handler.Enabled(ctx, level) {
			return nil
		}
		r := slog.NewRecord(t, level, msg, 0)
		r.AddAttrs(attrs...)
		err = f.Handler.Handle(ctx, r)
	}
	if level >= slog.LevelWarn {
		if ferr := f.w.Flush(); err == nil {
			err = ferr
		}
	}
	return err
}

// attrsHandler is a handler that writes a line from its attributes
// without a slog.Record, and nothing at a level it is not Enabled for:
// jsonHandler, and flushing over one. The gateway's access log looks for
// the method (with an interface of its own).
type attrsHandler interface {
	HandleAttrs(ctx context.Context, t time.Time, level slog.Level, msg string, attrs []slog.Attr) error
}

func (f flushing) WithAttrs(attrs []slog.Attr) slog.Handler {
	return newFlushing(f.Handler.WithAttrs(attrs), f.w)
}

func (f flushing) WithGroup(name string) slog.Handler {
	return newFlushing(f.Handler.WithGroup(name), f.w)
}
