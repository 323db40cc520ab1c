package local

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Spare files: the small files a create, a take or a Terminate writes
// (labels.json, env.json, sandbox.json, uids/<uid>, deadlines/<ref>) are
// written into files made ahead, each with one block already allocated
// (fallocate), and renamed into place. Allocating a new file's first block
// is most of what such a write costs: on the hosts of docs/benchmarks.md
// 0.4 to 0.6 ms, against 0.03 ms for the write and rename of a spare, and
// a create writes five. The spares are made in the background, once no
// request has been in flight for a moment (quiet.go). A file written this
// way appears whole, at its rename; with none left, a write makes its file
// as before.
//
// The spares live in <DataDir>/spares/<owner>/, <owner> random per
// Provider and held by an flock on spares/<owner>.lock, as the pool's
// directory is; New removes those of every owner whose lock it can take,
// Close its own.

const (
	sparesDir = "spares"
	spareWant = 16 // spares kept ready: a few creates' worth
)

// spares is a Provider's stock of spare files.
type spares struct {
	dir  string   // <DataDir>/spares/<owner>
	lock *os.File // flock'ed while the Provider lives

	mu    sync.Mutex
	ready []string // names in dir, each with a block allocated
	seq   int
	kick  chan struct{}
}

// openSpares makes the Provider's spare directory and removes those of
// gone Providers. It returns nil when it cannot: writes then make their
// files as before.
func openSpares(dataDir string) *spares {
	root := filepath.Join(dataDir, sparesDir)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil
	}
	locks, _ := filepath.Glob(filepath.Join(root, "*.lock"))
	for _, name := range locks {
		f, err := os.OpenFile(name, os.O_RDWR, 0)
		if err != nil {
			continue
		}
		if flock(int(f.Fd()), lockExclusive|lockNonBlock) == nil { // its Provider is gone
			if removeAll(strings.TrimSuffix(name, ".lock")) == nil {
				os.Remove(name)
			}
		}
		f.Close()
	}
	owner := randomHex()
	lock, err := os.OpenFile(filepath.Join(root, owner+".lock"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil
	}
	if flock(int(lock.Fd()), lockExclusive|lockNonBlock) != nil {
		lock.Close()
		return nil
	}
	dir := filepath.Join(root, owner)
	if err := os.Mkdir(dir, 0o700); err != nil {
		lock.Close()
		return nil
	}
	return &spares{dir: dir, lock: lock, kick: make(chan struct{}, 1)}
}

// run keeps spareWant spares ready until ctx ends, making them when q
// says the requests pause; then it removes the directory.
func (s *spares) run(ctx context.Context, q *quiet) {
	defer func() {
		removeAll(s.dir)
		os.Remove(s.dir + ".lock")
		s.lock.Close()
	}()
	for {
		s.mu.Lock()
		short := len(s.ready) < spareWant
		s.seq++
		name := filepath.Join(s.dir, strconv.Itoa(s.seq))
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
		if err := makeSpare(name); err != nil {
			return // a full disk, say: writes make their files as before
		}
		s.mu.Lock()
		s.ready = append(s.ready, name)
		s.mu.Unlock()
	}
}

func makeSpare(name string) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, 4096)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(name)
	}
	return err
}

// take hands out a spare for the caller alone; "" when none is ready.
func (s *spares) take() string {
	if s == nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
	if len(s.ready) == 0 {
		return ""
	}
	name := s.ready[len(s.ready)-1]
	s.ready = s.ready[:len(s.ready)-1]
	return name
}

// put gives back a spare that was taken and not used.
func (s *spares) put(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ready = append(s.ready, name)
}

// errNoSpare: none was ready, or it could not be used; the caller writes
// the file as before.
var errNoSpare = errors.New("no spare file")

// write writes data with mode into a spare and renames it to name:
// replacing what is there, or, with exclusive, failing with fs.ErrExist
// when name exists. It returns errNoSpare, having written nothing, when
// no spare can be used.
func (s *spares) write(name string, data []byte, mode fs.FileMode, exclusive bool) error {
	spare := s.take()
	if spare == "" {
		return errNoSpare
	}
	if len(data) > 4096 {
		s.put(spare)
		return errNoSpare
	}
	f, err := os.OpenFile(spare, os.O_WRONLY, 0)
	if err != nil {
		return errNoSpare // gone: made again by run
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Truncate(int64(len(data)))
	}
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		var flags uint
		if exclusive {
			flags = unix.RENAME_NOREPLACE
		}
		err = unix.Renameat2(unix.AT_FDCWD, spare, unix.AT_FDCWD, name, flags)
		if errors.Is(err, unix.EEXIST) {
			os.Remove(spare)
			return fs.ErrExist
		}
		if err == nil {
			return nil
		}
	}
	os.Remove(spare)
	return errNoSpare
}
