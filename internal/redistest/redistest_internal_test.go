package redistest

import (
	"errors"
	"testing"
)

// TestStartOnTakenPort starts a second server on the first one's port:
// the first answers there, but the second must not take that answer for
// its own. Before, it did, and its test then ran on another test's
// server until that one was killed.
func TestStartOnTakenPort(t *testing.T) {
	t.Parallel()
	first := Start(t)
	second := &Server{tb: t, dir: t.TempDir(), port: first.port, Addr: first.Addr}
	t.Cleanup(second.Kill)
	if err := second.start(); !errors.Is(err, errNodeExited) {
		t.Fatalf("start on %s's port: err = %v; want %v", first, err, errNodeExited)
	}
	if second.cmd != nil {
		t.Error("the second server is still recorded as running")
	}
	if err := first.Client().Ping(t.Context()).Err(); err != nil {
		t.Errorf("the first server after the second's try: %v", err)
	}
}
