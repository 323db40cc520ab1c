// Package guesttest builds the sandgate-guest agent for tests of the
// vendor providers, once per test process.
package guesttest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

var (
	once sync.Once
	path string
	out  []byte
	err  error
)

// Binary returns the path of a sandgate-guest built from this checkout
// (static and stripped, as guests get it). The file lives until the
// test process exits; a build failure fails tb.
func Binary(tb testing.TB) string {
	tb.Helper()
	once.Do(func() {
		var dir string
		if dir, err = os.MkdirTemp("", "sandgate-guest-"); err != nil {
			return
		}
		_, self, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(self), "..", "..")
		path = filepath.Join(dir, "sandgate-guest")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", path, "./cmd/sandgate-guest")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err = cmd.CombinedOutput()
	})
	if err != nil {
		tb.Fatalf("go build ./cmd/sandgate-guest: %v\n%s", err, out)
	}
	return path
}
