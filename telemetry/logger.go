package telemetry

import (
	"fmt"
	"io"
	"log/slog"
	"time"
)

// NewLogger returns the process's structured logger writing to w: format
// "json" (the default) or "text", at level ("debug", "info", "warn",
// "error"). A duration attribute is written in milliseconds with the unit
// in its key: "duration" becomes "duration_ms": 12.5. It is the one
// logger constructor, so that what tests and benchmarks log through is what
// `sandgate serve` logs through.
func NewLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: l, ReplaceAttr: millis}
	switch format {
	case "", "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want json or text", format)
}

// millis writes durations as milliseconds, the unit in the key.
func millis(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.Float64(a.Key+"_ms", float64(a.Value.Duration())/float64(time.Millisecond))
	}
	return a
}
