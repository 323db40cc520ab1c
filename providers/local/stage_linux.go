package local

import (
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/providers/local/internal/step"
)

// stage gives the calling thread (locked, and never given back to the Go
// runtime) a mount namespace of its own in which o.Stage is staged and,
// for a workspace's namespace, o.root is built below it (stageRoot), with
// the host's mounts it does not need detached first (trimMounts).
func stage(o stepOptions) error {
	if err := step.NewNS(); err != nil {
		return err
	}
	if o.root != nil {
		if err := trimMounts(o.root.keepPaths, o.root.keepTrees); err != nil {
			return err
		}
	}
	if err := o.Stage.Mount(); err != nil {
		return err
	}
	if o.root != nil {
		if err := stageRoot(o.Dir+"/"+rootName, o.root); err != nil {
			return err
		}
		if o.Disk != "" {
			// Bound into the root tree, which keeps the file system (and
			// its loop device) mounted: one mount fewer for every exec.
			if err := unix.Unmount(o.Dir+"/d", unix.MNT_DETACH); err != nil {
				return fmt.Errorf("unmount: %w", err)
			}
		}
	}
	return nil
}

// jobLimits are j's resource limits (rlimitArgs, for the step of a
// durable command, says the same); see README.md for why RLIMIT_DATA and
// not RLIMIT_AS.
func jobLimits(j job) []step.Rlimit {
	l := []step.Rlimit{
		{Resource: unix.RLIMIT_CORE, Value: 0}, // no core files written where a host helper might read them
	}
	data := j.memory
	if j.perCommandData {
		data = max(data, residentData)
	}
	l = append(l, step.Rlimit{Resource: unix.RLIMIT_DATA, Value: uint64(data)})
	if j.fsize > 0 {
		l = append(l, step.Rlimit{Resource: unix.RLIMIT_FSIZE, Value: uint64(j.fsize)})
	}
	return l
}

// trimMounts detaches, in the calling thread's mount namespace (a private
// copy of the host's, made for a workspace), every mount that is neither on
// the way to one of paths nor on the way to or below one of trees: /sys
// and whatever else of the host bwrap and the sandbox's root tree never
// use. Every mount a namespace holds costs each exec that clones it, and
// bwrap reads them all each time it binds something. Mounts are detached
// top-most first; a detached mount takes those below it along.
func trimMounts(paths, trees []string) error {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return fmt.Errorf("mountinfo: %w", scrub(err))
	}
	// within reports whether p is dir or below it.
	within := func(p, dir string) bool {
		return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
	}
	var drop []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		keep := mp == "/"
		for _, p := range paths {
			keep = keep || within(p, mp)
		}
		for _, t := range trees {
			keep = keep || within(t, mp) || within(mp, t)
		}
		if !keep && !slices.Contains(drop, mp) {
			drop = append(drop, mp)
		}
	}
	slices.SortFunc(drop, func(a, b string) int { return len(a) - len(b) })
	for _, mp := range drop {
		// Until it is no mount point any more: mounts may be stacked. It
		// may already be gone with one above it.
		for range 64 {
			if unix.Unmount(mp, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW) != nil {
				break
			}
		}
	}
	return nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space …).
