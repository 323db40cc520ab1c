// Package redistest runs a private redis-server for tests: AOF on, a free
// loopback port, its files in the test's temporary directory. It fails the
// test, never skips it, when redis-server is missing.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a running redis-server.
type Server struct {
	tb     testing.TB
	dir    string
	port   int
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited and been waited for
	Addr   string
}

// Start runs a redis-server until the test ends. A server that cannot
// have its port (another test's server or a client took it between
// freePorts and the bind) exits; Start then tries another port.
func Start(tb testing.TB) *Server {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		tb.Fatalf("redis-server is not installed (make test installs it): %v", err)
	}
	s := &Server{tb: tb, dir: tb.TempDir()}
	tb.Cleanup(s.Kill)
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(1)
		if err != nil {
			tb.Fatal(err)
		}
		s.port, s.Addr = ports[0], "127.0.0.1:"+strconv.Itoa(ports[0])
		err = s.start()
		if err == nil {
			return s
		}
		if !errors.Is(err, errNodeExited) || attempt == 3 {
			tb.Fatal(err)
		}
	}
}

func (s *Server) start() error {
	cmd, exited, err := runServer("--port", strconv.Itoa(s.port), "--dir", s.dir)
	if err != nil {
		return err
	}
	s.cmd, s.exited = cmd, exited
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := waitPing(ctx, s.Addr, cmd.Process.Pid, exited); err != nil {
		s.Kill()
		return err
	}
	return nil
}

// clientTimeout bounds a test client's dial, read and write. A server
// that is up answers in milliseconds, but on a loaded machine a busy disk
// can hold its AOF writes, and its answer, for seconds; a timed-out call
// fails the test (or is retried, running a script twice). A killed
// server fails its clients at once whatever the bound.
const clientTimeout = 10 * time.Second

// Client returns a new client of the server, closed when the test ends.
// It fails the test on a command that would span cluster slots
// (CheckSlots).
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, DialTimeout: clientTimeout, ReadTimeout: clientTimeout, WriteTimeout: clientTimeout})
	CheckSlots(s.tb, c)
	s.tb.Cleanup(func() { c.Close() })
	return c
}

// Kill stops the server with SIGKILL, as a crash would.
func (s *Server) Kill() {
	killServer(s.cmd, s.exited)
	s.cmd = nil
}

// runServer starts a redis-server with args and the flags every test
// server shares; exited is closed once it has exited and been waited for.
func runServer(args ...string) (cmd *exec.Cmd, exited chan struct{}, err error) {
	cmd = exec.Command("redis-server", append(args, "--bind", "127.0.0.1",
		"--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
		"--protected-mode", "no", "--loglevel", "warning")...)
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start redis-server: %w", err)
	}
	exited = make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	return cmd, exited, nil
}

// killServer stops a server runServer started with SIGKILL, as a crash
// would, and waits for it; a nil cmd is a server not running.
func killServer(cmd *exec.Cmd, exited <-chan struct{}) {
	if cmd != nil {
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Restart starts the server again on the same port and data directory.
// The port is free from the kill on, so another test may take it first,
// often only for a moment (a client connection's local port): the
// restart tries again for a while, then fails the test, saying so.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Kill()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := s.start()
		if err == nil {
			return
		}
		if !errors.Is(err, errNodeExited) || time.Now().After(deadline) {
			s.tb.Fatalf("restart %s on its port: %v", s, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// String names the server in test output.
func (s *Server) String() string { return fmt.Sprintf("redis-server %s", s.Addr) }
