package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// stageImageRoot builds the root tree t of a workspace on an image on dir
// (see stageRoot): an overlayfs of the image's layers, each through an
// idmapped mount that maps the image's uid 0 (and gid 0) to the
// workspace's uid and nothing else, with t.image.rootfs/upper as its
// writable layer; on it the mount points and binds of t. The root stays
// writable: root in the sandbox may install packages.
//
// The upper layer outlives the namespace and is the sandbox's to change,
// so every mount point is made anew where the sandbox left something else
// there (a symlink above all, which would lead a mount out of the root).
func stageImageRoot(dir string, t *rootTree) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("mkdir: %w", scrub(err))
	}
	if err := mountOverlay(dir, t); err != nil {
		return err
	}
	mk := func(name string, file bool) error {
		if err := mountPoint(dir, name, file, t.owner); err != nil {
			return fmt.Errorf("root: %w", scrub(err))
		}
		return nil
	}
	points := []string{"/proc", "/dev"}
	if t.egress {
		points = append(points, path.Dir(egressMount), egressMount)
	}
	for _, name := range points {
		if err := mk(name, false); err != nil {
			return err
		}
	}
	if t.egress {
		if err := mk(forwardBin, true); err != nil {
			return err
		}
	}
	if err := bindAll(dir, t.binds, false, mk); err != nil {
		return err
	}
	return bindAll(dir, t.files, true, mk)
}

// mountOverlay mounts t's image on dir. The layers are each cloned
// (open_tree), idmapped (mount_setattr) and attached below the stage for
// as long as the overlay's mount needs their paths; the overlay keeps
// its own references to them.
func mountOverlay(dir string, t *rootTree) error {
	userns, err := idmapUserNS(t.image.unshare, t.owner)
	if err != nil {
		return fmt.Errorf("image: user namespace: %w", err)
	}
	defer userns.Close()
	rootfs := t.image.rootfs
	upper, work := rootfs+"/upper", rootfs+"/work"
	// Another broker process (or this one, for another exec) may build
	// this workspace's root at the same time: one at a time, so that
	// neither finds upper/ before it is the sandbox's, and the overlay's
	// mount never resets a work/ that another mount is still setting up.
	unlock, err := lockRootfs(rootfs)
	if err != nil {
		return fmt.Errorf("image: lock: %w", scrub(err))
	}
	defer unlock()
	if err := makeRootfs(rootfs, t.owner); err != nil {
		return fmt.Errorf("image: %w", scrub(err))
	}
	stage := path.Dir(dir)
	lowers := make([]string, len(t.image.layers))
	for i, layer := range t.image.layers {
		mp := stage + "/l" + strconv.Itoa(i)
		if err := os.Mkdir(mp, 0o700); err != nil {
			return fmt.Errorf("image: %w", scrub(err))
		}
		fd, err := unix.OpenTree(unix.AT_FDCWD, layer, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
		if err != nil {
			return fmt.Errorf("image: layer: open_tree: %w", err)
		}
		attr := unix.MountAttr{
			Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
			Userns_fd: uint64(userns.Fd()),
		}
		err = unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr)
		if err == nil {
			err = unix.MoveMount(fd, "", unix.AT_FDCWD, mp, unix.MOVE_MOUNT_F_EMPTY_PATH)
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("image: idmapped layer: %w", err)
		}
		defer unix.Unmount(mp, unix.MNT_DETACH)
		lowers[len(lowers)-1-i] = mp // the option names the top layer first
	}
	opts := "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("sandgate-image", dir, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("image: overlay: %w", err)
	}
	return nil
}

// lockRootfs takes the exclusive flock on rootfs/lock (made when missing;
// the sandbox never sees rootfs/ itself, only upper/ through the overlay)
// and returns its release. The lock file is on the workspace's disk (or
// directory), so every broker process on the data directory meets it.
func lockRootfs(rootfs string) (func(), error) {
	if err := os.Mkdir(rootfs, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	f, err := os.OpenFile(rootfs+"/lock", os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil // closing the last descriptor unlocks
}

// makeRootfs makes the overlay's upper/ (the sandbox root's, owner) and
// work/ (the kernel's) in rootfs, unless they exist.
func makeRootfs(rootfs string, owner int) error {
	if err := os.Mkdir(rootfs, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := os.Mkdir(rootfs+"/work", 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	switch err := os.Mkdir(rootfs+"/upper", 0o755); {
	case errors.Is(err, fs.ErrExist):
		return nil
	case err != nil:
		return err
	}
	return os.Chown(rootfs+"/upper", owner, owner)
}

// idmapUserNS returns a user namespace that maps uid 0 and gid 0 to uid
// (and gid uid) and nothing else: what an idmapped mount of a layer uses.
// A user namespace needs a process: unshare(1), which makes the namespace
// itself once it runs, so that it never holds copies of the broker's
// descriptors (a fork that makes the namespace would, until the maps are
// written, keep other workspaces' namespaces and loop devices alive). It
// says when it is in the namespace, then waits on stdin until it is open.
func idmapUserNS(unshare string, uid int) (*os.File, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer inR.Close()
	defer inW.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer outR.Close()
	defer outW.Close()
	cmd := exec.Command(unshare, "--user", shPath, "-c", "echo; read _")
	cmd.Stdin, cmd.Stdout = inR, outW
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	outW.Close()
	if _, err := outR.Read(make([]byte, 1)); err != nil {
		return nil, fmt.Errorf("unshare: %w", err)
	}
	proc := "/proc/" + strconv.Itoa(cmd.Process.Pid)
	m := []byte("0 " + strconv.Itoa(uid) + " 1\n")
	for _, name := range []string{"/uid_map", "/gid_map"} {
		if err := os.WriteFile(proc+name, m, 0); err != nil {
			return nil, scrub(err)
		}
	}
	ns, err := os.Open(proc + "/ns/user")
	if err != nil {
		return nil, scrub(err)
	}
	return ns, nil
}

// mountPoint makes name (absolute, in the root tree on dir) a directory,
// or an empty file, owned by owner, with every parent a real directory:
// whatever else the upper layer holds on the way (a symlink, a file) is
// removed first. An existing one of the right kind is kept.
func mountPoint(dir, name string, file bool, owner int) error {
	parts := strings.Split(strings.TrimPrefix(name, "/"), "/")
	p := dir
	for i, part := range parts {
		p += "/" + part
		last := i == len(parts)-1
		fi, err := os.Lstat(p)
		if err == nil {
			if wantFile := last && file; (wantFile && fi.Mode().IsRegular()) || (!wantFile && fi.IsDir()) {
				continue
			}
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if last && file {
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o644)
			if err != nil {
				return err
			}
			f.Close()
		} else if err := os.Mkdir(p, 0o755); err != nil {
			return err
		}
		if err := os.Lchown(p, owner, owner); err != nil {
			return err
		}
	}
	return nil
}
