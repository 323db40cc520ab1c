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
// byte for byte; most are encoded without it (jsonHandler).
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
		return slog.New(slog.NewTextHandler(w, opts)), nil
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
// call for many access-log lines instead of one each. Once LogMaxBuffered
// bytes are waiting they are written without waiting for the linger, by
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
	switch {
	case len(l.buf) >= 4*LogMaxBuffered:
		l.mu.Unlock()
		return len(p), l.Flush()
	case len(l.buf) >= LogMaxBuffered:
		if !l.soon {
			l.scheduled, l.soon = true, true
			l.timer.Reset(0)
		}
	case !l.scheduled:
		l.scheduled = true
		l.timer.Reset(l.linger)
	}
	l.mu.Unlock()
	return len(p), nil
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
	buf := l.buf
	l.buf, l.spare = l.spare[:0], nil
	l.closed = l.closed || close
	l.mu.Unlock()
	if len(buf) == 0 {
		l.mu.Lock()
		l.spare = buf
		l.mu.Unlock()
		return nil
	}
	_, err := l.w.Write(buf)
	if cap(buf) <= 4*LogMaxBuffered { // a burst's buffer is not kept
		l.mu.Lock()
		l.spare = buf[:0]
		l.mu.Unlock()
	}
	return err
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
	return slog.New(flushing{Handler: log.Handler(), w: lw}), lw, nil
}

// flushing is a handler that flushes its LogWriter after every warning or
// error, so that those are written at once, as an unbuffered log would.
type flushing struct {
	slog.Handler
	w *LogWriter
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
// if the handler it wraps cannot write the line without it.
func (f flushing) HandleAttrs(ctx context.Context, t time.Time, level slog.Level, msg string, attrs []slog.Attr) error {
	var err error
	if h, ok := f.Handler.(attrsHandler); ok {
		err = h.HandleAttrs(ctx, t, level, msg, attrs)
	} else {
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
// without a slog.Record: jsonHandler, and flushing over one. The gateway's
// access log looks for the method (with an interface of its own).
type attrsHandler interface {
	HandleAttrs(ctx context.Context, t time.Time, level slog.Level, msg string, attrs []slog.Attr) error
}

func (f flushing) WithAttrs(attrs []slog.Attr) slog.Handler {
	return flushing{Handler: f.Handler.WithAttrs(attrs), w: f.w}
}

func (f flushing) WithGroup(name string) slog.Handler {
	return flushing{Handler: f.Handler.WithGroup(name), w: f.w}
}
