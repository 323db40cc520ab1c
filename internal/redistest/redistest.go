// Package redistest runs a private redis-server for tests: AOF on, a free
// loopback port, its files in the test's temporary directory. It fails the
// test, never skips it, when redis-server is missing.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a running redis-server.
type Server struct {
	tb   testing.TB
	dir  string
	port int
	cmd  *exec.Cmd
	Addr string
}

// Start runs a redis-server until the test ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		tb.Fatalf("redis-server is not installed (make test installs it): %v", err)
	}
	s := &Server{tb: tb, dir: tb.TempDir(), port: freePort(tb)}
	s.Addr = "127.0.0.1:" + strconv.Itoa(s.port)
	s.start()
	tb.Cleanup(s.Kill)
	return s
}

func (s *Server) start() {
	s.tb.Helper()
	s.cmd = exec.Command("redis-server",
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
		"--protected-mode", "no", "--loglevel", "warning")
	if err := s.cmd.Start(); err != nil {
		s.tb.Fatalf("start redis-server: %v", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if i == 200 {
			s.tb.Fatalf("redis-server did not answer: %v", err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// Client returns a new client of the server, closed when the test ends.
// It fails the test on a command that would span cluster slots
// (CheckSlots).
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	CheckSlots(s.tb, c)
	s.tb.Cleanup(func() { c.Close() })
	return c
}

// Kill stops the server with SIGKILL, as a crash would.
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// Restart starts the server again on the same port and data directory.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Kill()
	s.start()
}

func freePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// String names the server in test output.
func (s *Server) String() string { return fmt.Sprintf("redis-server %s", s.Addr) }
