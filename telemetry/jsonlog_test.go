package telemetry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// TestJSONHandlerMatchesSlog: every line the logger writes is what slog's
// own JSON handler (with millis) writes for the same record, byte for
// byte: the access log's lines, which take the fast path, and lines with
// what only slog's handler writes (groups, errors, escapes, non-ASCII),
// through With and WithGroup as well.
func TestJSONHandlerMatchesSlog(t *testing.T) {
	at := time.Date(2026, 12, 1, 15, 44, 39, 123456789, time.UTC)
	strs := []string{"", "req_0123456789abcdef01234567", "GET", "/v1/workspaces/:id", `quo"te`, `back\slash`,
		"tab\there", "nl\n", "\x00\x1f\x7f", "<html>&amp;", "é ünïcode", "\u2028\u2029", "bad\xffutf8", "/v1/lease"}
	floats := []float64{0, 1, -1, 0.5, 1.5, 0.123456, 1e-6, 9.99e-7, 1e-7, 1.5e-9, 1e20, 1e21, 1.234e25, -3e-8,
		math.MaxFloat64, math.SmallestNonzeroFloat64, math.NaN(), math.Inf(1), math.Inf(-1), 12345.678901}
	durs := []time.Duration{0, 1, 999, time.Microsecond, 1500 * time.Microsecond, 3 * time.Second, -time.Millisecond, math.MaxInt64}
	var records []slog.Record
	add := func(level slog.Level, msg string, attrs ...slog.Attr) {
		r := slog.NewRecord(at, level, msg, 0)
		r.AddAttrs(attrs...)
		records = append(records, r)
	}
	add(slog.LevelInfo, "request", slog.String("request_id", "req_0123456789abcdef01234567"), slog.String("method", "GET"),
		slog.String("route", "/v1/lease"), slog.Int("status", 200), slog.Duration("duration", 37*time.Microsecond),
		slog.String("instance_id", "ins_x"), slog.String("lease_id", "lse_y"), slog.String("code", "rate_limited"))
	for _, s := range strs {
		add(slog.LevelInfo, s, slog.String(s, s))
	}
	for _, f := range floats {
		add(slog.LevelWarn, "float", slog.Float64("f", f))
	}
	for _, d := range durs {
		add(slog.LevelDebug, "duration", slog.Duration("duration", d), slog.Duration("wait", d))
	}
	add(slog.LevelError, "kinds", slog.Int64("i", math.MinInt64), slog.Uint64("u", math.MaxUint64), slog.Bool("b", true),
		slog.Bool("f", false), slog.Time("at", at), slog.Any("err", errors.New("boom")), slog.Any("level", slog.LevelWarn),
		slog.Group("g", slog.String("a", "b")), slog.Group("empty"), slog.Any("nil", nil), slog.String("", "empty key"),
		slog.Any("valuer", valuer{}), slog.Any("m", map[string]int{"a": 1}))
	add(slog.LevelInfo+2, "odd level")
	add(slog.LevelInfo, "no attrs")
	zero := slog.NewRecord(time.Time{}, slog.LevelInfo, "no time", 0)
	zero.AddAttrs(slog.Int("n", 1))
	records = append(records, zero)
	// Times as RFC3339Nano writes them in every zone: the formatted second
	// is reused only for the same second of the same location.
	zones := []*time.Location{time.UTC, time.FixedZone("east", 90*60+17), time.FixedZone("west", -7*3600), time.FixedZone("utc0", 0)}
	if ny, err := time.LoadLocation("America/New_York"); err == nil {
		zones = append(zones, ny)
	}
	for _, ns := range []int{0, 1, 10, 100000, 120000000, 999999999, 500000000} {
		for _, base := range []time.Time{at, time.Date(2026, 3, 8, 6, 59, 59, 0, time.UTC), time.Date(2026, 3, 8, 7, 0, 0, 0, time.UTC),
			time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
			time.Date(-1, 12, 31, 0, 0, 0, 0, time.UTC)} {
			for _, z := range zones { // one instant in each zone in turn
				add(slog.LevelInfo, "zone", slog.Int("ns", ns))
				records[len(records)-1].Time = base.Truncate(time.Second).Add(time.Duration(ns)).In(z)
			}
		}
	}
	monotonic := slog.NewRecord(time.Now(), slog.LevelInfo, "monotonic", 0)
	records = append(records, monotonic, monotonic)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		r := slog.NewRecord(at.Add(time.Duration(rng.Int64N(int64(time.Hour)))), slog.LevelInfo, "random", 0)
		for range rng.IntN(9) {
			switch rng.IntN(4) {
			case 0:
				r.AddAttrs(slog.String(strs[rng.IntN(len(strs))], strs[rng.IntN(len(strs))]))
			case 1:
				r.AddAttrs(slog.Int("n", rng.IntN(1000)-500))
			case 2:
				r.AddAttrs(slog.Duration("duration", time.Duration(rng.Int64N(int64(time.Minute)))))
			case 3:
				r.AddAttrs(slog.Float64("x", rng.NormFloat64()*math.Pow(10, float64(rng.IntN(60)-30))))
			}
		}
		records = append(records, r)
	}

	opts := &slog.HandlerOptions{Level: slog.LevelDebug, ReplaceAttr: millis}
	if _, ok := newJSONHandler(&bytes.Buffer{}, opts).appendRecord(nil, records[0]); !ok {
		t.Fatal("the access log's line is not encoded on the fast path")
	}
	for _, shape := range []struct {
		name string
		wrap func(slog.Handler) slog.Handler
	}{
		{"plain", func(h slog.Handler) slog.Handler { return h }},
		{"with", func(h slog.Handler) slog.Handler {
			return h.WithAttrs([]slog.Attr{slog.String("component", "gateway")}).WithAttrs([]slog.Attr{slog.Duration("linger", time.Millisecond)})
		}},
		{"with error", func(h slog.Handler) slog.Handler { return h.WithAttrs([]slog.Attr{slog.Any("err", errors.New("x"))}) }},
		{"with escaped", func(h slog.Handler) slog.Handler { return h.WithAttrs([]slog.Attr{slog.String("k", "a\"b")}) }},
		{"group", func(h slog.Handler) slog.Handler { return h.WithAttrs([]slog.Attr{slog.Int("n", 1)}).WithGroup("g") }},
	} {
		var got, want bytes.Buffer
		fast := shape.wrap(newJSONHandler(&got, opts))
		std := shape.wrap(slog.NewJSONHandler(&want, opts))
		// Through a LogWriter (NewBufferedLogger's handler), flushed before
		// each comparison.
		var gotBuffered bytes.Buffer
		lw := NewLogWriter(&gotBuffered, time.Hour)
		buffered := shape.wrap(newFlushing(newJSONHandler(lw, opts), lw))
		for i, r := range records {
			want.Reset()
			_ = std.Handle(context.Background(), r)
			var attrs []slog.Attr
			r.Attrs(func(a slog.Attr) bool { attrs = append(attrs, a); return true })
			for _, h := range []struct {
				name string
				h    slog.Handler
				out  *bytes.Buffer
			}{{"", fast, &got}, {" buffered", buffered, &gotBuffered}} {
				h.out.Reset()
				if err := h.h.Handle(context.Background(), r); err != nil {
					t.Fatalf("%s%s: record %d: %v", shape.name, h.name, i, err)
				}
				_ = lw.Flush()
				if h.out.String() != want.String() {
					t.Errorf("%s%s: record %d:\n got %s\nwant %s", shape.name, h.name, i, strings.TrimSpace(h.out.String()), strings.TrimSpace(want.String()))
				}
				// The same line written from the attributes alone.
				ah, ok := h.h.(attrsHandler)
				if !ok {
					if shape.name == "plain" || shape.name == "with" {
						t.Fatalf("%s%s: no HandleAttrs", shape.name, h.name)
					}
					continue
				}
				h.out.Reset()
				if err := ah.HandleAttrs(context.Background(), r.Time, r.Level, r.Message, attrs); err != nil {
					t.Fatalf("%s%s: record %d: HandleAttrs: %v", shape.name, h.name, i, err)
				}
				_ = lw.Flush()
				if h.out.String() != want.String() {
					t.Errorf("%s%s: record %d: HandleAttrs:\n got %s\nwant %s", shape.name, h.name, i, strings.TrimSpace(h.out.String()), strings.TrimSpace(want.String()))
				}
			}
		}
	}
}

