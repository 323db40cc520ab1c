package telemetry

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// Keys of the span a log line was written in.
const (
	KeyTraceID = "trace_id"
	KeySpanID  = "span_id"
)

// spanIDs are the trace_id and span_id attributes of ctx's span, or false
// when ctx has no valid span context: a line written in a span names it,
// so that a log search leads to the trace and back.
func spanIDs(ctx context.Context) ([2]slog.Attr, bool) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return [2]slog.Attr{}, false
	}
	return [2]slog.Attr{slog.String(KeyTraceID, sc.TraceID().String()), slog.String(KeySpanID, sc.SpanID().String())}, true
}

// spanHandler adds spanIDs to the lines of a handler that does not add
// them itself (slog's text handler).
type spanHandler struct{ slog.Handler }

func (h spanHandler) Handle(ctx context.Context, r slog.Record) error {
	if ids, ok := spanIDs(ctx); ok {
		r = r.Clone()
		r.AddAttrs(ids[:]...)
	}
	return h.Handler.Handle(ctx, r)
}

func (h spanHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return spanHandler{h.Handler.WithAttrs(attrs)}
}

func (h spanHandler) WithGroup(name string) slog.Handler {
	return spanHandler{h.Handler.WithGroup(name)}
}
