package local

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestSparesWrite(t *testing.T) {
	dir := t.TempDir()
	s := newSpares(dir)
	if err := s.write(filepath.Join(dir, "a"), []byte("x"), 0o600, true); !errors.Is(err, errNoSpare) {
		t.Fatalf("write with no spare ready = %v; want errNoSpare", err)
	}
	for range 3 {
		f, err := makeSpare(dir)
		if err != nil {
			t.Fatalf("makeSpare: %v", err)
		}
		s.ready = append(s.ready, f)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("spares show in their directory: %v; want none", entries)
	}
	a := filepath.Join(dir, "a")
	if err := s.write(a, []byte(`{"k":"v"}`), 0o640, true); err != nil {
		t.Fatalf("write a: %v", err)
	}
	if err := s.write(a, []byte("other"), 0o600, true); !errors.Is(err, fs.ErrExist) {
		t.Errorf("exclusive write over an existing file = %v; want fs.ErrExist", err)
	}
	b, err := os.ReadFile(a)
	if fi, _ := os.Stat(a); err != nil || string(b) != `{"k":"v"}` || fi.Mode().Perm() != 0o640 {
		t.Errorf("a holds %q (%v), mode %v; want the first write's bytes alone, 0640", b, err, fi.Mode().Perm())
	}
	if err := s.write(a, []byte("new"), 0o600, false); err != nil {
		t.Fatalf("replacing write: %v", err)
	}
	if b, _ := os.ReadFile(a); string(b) != "new" {
		t.Errorf("after the replacing write a holds %q; want %q", b, "new")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("directory after the writes: %v; want a alone", entries)
	}
	if got := len(s.ready); got != 0 {
		t.Errorf("spares left: %d; want each write to have used one", got)
	}
}

// run makes spares only once a write has asked for one, keeps them out of
// every directory, and closes them when it ends.
func TestSparesRun(t *testing.T) {
	dir := t.TempDir()
	s := newSpares(dir)
	ctx, stop := context.WithCancel(t.Context())
	ended := make(chan struct{})
	var q quiet
	go func() {
		defer close(ended)
		s.run(ctx, &q)
	}()
	if err := s.write(filepath.Join(dir, "first"), []byte("x"), 0o600, true); !errors.Is(err, errNoSpare) {
		t.Fatalf("first write = %v; want errNoSpare (none made before it)", err)
	}
	for {
		s.mu.Lock()
		n := len(s.ready)
		s.mu.Unlock()
		if n == spareWant {
			break
		}
		select {
		case <-ended:
			t.Fatal("run ended before it had made its spares")
		case <-time.After(time.Millisecond):
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("directory with %d spares ready: %v; want it empty", spareWant, entries)
	}
	stop()
	<-ended
	if len(s.ready) != 0 {
		t.Errorf("spares after run ended: %d; want them closed", len(s.ready))
	}
}