type valuer struct{}

func (valuer) LogValue() slog.Value { return slog.StringValue("resolved") }

// TestPlainString: the word-at-a-time check says what the table says, for
// every byte at every place of a word and of the tail, next to any other.
func TestPlainString(t *testing.T) {
	table := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if !plainJSON[s[i]] {
				return false
			}
		}
		return true
	}
	for n := 0; n <= 19; n++ {
		for pos := 0; pos < n; pos++ {
			for b := 0; b < 256; b++ {
				for _, other := range []byte{'a', 0x1f, 0x20, '"', '\\', 0x7f, 0x80, 0xff, '!', '#', '[', ']'} {
					s := []byte(strings.Repeat("a", n))
					s[pos] = byte(b)
					s[(pos+1)%n] = other
					if got, want := plainString(string(s)), table(string(s)); got != want {
						t.Fatalf("plainString(%q) = %v; want %v", s, got, want)
					}
				}
			}
		}
	}
}

// TestLogWriterHeldLinesKeepOrder: lines the fast path holds unencoded in
// a LogWriter come out where they were logged among the lines written as
// bytes (slog's handler's, and the fast path's records), and as an
// unbuffered handler writes them.
func TestLogWriterHeldLinesKeepOrder(t *testing.T) {
	at := time.Date(2026, 12, 1, 15, 44, 39, 123456789, time.UTC)
	opts := &slog.HandlerOptions{Level: slog.LevelDebug, ReplaceAttr: millis}
	var got, want bytes.Buffer
	lw := NewLogWriter(&got, time.Hour)
	with := []slog.Attr{slog.String("component", "gateway"), slog.Any("v", valuer{}), slog.Duration("linger", time.Millisecond)}
	buffered := newJSONHandler(lw, opts).WithAttrs(with[:1]).WithAttrs(with[1:])
	std := slog.NewJSONHandler(&want, opts).WithAttrs(with[:1]).WithAttrs(with[1:])
	attrs := make([]slog.Attr, 3) // reused by the caller, as the gateway's access log does
	for i := range 300 {
		at = at.Add(time.Duration(i) * 7 * time.Millisecond)
		attrs[0], attrs[1], attrs[2] = slog.String("request_id", fmt.Sprint("req_", i)), slog.Int("status", 200+i), slog.Duration("duration", time.Duration(i)*time.Microsecond)
		r := slog.NewRecord(at, slog.LevelInfo, "request", 0)
		r.AddAttrs(attrs...)
		_ = std.Handle(context.Background(), r)
		if err := buffered.(attrsHandler).HandleAttrs(context.Background(), at, slog.LevelInfo, "request", attrs); err != nil {
			t.Fatal(err)
		}
		if lw.mu.Lock(); len(lw.lines) == 0 {
			t.Fatalf("line %d: the access log's line is not held unencoded", i)
		}
		lw.mu.Unlock()
		if i%5 == 0 { // a held line only slog's handler encodes: a string of it needs escaping
			esc := []slog.Attr{slog.String("route", fmt.Sprint("/v1/\"", i, "\\\n\u00e9<&>"))}
			r := slog.NewRecord(at, slog.LevelInfo, "request", 0)
			r.AddAttrs(esc...)
			_ = std.Handle(context.Background(), r)
			lw.mu.Lock()
			held := len(lw.lines)
			lw.mu.Unlock()
			if err := buffered.(attrsHandler).HandleAttrs(context.Background(), at, slog.LevelInfo, "request", esc); err != nil {
				t.Fatal(err)
			}
			if lw.mu.Lock(); len(lw.lines) != held+1 {
				t.Fatalf("line %d: the line to escape is not held unencoded", i)
			}
			lw.mu.Unlock()
		}
		if i%3 == 0 { // a line only slog's handler writes, then one of the fast path's records
			r := slog.NewRecord(at, slog.LevelInfo, "escaped", 0)
			r.AddAttrs(slog.String("k", "a\"b"))
			_ = std.Handle(context.Background(), r)
			_ = buffered.Handle(context.Background(), r)
			r = slog.NewRecord(at, slog.LevelDebug, "record", 0)
			r.AddAttrs(slog.Int("n", i))
			_ = std.Handle(context.Background(), r)
			_ = buffered.Handle(context.Background(), r)
		}
		if i%97 == 0 {
			_ = lw.Flush()
		}
	}
	_ = lw.Close()
	if got.String() != want.String() {
		t.Errorf("LogWriter lines:\n got %s\nwant %s", got.String(), want.String())
	}
}

