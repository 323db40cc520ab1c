//go:build linux

package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local/internal/step"
)

// backgroundNice is the nice value of work no request waits for.
const backgroundNice = 10

// Disk quota: each workspace's /workspace, /root and /tmp live on one ext4
// file system of its own, a sparse image file (<ref>/disk.img), so writing
// past the tier's disk size fails with ENOSPC inside the sandbox, whoever
// writes. The image is never mounted on the host: each exec's step mounts
// it (mount(2) on a loop device, package step) in the mount namespace it
// makes for bwrap anyway, so the mount goes away with the exec, and nothing
// needs unmounting after a crash or mounting again after a reboot.
// Concurrent execs share one loop device and so one file system: the step
// reuses the loop device already bound to the same file, and the steps
// take a flock on the image around the mount so that two never bind one
// each. (mount(8) is still looked for: a durable command launched by an
// older broker passes it to the step, which no longer runs it.) We chose an image over
// project quotas because it needs nothing of the file system that holds
// the data directory (no prjquota mount option, any file system), counts
// every kind of block (directories, xattrs, inodes) the same way, and goes
// away with one unmount and one unlink. See README.md.
//
// The images are sparse, so that a workspace costs what it stores; the
// free-space reserve then needs accounting: a create is admitted only when
// the data directory's file system keeps Config.FreeReserveMiB free after
// every workspace of this data directory has grown to its full size
// (committed = apparent size - allocated blocks of each image), under one
// lock (<DataDir>/disk.lock) across broker processes.

// diskHost is what New found of this host's disk tools, and the data
// directory's template images.
type diskHost struct {
	mkfsBin, mount string

	dir string     // the template images' directory; "": none (copies are not made)
	mu  sync.Mutex // held while a template is looked up or made
}

// detectDisk finds mkfs.ext4 and mount. It returns nil and why when it
// cannot; New's probe then checks that an image really mounts.
func detectDisk() (*diskHost, string) {
	find := func(name string) string {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		for _, d := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
			if _, err := os.Stat(filepath.Join(d, name)); err == nil {
				return filepath.Join(d, name)
			}
		}
		return ""
	}
	h := &diskHost{mkfsBin: find("mkfs.ext4"), mount: find("mount")}
	switch {
	case h.mkfsBin == "":
		return nil, "disk: mkfs.ext4 (e2fsprogs) is missing, so workspaces cannot get a disk quota"
	case h.mount == "":
		return nil, "disk: mount (util-linux) is missing, so workspaces cannot get a disk quota"
	}
	return h, ""
}

// create makes the workspace's sparse image of mib MiB at l, with an ext4
// file system holding workspace/, home/ and tmp/: a copy of the data
// directory's template image of that size (template), whose directories
// are root's until the image's first mount gives them to uid (step.Stage.Mount),
// so the broker never mounts the image on the host. A copy is its few
// allocated blocks (about 400 KiB for 256 MiB); mkfs.ext4 writes the same
// and costs some milliseconds of CPU more, on every create. Where no
// template can be made or copied (a file system without SEEK_DATA), it
// runs mkfs for the image itself. A background one (the pool's refill)
// runs mkfs at a low CPU priority, so that it takes little from the
// requests it runs beside.
func (h *diskHost) create(ctx context.Context, l layout, mib, uid int, background bool) error {
	img := l.disk()
	tmpl, err := h.template(ctx, mib, background)
	if err == nil {
		if err = copySparse(tmpl, img); err == nil {
			return nil
		}
		os.Remove(img)
	}
	return h.mkfs(ctx, l, img, mib, uid, background)
}

