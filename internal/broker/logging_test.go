package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestLoggerDurationsInMillis: a duration is written in milliseconds, the
// unit in its key, in both formats; an unknown format is an error.
func TestLoggerDurationsInMillis(t *testing.T) {
	var buf bytes.Buffer
	log, err := newLoggerTo(&buf, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("x", slog.Duration("duration", 1500*time.Microsecond))
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("json log line %q: %v", buf.String(), err)
	}
	if line["duration_ms"] != 1.5 || line["duration"] != nil {
		t.Errorf("json line = %v; want duration_ms 1.5 and no duration", line)
	}
	buf.Reset()
	log, err = newLoggerTo(&buf, "debug", "text")
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("x", slog.Duration("wait", 2*time.Second))
	if !strings.Contains(buf.String(), "wait_ms=2000") {
		t.Errorf("text line = %q; want wait_ms=2000", buf.String())
	}
	if _, err := newLoggerTo(&buf, "info", "xml"); err == nil {
		t.Errorf("newLogger with format xml succeeded; want an error")
	}
}

// TestRedisLoggerIsStructured: a go-redis message becomes one structured
// line of the process's log.
func TestRedisLoggerIsStructured(t *testing.T) {
	var buf bytes.Buffer
	log, _ := newLoggerTo(&buf, "info", "json")
	redisLogger{log: log}.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts", 5)
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("line %q: %v", buf.String(), err)
	}
	if line["msg"] != "redis client" || line["detail"] != "connection pool: failed to dial after 5 attempts" || line["level"] != "WARN" {
		t.Errorf("line = %v", line)
	}
}
