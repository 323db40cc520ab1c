package broker

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestLockDataDir: a second holder of a data directory is refused with the
// first one's pid, and the directory is free again once released.
func TestLockDataDir(t *testing.T) {
	dir := t.TempDir()
	release, err := LockDataDir(dir)
	if err != nil {
		t.Fatalf("LockDataDir: %v", err)
	}
	_, err = LockDataDir(dir)
	if !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("second LockDataDir = %v; want ErrDataDirInUse", err)
	}
	if want := fmt.Sprintf("pid %d", os.Getpid()); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), dir) {
		t.Errorf("second LockDataDir = %q; want it to name %q and %s", err, want, dir)
	}
	release()
	release2, err := LockDataDir(dir)
	if err != nil {
		t.Fatalf("LockDataDir after release: %v", err)
	}
	release2()
}
