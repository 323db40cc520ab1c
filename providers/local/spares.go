package local

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Spare files: the small files a create, a take or a Terminate writes
// (labels.json, env.json, sandbox.json, uids/<uid>, deadlines/<ref>) are
// written into files made ahead, each with one block already allocated
// (fallocate), and linked into place. Allocating a new file's first block
// is most of what such a write costs: on the hosts of docs/benchmarks.md
// 0.4 to 0.6 ms, against 0.03 ms for writing into a spare and linking it,
// and a create writes five. The spares are made in the background, once
// no request has been in flight for a moment (quiet.go), as unnamed files
// of the data directory (O_TMPFILE) that only this process holds: they
// are in no directory until they are written, and the kernel frees them
// when the process ends, however it ends. A file written this way appears
// whole, when it is linked. With none ready, a write makes its file as
// before.

// spareWant is how many spares are kept ready: a few creates' worth.
const spareWant = 16

// spares is a Provider's stock of spare files.
type spares struct {
	dir string // the data directory: its file system is the files'

	mu    sync.Mutex
	ready []*os.File // each unnamed, with a block allocated
	kick  chan struct{}
}

func newSpares(dataDir string) *spares {
	return &spares{dir: dataDir, kick: make(chan struct{}, 1)}
}

// run keeps spareWant spares ready from the first take until ctx ends,
// making them when q says the requests pause; then it closes them. It
// returns early where the file system has no O_TMPFILE or fallocate:
// writes then make their files as before.
func (s *spares) run(ctx context.Context, q *quiet) {
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, f := range s.ready {
			f.Close()
		}
		s.ready = nil
	}()
	// None until the first small write asks for one: a Provider that
	// makes no workspace holds none.
	select {
	case <-ctx.Done():
		return
	case <-s.kick:
	}
	for {
		s.mu.Lock()
		short := len(s.ready) < spareWant
		s.mu.Unlock()
		if !short {
			select {
			case <-ctx.Done():
				return
			case <-s.kick:
			}
			continue
		}
		q.wait(ctx, refillGap, refillMaxWait)
		if ctx.Err() != nil {
			return
		}
		f, err := makeSpare(s.dir)
		if err != nil {
			return
		}
		s.mu.Lock()
		s.ready = append(s.ready, f)
		s.mu.Unlock()
	}
}

// makeSpare makes an unnamed file of dir's file system with one block.
func makeSpare(dir string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Fallocate(fd, 0, 0, 4096); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "spare"), nil
}

// take hands out a spare for the caller alone; nil when none is ready.
func (s *spares) take() *os.File {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
	if len(s.ready) == 0 {
		return nil
	}
	f := s.ready[len(s.ready)-1]
	s.ready = s.ready[:len(s.ready)-1]
	return f
}

// errNoSpare: none was ready, or it could not be used; the caller writes
// the file as before.
var errNoSpare = errors.New("no spare file")

// write writes data with mode into a spare and links it at name:
// replacing what is there, or, with exclusive, failing with fs.ErrExist
// when name exists. It returns errNoSpare, having written nothing at
// name, when no spare can be used.
func (s *spares) write(name string, data []byte, mode fs.FileMode, exclusive bool) error {
	if len(data) > 4096 {
		return errNoSpare
	}
	f := s.take()
	if f == nil {
		return errNoSpare
	}
	defer f.Close()
	if _, err := f.WriteAt(data, 0); err != nil {
		return errNoSpare
	}
	if f.Truncate(int64(len(data))) != nil || f.Chmod(mode) != nil {
		return errNoSpare
	}
	proc := "/proc/self/fd/" + strconv.Itoa(int(f.Fd()))
	if exclusive {
		err := unix.Linkat(unix.AT_FDCWD, proc, unix.AT_FDCWD, name, unix.AT_SYMLINK_FOLLOW)
		if errors.Is(err, unix.EEXIST) {
			return fs.ErrExist
		}
		if err != nil {
			return errNoSpare
		}
		return nil
	}
	// Linked beside name first, then renamed over it: a reader sees the
	// old file or the new one, never neither.
	tmp := filepath.Join(filepath.Dir(name), ".tmp-"+randomHex())
	if unix.Linkat(unix.AT_FDCWD, proc, unix.AT_FDCWD, tmp, unix.AT_SYMLINK_FOLLOW) != nil {
		return errNoSpare
	}
	if err := os.Rename(tmp, name); err != nil {
		os.Remove(tmp)
		return errNoSpare
	}
	return nil
}
