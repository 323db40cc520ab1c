package redistest

import (
	"errors"
	"net"
	"testing"
	"time"
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

// TestRestartWaitsForItsPort: a restart whose port is held for a moment
// (as a client connection's local port can be) starts once it is free,
// rather than failing the test.
func TestRestartWaitsForItsPort(t *testing.T) {
	t.Parallel()
	s := Start(t)
	s.Kill()
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		t.Fatalf("hold %s: %v", s.Addr, err)
	}
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(300 * time.Millisecond)
		ln.Close()
	}()
	s.Restart()
	<-released
	if err := s.Client().Ping(t.Context()).Err(); err != nil {
		t.Errorf("ping after the restart: %v", err)
	}
}
