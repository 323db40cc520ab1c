package telemetry_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/telemetry"
)

// lockedBuffer records what a LogWriter writes, and in how many writes.
type lockedBuffer struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	writes int
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.writes++
	return b.buf.Write(p)
}

func (b *lockedBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Split(strings.TrimSuffix(b.buf.String(), "\n"), "\n")
}

// TestBufferedLoggerWarnFlushes: info lines may wait, but a warning is
// written before its call returns, with every line before it, in order;
// Close writes the rest, and lines after Close go straight through.
func TestBufferedLoggerWarnFlushes(t *testing.T) {
	var out lockedBuffer
	log, lw, err := telemetry.NewBufferedLogger(&out, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	log = log.With("component", "gateway")
	for i := range 3 {
		log.Info("request", "n", i, "duration", 1500*time.Microsecond)
	}
	log.Warn("redis client")
	got := out.lines()
	if len(got) != 4 {
		t.Fatalf("after a warning: %d lines %q; want the 3 info lines and the warning", len(got), got)
	}
	for i, want := range []string{`"level":"INFO","msg":"request","component":"gateway","n":0,"duration_ms":1.5}`,
		`"n":1,`, `"n":2,`, `"level":"WARN","msg":"redis client"`} {
		if !strings.Contains(got[i], want) {
			t.Errorf("line %d = %s; want it to contain %s", i, got[i], want)
		}
	}
	log.Info("last")
	if err := lw.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := out.lines(); len(got) != 5 || !strings.Contains(got[4], `"msg":"last"`) {
		t.Errorf("after Close: %q; want the last line written", got)
	}
	log.Info("after")
	if got := out.lines(); len(got) != 6 || !strings.Contains(got[5], `"msg":"after"`) {
		t.Errorf("a line after Close: %q; want it written at once", got)
	}
}

// TestLogWriterLingers: a line held by a LogWriter is written without a
// Flush, within the linger; many lines written together cost few writes.
func TestLogWriterLingers(t *testing.T) {
	var out lockedBuffer
	lw := telemetry.NewLogWriter(&out, 50*time.Millisecond)
	log := slog.New(slog.NewJSONHandler(lw, nil))
	for range 100 {
		log.Info("request")
	}
	for i := 0; len(out.lines()) < 100; i++ {
		if i == 1000 {
			t.Fatalf("lines never written: %d of 100", len(out.lines()))
		}
		time.Sleep(5 * time.Millisecond)
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	if out.writes >= 100 {
		t.Errorf("100 lines cost %d writes; want them coalesced", out.writes)
	}
}

// TestLogWriterFull: once LogMaxBuffered bytes wait they are written
// without waiting for the linger (by the timer, not the line's caller);
// every line is written once, in order, however many wait.
func TestLogWriterFull(t *testing.T) {
	var out lockedBuffer
	lw := telemetry.NewLogWriter(&out, time.Hour)
	line := func(i int) []byte { return fmt.Appendf(nil, "%06d %s\n", i, strings.Repeat("x", 1000)) }
	n := 0
	for ; n*len(line(0)) < telemetry.LogMaxBuffered; n++ {
		if _, err := lw.Write(line(n)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; len(out.lines()) < n; i++ {
		if i == 1000 {
			t.Fatalf("%d of %d lines written after %d bytes waited; want all, without the hour's linger", len(out.lines()), n, telemetry.LogMaxBuffered)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for total := 5 * n; n < total; n++ { // past four times LogMaxBuffered, written meanwhile
		if _, err := lw.Write(line(n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := lw.Close(); err != nil {
		t.Fatal(err)
	}
	got := out.lines()
	if len(got) != n {
		t.Fatalf("after Close: %d lines; want %d", len(got), n)
	}
	for i, l := range got {
		if want := string(line(i)); l+"\n" != want {
			t.Fatalf("line %d = %.10s…; want %.10s…: every line once, in order", i, l, want)
		}
	}
}
