package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// TestLogLinesNameTheirSpan: a line logged in a valid span carries its
// trace_id and span_id, in every format and through the access log's
// HandleAttrs and a LogWriter; a line without a span carries neither.
func TestLogLinesNameTheirSpan(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	const wantTrace, wantSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	inSpan := trace.ContextWithSpanContext(context.Background(), sc)
	// An invalid span context (zero ids) is no span.
	invalid := trace.ContextWithSpanContext(context.Background(), trace.SpanContext{})

	type logFn func(ctx context.Context, l *slog.Logger)
	ways := map[string]logFn{
		"Info": func(ctx context.Context, l *slog.Logger) {
			l.InfoContext(ctx, "hello", slog.String("k", "v"))
		},
		"slow path": func(ctx context.Context, l *slog.Logger) {
			l.With(slog.Group("g", slog.String("a", `q"uote`))).InfoContext(ctx, "hello")
		},
		"HandleAttrs": func(ctx context.Context, l *slog.Logger) {
			h := l.Handler().(attrsHandler)
			if err := h.HandleAttrs(ctx, time.Now(), slog.LevelInfo, "request", []slog.Attr{slog.Int("status", 200)}); err != nil {
				t.Fatal(err)
			}
		},
	}
	for _, format := range []string{"json", "text"} {
		for name, log := range ways {
			if name == "HandleAttrs" && format == "text" {
				continue // the text handler has no HandleAttrs
			}
			for _, buffered := range []bool{false, true} {
				var out bytes.Buffer
				l, lw, err := logger(&out, format, buffered)
				if err != nil {
					t.Fatal(err)
				}
				log(inSpan, l)
				log(context.Background(), l)
				log(invalid, l)
				if lw != nil {
					if err := lw.Close(); err != nil {
						t.Fatal(err)
					}
				}
				lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
				if len(lines) != 3 {
					t.Fatalf("%s %s buffered=%v: %d lines, want 3: %q", format, name, buffered, len(lines), out.String())
				}
				tr, sp := ids(t, format, lines[0])
				if tr != wantTrace || sp != wantSpan {
					t.Errorf("%s %s buffered=%v: in a span, trace_id %q span_id %q, want %q %q: %s", format, name, buffered, tr, sp, wantTrace, wantSpan, lines[0])
				}
				for _, line := range lines[1:] {
					if tr, sp := ids(t, format, line); tr != "" || sp != "" {
						t.Errorf("%s %s buffered=%v: without a span, trace_id %q span_id %q: %s", format, name, buffered, tr, sp, line)
					}
				}
			}
		}
	}
}

func logger(w *bytes.Buffer, format string, buffered bool) (*slog.Logger, *LogWriter, error) {
	if buffered {
		return NewBufferedLogger(w, "info", format)
	}
	l, err := NewLogger(w, "info", format)
	return l, nil, err
}

// ids are the trace_id and span_id of one line.
func ids(t *testing.T, format, line string) (traceID, spanID string) {
	t.Helper()
	if format == "json" {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		traceID, _ = m[KeyTraceID].(string)
		spanID, _ = m[KeySpanID].(string)
		return traceID, spanID
	}
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, KeyTraceID+"="); ok {
			traceID = v
		}
		if v, ok := strings.CutPrefix(f, KeySpanID+"="); ok {
			spanID = v
		}
	}
	return traceID, spanID
}
