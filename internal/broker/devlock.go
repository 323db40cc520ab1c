package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// DevLockFile is the lock file of a data directory in use by `sandgate
// dev`, holding the pid of the process that holds it.
const DevLockFile = "dev.lock"

// ErrDataDirInUse is returned by LockDataDir for a data directory another
// process holds.
var ErrDataDirInUse = errors.New("data directory in use")

// LockDataDir takes an exclusive flock on dir/dev.lock and writes this
// process's pid into it, so that a second `sandgate dev` on the same
// directory refuses to start instead of removing the first one's
// workspaces. The kernel releases the lock when the process exits or is
// killed; release drops it earlier. A held lock returns an error that
// wraps ErrDataDirInUse and names the holder's pid.
func LockDataDir(dir string) (release func(), err error) {
	path := filepath.Join(dir, DevLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder := "another process"
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil {
				holder = fmt.Sprintf("pid %d", pid)
			}
			return nil, fmt.Errorf("%w: %s is held by %s (another sandgate dev); stop it or pass another --data-dir", ErrDataDirInUse, dir, holder)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
