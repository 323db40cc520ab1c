package local

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestSparesWrite(t *testing.T) {
	dir := t.TempDir()
	s := openSpares(dir)
	if s == nil {
		t.Fatal("openSpares: nil")
	}
	if err := s.write(filepath.Join(dir, "a"), []byte("x"), 0o600, true); !errors.Is(err, errNoSpare) {
		t.Fatalf("write with no spare ready = %v; want errNoSpare", err)
	}
	for i := range 3 {
		name := filepath.Join(s.dir, "s"+string(rune('0'+i)))
		if err := makeSpare(name); err != nil {
			t.Fatal(err)
		}
		s.put(name)
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
	if got := len(s.ready); got != 0 {
		t.Errorf("spares left: %d; want each write to have used one", got)
	}
}

// Close removes a Provider's spares; the next one removes those of a
// Provider that died holding them, and keeps a live one's.
func TestSparesRemoved(t *testing.T) {
	dir := t.TempDir()
	live := openSpares(dir)
	dead := openSpares(dir)
	if live == nil || dead == nil {
		t.Fatal("openSpares: nil")
	}
	dead.lock.Close() // as a crash would: its flock goes
	ctx, stop := context.WithCancel(t.Context())
	ended := make(chan struct{})
	var q quiet
	go func() {
		defer close(ended)
		live.run(ctx, &q)
	}()
	next := openSpares(dir)
	if _, err := os.Stat(dead.dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a dead Provider's spares: %v; want them removed", err)
	}
	if _, err := os.Stat(live.dir); err != nil {
		t.Errorf("a live Provider's spares: %v; want them kept", err)
	}
	stop()
	<-ended
	if _, err := os.Stat(live.dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("spares after their Provider closed: %v; want them removed", err)
	}
	next.lock.Close()
}