// TestHandleAttrsBelowLevel: HandleAttrs writes nothing at a level its
// handler is not Enabled for, as a caller that asked Enabled first would
// not have called it: the JSON handler, NewBufferedLogger's handler over
// it, and that over a handler with no HandleAttrs of its own (a group's).
func TestHandleAttrsBelowLevel(t *testing.T) {
	at := time.Date(2026, 12, 1, 15, 44, 39, 0, time.UTC)
	attrs := []slog.Attr{slog.String("request_id", "req_1"), slog.Int("status", 200)}
	var out bytes.Buffer
	lw := NewLogWriter(&out, time.Hour)
	opts := &slog.HandlerOptions{Level: slog.LevelWarn, ReplaceAttr: millis}
	json := newJSONHandler(lw, opts)
	for _, h := range []struct {
		name string
		h    slog.Handler
	}{{"json", json}, {"buffered", newFlushing(json, lw)}, {"group", newFlushing(json, lw).WithGroup("g")}} {
		ah, ok := h.h.(attrsHandler)
		if !ok {
			t.Fatalf("%s: no HandleAttrs", h.name)
		}
		for _, level := range []slog.Level{slog.LevelDebug, slog.LevelInfo} {
			if err := ah.HandleAttrs(context.Background(), at, level, "request", attrs); err != nil {
				t.Fatalf("%s at %v: %v", h.name, level, err)
			}
		}
		if err := ah.HandleAttrs(context.Background(), at, slog.LevelWarn, "request", attrs); err != nil {
			t.Fatalf("%s at warn: %v", h.name, err)
		}
		_ = lw.Flush()
		if n := strings.Count(out.String(), "\n"); n != 1 {
			t.Errorf("%s: %d lines written; want the warning's alone:\n%s", h.name, n, out.String())
		}
		out.Reset()
	}
}