func unescapeMount(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// rootTreesWork reports whether this kernel has mount_setattr(2) (Linux
// 5.12), which stageRoot needs.
func rootTreesWork() bool {
	err := unix.MountSetattr(-1, "", 0, &unix.MountAttr{})
	return !errors.Is(err, unix.ENOSYS)
}

// stageRoot builds the sandbox's root tree t on dir, below the stage: a
// small tmpfs owned by the sandbox's root, holding /usr and the top-level
// links into it, /etc and the workspace's directories bound as an exec's
// bwrap would bind them (read-only, or read-write; never set-user-ID or a
// device), and empty mount points for /proc, /dev and the egress binds;
// then the tmpfs itself is made read-only. An exec's bwrap binds it as its
// / with one bind instead of one for each (every one of which reads the
// whole mount table again) and mounts a fresh /proc, /dev and /dev/shm of
// its own on it. The flags are set with mount_setattr(2), on every mount
// below a bind too, as bwrap does; the mounts are made in the workspace's
// namespace, owned by the host's user namespace, so no sandbox can undo
// them.
func stageRoot(dir string, t *rootTree) error {
	if t.image != nil {
		return stageImageRoot(dir, t)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("mkdir: %w", scrub(err))
	}
	owner := strconv.Itoa(t.owner)
	if err := unix.Mount("sandgate-root", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=64k,nr_inodes=64,uid="+owner+",gid="+owner); err != nil {
		return fmt.Errorf("root tmpfs: %w", err)
	}
	mk := func(name string, file bool) error {
		p := dir + name
		var err error
		if file {
			var f *os.File
			if f, err = os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644); err == nil {
				err = f.Close()
			}
		} else {
			err = os.Mkdir(p, 0o755)
		}
		if err == nil {
			err = os.Lchown(p, t.owner, t.owner)
		}
		if err != nil {
			return fmt.Errorf("root: %w", scrub(err))
		}
		return nil
	}
	for _, l := range t.usrLinks {
		if l.target == "" {
			continue // a directory of its own, bound below
		}
		if err := os.Symlink(l.target, dir+l.name); err != nil {
			return fmt.Errorf("root: %w", scrub(err))
		}
		if err := os.Lchown(dir+l.name, t.owner, t.owner); err != nil {
			return fmt.Errorf("root: %w", scrub(err))
		}
	}
	for _, name := range []string{"/proc", "/dev"} {
		if err := mk(name, false); err != nil {
			return err
		}
	}
	if t.egress {
		// /run/sandgate/forward (a file) and /run/sandgate/egress, with
		// their parents.
		for _, name := range []string{forwardBin, egressMount} {
			var parts []string
			for d := path.Dir(name); d != "/"; d = path.Dir(d) {
				parts = append(parts, d)
			}
			slices.Reverse(parts)
			for _, d := range parts {
				if _, err := os.Lstat(dir + d); err == nil {
					continue
				}
				if err := mk(d, false); err != nil {
					return err
				}
			}
			if err := mk(name, name == forwardBin); err != nil {
				return err
			}
		}
	}
	if err := bindAll(dir, t.binds, false, mk); err != nil {
		return err
	}
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("root: read-only: %w", err)
	}
	return nil
}

// bindAll binds each of binds (directories; files when file is set) on its
// mount point below dir, which mk makes.
func bindAll(dir string, binds []rootBind, file bool, mk func(name string, file bool) error) error {
	for _, b := range binds {
		if err := mk(b.dst, file); err != nil {
			return err
		}
		if err := bindRoot(dir+b.dst, b, file); err != nil {
			return err
		}
	}
	return nil
}

// bindRoot binds b.src (a directory; a file when file is set) on dst, a
// mount point of a root tree, never set-user-ID or a device.
func bindRoot(dst string, b rootBind, file bool) error {
	// A read-write source is one of the workspace's own directories:
	// its last component is never followed, so that a symlink there
	// could not bind a host directory into the sandbox. (The
	// read-only ones are the host's and the broker's.)
	flags := unix.O_PATH | unix.O_CLOEXEC
	if !file {
		flags |= unix.O_DIRECTORY
	}
	if !b.ro {
		flags |= unix.O_NOFOLLOW
	}
	src, err := unix.Open(b.src, flags, 0)
	if err != nil {
		return fmt.Errorf("root: bind source: %w", err)
	}
	err = unix.Mount("/proc/thread-self/fd/"+strconv.Itoa(src), dst, "", unix.MS_BIND|unix.MS_REC, "")
	unix.Close(src)
	if err != nil {
		return fmt.Errorf("root: bind: %w", err)
	}
	attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if b.ro {
		attr |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(-1, dst, unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: attr}); err != nil {
		return fmt.Errorf("root: mount_setattr: %w", err)
	}
	return nil
}
