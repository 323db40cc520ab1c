package local

import (
	"os"
	"path/filepath"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/providers/local/internal/step"
)

// The supervisor is the broker's own binary run again, recognised here
// before main runs. (The durable command's step, the egress forwarder and
// the exec resident are recognised earlier, in the init of packages step,
// forward and residentd, which need little beyond system calls.)
func init() {
	if len(os.Args) > 0 && os.Args[0] == SupervisorName {
		os.Exit(runSupervisor(os.Args[1:]))
	}
}

// runSupervisor is the supervisor's main (see supervisor.go): args is the
// data directory. It returns the exit code.
func runSupervisor(args []string) int {
	if len(args) != 1 || !filepath.IsAbs(args[0]) {
		return step.ExitUsage
	}
	s := &supervisor{dataDir: args[0]}
	// The broker made the lock file before it started this process. The
	// supervisor creates no file in the data directory: one made while the
	// directory is being removed (a broker's tests end, an operator wipes
	// it) would make the removal fail.
	lock, err := os.OpenFile(filepath.Join(s.dataDir, supervisorLock), os.O_RDWR, 0)
	if err != nil {
		return 1
	}
	if flock(int(lock.Fd()), lockExclusive|lockNonBlock) != nil {
		return 0 // another one runs
	}
	// Held until the process exits; the descriptor is close-on-exec, and
	// the supervisor starts nothing anyway. Who holds it is written into
	// it: the pid and its start time.
	if start, err := procStart(os.Getpid()); err == nil {
		rec := strconv.Itoa(os.Getpid()) + " " + strconv.FormatUint(start, 10) + "\n"
		if lock.Truncate(0) == nil {
			_, _ = lock.WriteAt([]byte(rec), 0)
		}
	}

	// Watch first, then read: a deadline written in between is seen twice,
	// never missed.
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return 1
	}
	dir := filepath.Join(s.dataDir, deadlinesDir)
	const mask = unix.IN_MOVED_TO | unix.IN_CLOSE_WRITE | unix.IN_DELETE | unix.IN_MOVED_FROM |
		unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR
	if _, err := unix.InotifyAddWatch(fd, dir, mask); err != nil {
		return 1 // no deadlines directory: the data directory is gone
	}
	events := make(chan []string) // names of changed deadlines; nil: rescan
	gone := make(chan struct{})
	go readEvents(os.NewFile(uintptr(fd), "inotify"), events, gone)
	s.scan()

	var dirSt unix.Stat_t
	if err := unix.Stat(dir, &dirSt); err != nil {
		return 1
	}
	timer := time.NewTimer(time.Hour)
	var idle time.Time // since when it holds no deadline
	for {
		wait := s.due(time.Now())
		if len(s.deadlines) == 0 && idle.IsZero() {
			idle = time.Now()
		}
		if len(s.deadlines) > 0 {
			idle = time.Time{}
		} else if left := supervisorLinger - time.Since(idle); left > 0 {
			// Linger a while: a client that creates one workspace after
			// another then finds it running, rather than have each
			// create start it again (a fork and exec of the broker's
			// binary on the create's path).
			timer.Stop()
			timer.Reset(left)
			select {
			case <-gone:
				return 0
			case names := <-events:
				if names == nil {
					s.scan()
				}
				for _, n := range names {
					s.update(n)
				}
			case <-timer.C:
			}
			continue
		}
		if len(s.deadlines) == 0 {
			// Nothing to end: leave, so that no process is left for a data
			// directory without workspaces (or one removed, or unmounted,
			// which no inotify event tells while the lock file is open).
			// A Create that wrote a deadline and saw the lock held is not
			// lost: once unlocked, read the directory again, and stay if
			// it holds one (unless another supervisor took over).
			flock(int(lock.Fd()), lockUnlock)
			if names, _ := os.ReadDir(dir); !holdsDeadline(names) {
				return 0
			}
			if flock(int(lock.Fd()), lockExclusive|lockNonBlock) != nil {
				return 0 // another one runs
			}
			if s.scan(); len(s.deadlines) == 0 {
				return 0 // none readable
			}
			continue
		}
		if st := (unix.Stat_t{}); unix.Stat(dir, &st) != nil || st.Dev != dirSt.Dev || st.Ino != dirSt.Ino {
			return 0 // the data directory is gone, or another one is there
		}
		timer.Stop()
		var wake <-chan time.Time
		if wait >= 0 {
			timer.Reset(wait)
			wake = timer.C
		}
		select {
		case <-gone:
			return 0 // the data directory was removed: nothing left to end
		case names := <-events:
			if names == nil {
				s.scan()
			}
			for _, n := range names {
				s.update(n)
			}
		case <-wake:
		}
	}
}

// readEvents reads inotify events from f and sends the names they concern
// (nil after a queue overflow: read everything again). It closes gone when
// the watched directory is gone.
func readEvents(f *os.File, events chan<- []string, gone chan<- struct{}) {
	defer close(gone)
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if err != nil {
			return
		}
		var names []string
		overflow := false
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			switch {
			case ev.Mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_IGNORED) != 0:
				return
			case ev.Mask&unix.IN_Q_OVERFLOW != 0:
				overflow = true
			default:
				if i := indexNUL(name); i >= 0 {
					name = name[:i]
				}
				names = append(names, string(name))
			}
		}
		if overflow {
			names = nil
		} else if len(names) == 0 {
			continue
		}
		events <- names
	}
}

// holdsDeadline reports whether a listing of deadlines/ names a workspace.
func holdsDeadline(names []os.DirEntry) bool {
	for _, e := range names {
		if checkRef(e.Name()) == nil {
			return true
		}
	}
	return false
}

func indexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}
