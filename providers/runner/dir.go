package runner

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate/providers"
)

// ReadDir reads a command's directory on this host, with the semantics of
// the read script, for a provider that runs [Script] natively. alive
// reports whether the runner that recorded itself in FilePID still runs;
// a runner gone without an exit status was killed from outside, and its
// command reads as completed with exit code 137.
func ReadDir(dir string, maxOut int64, alive func() bool) (providers.CommandStatus, error) {
	var st providers.CommandStatus
	exists := func(name string) bool {
		_, err := os.Lstat(filepath.Join(dir, name))
		return err == nil
	}
	// modTime is when the runner, a cancel or the watchdog wrote name:
	// when the command finished, as near as the files tell.
	modTime := func(name string) time.Time {
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err != nil {
			return time.Time{}
		}
		return fi.ModTime()
	}
	if !exists(FileClaim) {
		return st, nil
	}
	// Whether the runner is gone is asked before any mark is read, as the
	// read script does: a runner found gone has written all it ever will.
	gone := !alive()
	switch b, err := os.ReadFile(filepath.Join(dir, FileExit)); {
	case err == nil:
		code, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return st, errors.New("runner: read: malformed exit status")
		}
		st.State, st.ExitCode, st.FinishedAt = providers.CommandCompleted, code, modTime(FileExit)
		// The watchdog marks its kill before it sends it; a runner outside
		// the killed group (a vendor's exec wrapper may lead its own) can
		// still record the exit after it. The command ended at its timeout
		// all the same.
		st.TimedOut = exists(FileTimedOut)
	case !errors.Is(err, fs.ErrNotExist):
		return st, fmt.Errorf("runner: read: %w", scrub(err))
	case exists(FileCancel):
		st.State, st.ExitCode, st.FinishedAt = providers.CommandCanceled, killed, modTime(FileCancel)
	case exists(FileTimedOut):
		st.State, st.ExitCode, st.TimedOut, st.FinishedAt = providers.CommandCompleted, killed, true, modTime(FileTimedOut)
	case !gone:
		st.State = providers.CommandRunning
		return st, nil
	default:
		st.State, st.ExitCode = providers.CommandCompleted, killed
	}
	maxOut = max(maxOut, 0)
	var err error
	if st.Stdout, st.StdoutBytes, err = readStream(dir, FileStdout, FileStdoutN, maxOut); err != nil {
		return providers.CommandStatus{}, err
	}
	if st.Stderr, st.StderrBytes, err = readStream(dir, FileStderr, FileStderrN, maxOut); err != nil {
		return providers.CommandStatus{}, err
	}
	st.StdoutTruncated = st.StdoutBytes > int64(len(st.Stdout))
	st.StderrTruncated = st.StderrBytes > int64(len(st.Stderr))
	return st, nil
}

// readStream returns at most max bytes of a stream's kept file and the
// stream's real total: the kept file's size plus the count of the rest.
func readStream(dir, kept, more string, max int64) ([]byte, int64, error) {
	f, err := os.Open(filepath.Join(dir, kept))
	if errors.Is(err, fs.ErrNotExist) {
		return []byte{}, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("runner: read: %w", scrub(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, fmt.Errorf("runner: read: %w", scrub(err))
	}
	b, err := io.ReadAll(io.LimitReader(f, max))
	if err != nil {
		return nil, 0, fmt.Errorf("runner: read: %w", scrub(err))
	}
	total := fi.Size()
	if m, err := os.ReadFile(filepath.Join(dir, more)); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(m)), 10, 64); err == nil && n > 0 {
			total += n
		}
	}
	return b, total, nil
}

// scrub drops the host path from a file-system error: errors never carry paths.
func scrub(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return err
}