// template returns the data directory's template image of mib MiB, made
// by mkfs the first time it is asked for. Broker processes that share the
// data directory may each make one; the last rename wins, and every one
// holds the same.
func (h *diskHost) template(ctx context.Context, mib int, background bool) (string, error) {
	if h.dir == "" {
		return "", errors.New("no template directory")
	}
	name := filepath.Join(h.dir, "ext4-"+strconv.Itoa(mib)+"m.img")
	h.mu.Lock()
	defer h.mu.Unlock()
	if fi, err := os.Stat(name); err == nil && fi.Size() == int64(mib)<<20 {
		return name, nil
	}
	if err := os.MkdirAll(h.dir, 0o700); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(h.dir, ".make-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	l := layout(tmp)
	if err := h.mkfs(ctx, l, l.disk(), mib, 0, background); err != nil {
		return "", err
	}
	if err := os.Rename(l.disk(), name); err != nil {
		return "", err
	}
	return name, nil
}

// copySparse copies the image src to dst, a new file, block for block
// where src has data and as holes where it has none.
func copySparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = copyData(in, out, fi.Size())
	step.SetLoopHint(out, -1) // a new inode: no loop device is bound to it
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// copyData copies in's data segments (SEEK_DATA, SEEK_HOLE) to the same
// offsets of out, and gives out in's size.
func copyData(in, out *os.File, size int64) error {
	if err := out.Truncate(size); err != nil {
		return err
	}
	buf := make([]byte, 256<<10)
	fd := int(in.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // nothing but a hole to the end
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		if _, err := io.CopyBuffer(io.NewOffsetWriter(out, data), io.NewSectionReader(in, data, hole-data), buf); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// mkfs makes the image img of mib MiB at l with mkfs.ext4, its
// directories owned by uid (mkfs -d copies them from a seed directory).
func (h *diskHost) mkfs(ctx context.Context, l layout, img string, mib, uid int, background bool) error {
	seed := filepath.Join(string(l), ".seed")
	if err := os.Mkdir(seed, 0o700); err != nil {
		return scrub(err)
	}
	defer os.RemoveAll(seed)
	sl := layout(seed)
	if err := sl.makeDirs(); err != nil {
		return scrub(err)
	}
	if err := sl.chownIf(uid); err != nil {
		return scrub(err)
	}
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return scrub(err)
	}
	err = f.Truncate(int64(mib) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return scrub(err)
	}
	// No reserved blocks (the sandbox's root is not the host's); inode
	// tables and journal are left as holes, which read as zeros.
	cmd := exec.CommandContext(ctx, h.mkfsBin, "-q", "-F", "-m", "0",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", "-d", seed, img)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Start()
	if err == nil {
		if background {
			_ = unix.Setpriority(unix.PRIO_PROCESS, cmd.Process.Pid, backgroundNice)
		}
		err = cmd.Wait()
	}
	if err != nil {
		return fmt.Errorf("mkfs.ext4: %w: %s", err, firstLine(out.Bytes()))
	}
	if f, err := os.OpenFile(img, os.O_RDWR, 0); err == nil {
		step.SetLoopHint(f, -1) // a new inode: no loop device is bound to it
		f.Close()
	}
	return nil
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}

// admitDisk takes the data directory's disk lock and checks that a new
// workspace of mib MiB leaves the reserve free once every workspace is
// full. Returns [providers.ErrNoCapacity] when it would not. On success the
// caller creates the image and then calls unlock.
func (p *Provider) admitDisk(ctx context.Context, mib int) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(p.dataDir, diskLock), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, scrub(err)
	}
	if err := flockWait(ctx, f, lockExclusive); err != nil {
		f.Close()
		return nil, err
	}
	unlock = func() {
		flock(int(f.Fd()), lockUnlock)
		f.Close()
	}
	// A workspace terminated a moment ago may still hold its image's space:
	// the kernel detaches a loop device after its image's last mount is
	// gone, and puts the image's file after that, from a work queue; the
	// space is free only then, and on a busy host that can take seconds.
	// While an image in the trash is still bound (for at most releaseWait
	// since it was first seen bound: one that stays bound is waited for
	// once, not by every create), or while Terminate still removes a
	// workspace's files in the background, and for releaseSettle after
	// the last one was, the check waits before it refuses. Each look at the trash comes
	// before the measure that follows it, so a release that ends in
	// between is in the measure.
	trash := filepath.Join(p.dataDir, trashDir) + "/"
	free, need, err := p.diskRoom(mib)
	var seen time.Time // when an image in the trash was last seen bound
	for err == nil && free < need {
		if now := time.Now(); p.released.pending(trash, now) || p.trashN.Load() > 0 {
			seen = now
		} else if now.Sub(seen) > releaseSettle {
			break
		}
		select {
		case <-ctx.Done():
			unlock()
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		free, need, err = p.diskRoom(mib)
	}
	if err != nil {
		unlock()
		return nil, err
	}
	if free < need {
		unlock()
		p.log.Warn("local workspace refused: disk reserve", "free_mib", free>>20, "needed_mib", need>>20)
		return nil, fmt.Errorf("local: create: the data directory's file system keeps its free-space reserve: %w", providers.ErrNoCapacity)
	}
	return unlock, nil
}

// releaseWait is how long after an image in the trash is first seen
// bound to a loop device a create waits for it (admitDisk): its space is
// on its way back for that long, and given up on after.
const releaseWait = 10 * time.Second

// releaseSettle is how long after its loop device is gone an image's
// space may take to come back.
const releaseSettle = time.Second

// diskRoom returns the data directory's free space and what a new
// workspace of mib MiB needs free: itself, what every image may still
// grow by, and the reserve.
func (p *Provider) diskRoom(mib int) (free, need int64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(p.dataDir, &st); err != nil {
		return 0, 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), int64(mib)<<20 + p.committed() + int64(p.cfg.FreeReserveMiB)<<20, nil
}

// releases remembers since when each image in the trash has been seen
// bound to a loop device, for admitDisk's wait.
type releases struct {
	mu    sync.Mutex
	wait  time.Duration        // releaseWait; tests shorten it
	since map[string]time.Time // backing file → when first seen bound
}

// pending reports whether a loop device is bound to an image under trash
// (a terminated workspace's, whose space the kernel has not given back
// yet) that was first seen bound less than the wait before now. It
// forgets the images no longer bound.
func (r *releases) pending(trash string, now time.Time) bool {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	r.mu.Lock()
	defer r.mu.Unlock()
	since := make(map[string]time.Time, len(r.since))
	pending := false
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || !strings.HasPrefix(string(b), trash) {
			continue
		}
		img := strings.TrimSpace(string(b))
		t, ok := r.since[img]
		if !ok {
			t = now
		}
		since[img] = t
		pending = pending || now.Sub(t) < r.wait
	}
	r.since = since
	return pending
}

// committed is what the images of this data directory, warm workspaces'
// included, may still grow by.
func (p *Provider) committed() int64 {
	images, _ := filepath.Glob(filepath.Join(p.dataDir, workspacesDir, "*", diskImage))
	pooled, _ := filepath.Glob(filepath.Join(p.dataDir, poolDir, "*", "*", diskImage))
	var n int64
	for _, img := range append(images, pooled...) {
		var st syscall.Stat_t
		if syscall.Stat(img, &st) != nil {
			continue
		}
		if left := st.Size - st.Blocks*512; left > 0 {
			n += left
		}
	}
	return n
}
