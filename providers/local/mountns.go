package local

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"time"
)

// Each workspace's staged directories (stage: the tmpfs on the stage
// directory, the disk image's mount, the binds) live in a mount namespace
// that the Provider keeps while the workspace runs execs, so that an exec
// joins it (setns) instead of mounting the image anew and unmounting it
// when it ends. Nothing of it is mounted on the host: the namespace exists
// only as long as a descriptor of it is open, in this process alone, or a
// process is in it. So a broker that dies, however, leaves nothing behind:
// the kernel closes the descriptor, ends the namespace, unmounts the image
// and clears its loop device. The Provider closes a namespace nobody used
// for nsIdle, at Terminate (off the request path, before the workspace's
// files go; a create's disk check waits for that space) and at Close. See
// README.md, "Disk".

// nsIdle is how long a workspace's mount namespace is kept after its last
// exec. It holds a private copy of the host's mounts as they were when it
// was made: a host file system unmounted meanwhile stays busy until then.
const nsIdle = 30 * time.Second

// heldNS is one workspace's mount namespace.
type heldNS struct {
	ref   string
	opts  stepOptions   // what stage did in it
	ready chan struct{} // closed once fd or err is set
	fd    *os.File      // the namespace (/proc/thread-self/ns/mnt of its maker)
	err   error
	users int       // execs between acquire and release; under nsMu
	last  time.Time // when users last fell to 0; under nsMu
}

// nsTable is a Provider's held namespaces.
type nsTable struct {
	mu sync.Mutex
	m  map[string]*heldNS // ref → its namespace

	closeFD func(*os.File) // closes a namespace's descriptor: closeNS; tests slow it down
}

// close closes a namespace's descriptor taken out of the table, never
// under t.mu.
func (t *nsTable) close(fd *os.File) {
	if t.closeFD != nil && fd != nil {
		t.closeFD(fd)
		return
	}
	closeNS(fd)
}

// acquire returns the mount namespace staged with o for ref, making it
// when there is none (or o changed), and a release to call once the exec
// has ended. ref "" (New's probe) gets a namespace of its own, closed by
// release.
func (t *nsTable) acquire(ref string, o stepOptions) (*os.File, func(), error) {
	if ref == "" {
		fd, err := makeNS(o)
		if err != nil {
			return nil, nil, err
		}
		return fd, func() { fd.Close() }, nil
	}
	t.mu.Lock()
	if t.m == nil {
		t.m = make(map[string]*heldNS)
	}
	var stale *os.File
	h := t.m[ref]
	if h != nil && !sameStage(h.opts, o) {
		stale = t.dropLocked(ref)
		h = nil
	}
	if h == nil {
		h = &heldNS{ref: ref, opts: o, ready: make(chan struct{})}
		t.m[ref] = h
		go func() {
			h.fd, h.err = makeNS(o)
			close(h.ready)
		}()
	}
	h.users++
	t.mu.Unlock()
	t.close(stale)
	<-h.ready
	if h.err != nil {
		t.mu.Lock()
		h.users--
		if t.m[ref] == h {
			delete(t.m, ref) // the next exec tries again
		}
		t.mu.Unlock()
		return nil, nil, h.err
	}
	release := func() {
		var fd *os.File
		t.mu.Lock()
		if h.users--; h.users == 0 {
			h.last = time.Now()
			if t.m[h.ref] != h {
				// Dropped meanwhile: nobody else will close it.
				fd = takeFD(h)
			}
		}
		t.mu.Unlock()
		t.close(fd)
	}
	return h.fd, release, nil
}

// sameStage reports whether a and b stage the same things.
func sameStage(a, b stepOptions) bool {
	return a.Dir == b.Dir && a.Disk == b.Disk && slices.Equal(a.Binds, b.Binds) && sameRoot(a.root, b.root)
}

// rekey moves from's namespace to to, whose directory from's now is (a
// pooled workspace a create took): opts turns its options into those an
// exec of to asks for, which stage the same files.
func (t *nsTable) rekey(from, to string, opts func(stepOptions) stepOptions) {
	t.mu.Lock()
	h := t.m[from]
	if h == nil {
		t.mu.Unlock()
		return
	}
	delete(t.m, from)
	stale := t.dropLocked(to) // none: to is new
	h.ref, h.opts = to, opts(h.opts)
	t.m[to] = h
	t.mu.Unlock()
	t.close(stale)
}

// drop closes ref's namespace (an exec using it keeps it until it ends).
func (t *nsTable) drop(ref string) {
	t.mu.Lock()
	fd := t.dropLocked(ref)
	t.mu.Unlock()
	t.close(fd)
}

// detach takes ref's namespace out of the table, as drop does, and hands
// its descriptor to the caller to close: the kernel unmounts the image
// then, which takes milliseconds. It returns nil when there is none, or
// when an exec still uses it (its release closes it).
func (t *nsTable) detach(ref string) *os.File {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.m[ref]
	if h == nil {
		return nil
	}
	delete(t.m, ref)
	if h.users > 0 {
		return nil
	}
	return takeFD(h)
}

// closeNS closes a descriptor detach returned, if any.
func closeNS(fd *os.File) {
	if fd != nil {
		fd.Close()
	}
}

// dropLocked takes ref's namespace out of the table; t.mu is held. It
// returns its descriptor for the caller to close once t.mu is released
// (closeNS), or nil when there is none or an exec still uses it (whose
// release closes it). When no process is left in the namespace, the kernel
// ends it at that close, unmounting the image: milliseconds, which must
// not hold up every exec and take waiting for t.mu.
func (t *nsTable) dropLocked(ref string) *os.File {
	h := t.m[ref]
	if h == nil {
		return nil
	}
	delete(t.m, ref)
	if h.users > 0 {
		return nil
	}
	return takeFD(h)
}

// takeFD takes h's descriptor out of h, for the caller to close; under t.mu.
func takeFD(h *heldNS) *os.File {
	fd := h.fd
	h.fd = nil
	return fd
}

// sweep closes the namespaces unused since before cutoff; all of them
// when cutoff is zero.
func (t *nsTable) sweep(cutoff time.Time) {
	var fds []*os.File
	t.mu.Lock()
	for ref, h := range t.m {
		if h.users == 0 && (cutoff.IsZero() || h.last.Before(cutoff)) {
			fds = append(fds, t.dropLocked(ref))
		}
	}
	t.mu.Unlock()
	for _, fd := range fds {
		t.close(fd)
	}
}

// run closes idle namespaces until stop is closed, then all of them.
func (t *nsTable) run(stop <-chan struct{}) {
	tick := time.NewTicker(nsIdle / 3)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			t.sweep(time.Time{})
			return
		case now := <-tick.C:
			t.sweep(now.Add(-nsIdle))
		}
	}
}

// makeNS stages o in a new mount namespace, made by an OS thread of its
// own (onSpareThread), and returns a descriptor of it. The thread ends
// with its goroutine, and the namespace lives on in the descriptor.
func makeNS(o stepOptions) (*os.File, error) {
	type result struct {
		fd  *os.File
		err error
	}
	done := make(chan result, 1)
	onSpareThread(func() {
		if err := stage(o); err != nil {
			done <- result{nil, fmt.Errorf("stage: %w", scrub(err))}
			return
		}
		fd, err := os.Open("/proc/thread-self/ns/mnt")
		if err != nil {
			err = fmt.Errorf("stage: %w", scrub(err))
		}
		done <- result{fd, err}
	})
	r := <-done
	return r.fd, r.err
}
