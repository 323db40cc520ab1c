package guest

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// The jails' root is an overlay of the guest's own file systems, mounted
// once per guest in the guest's initial mount namespace: every tenant
// write lands in root-only upper directories under the agent's directory,
// is seen by every later jail, and never reaches the files the agent, the
// keeper and the broker's outside scripts run as the guest's root. The
// guest's virtual file systems (/proc, /sys, /dev, /run) are not part of
// it: each jail mounts its own.

// Paths under the agent's directory.
const (
	rootState  = "root"   // upper and work directories, the lock, hosts
	rootMerged = "rootfs" // the merged tree every jail pivots into
)

// virtualDirs are the guest's mount points no jail sees: the kernel's
// views and the guest's run-time state (its services' sockets). A mount
// under one is not overlaid.
var virtualDirs = []string{"/proc", "/sys", "/dev", "/run"}

// jailHosts is the jail's /etc/hosts: loopback and its own name, nothing
// of the vendor's.
const jailHosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + Hostname + "\n"

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	point  string
	fstype string
}

// readMounts reads the calling process's mount table in mount order.
func readMounts() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT POINT OPTS [TAGS...] - FSTYPE SOURCE SUPER
		fields := strings.Fields(sc.Text())
		i := slices.Index(fields, "-")
		if len(fields) < 5 || i < 0 || i+1 >= len(fields) {
			return nil, errors.New("malformed mountinfo")
		}
		out = append(out, mountEntry{point: unescapeMount(fields[4]), fstype: fields[i+1]})
	}
	return out, sc.Err()
}

// unescapeMount decodes a mount point read from mountinfo, where the
// kernel escapes a space, a tab, a newline and a backslash.
func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// under reports whether path is dir or below it.
func under(path, dir string) bool {
	return path == dir || dir == "/" || strings.HasPrefix(path, dir+"/")
}

// overlaid returns the guest's mount points the jails' root is made of,
// parents before children: every visible mount but the virtual ones and
// the agent's own directory.
func overlaid(mounts []mountEntry, agentDir string) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range mounts {
		skip := under(m.point, agentDir)
		for _, v := range virtualDirs {
			skip = skip || under(m.point, v)
		}
		if skip || seen[m.point] {
			continue
		}
		seen[m.point] = true
		out = append(out, m.point)
	}
	slices.SortStableFunc(out, func(a, b string) int {
		return strings.Count(strings.TrimSuffix(a, "/"), "/") - strings.Count(strings.TrimSuffix(b, "/"), "/")
	})
	return out
}

// mounted reports whether mounts has one of fstype at point.
func mounted(mounts []mountEntry, point, fstype string) bool {
	return slices.ContainsFunc(mounts, func(m mountEntry) bool { return m.point == point && m.fstype == fstype })
}

// layerName is the directory under rootState of the overlay of the mount
// at point: stable for the guest's life and across its restarts.
func layerName(point string) string {
	sum := sha256.Sum256([]byte(point))
	return hex.EncodeToString(sum[:12])
}

// ensureRoot makes sure the jails' root is mounted at agentDir/rootfs,
// mounting it if not: once per guest, under a lock, so that no two
// overlays ever share an upper directory. The tree is ready once the
// tmpfs that hides the agent's directory in it is mounted, its last step;
// a tree a killed agent left half-built is taken down and built again. It
// fails, and no jail starts, when an overlay cannot be mounted (a kernel
// without overlayfs, a mount point overlayfs options cannot name): the
// jails never fall back to the guest's own root.
func ensureRoot(agentDir string) error {
	state := filepath.Join(agentDir, rootState)
	merged := filepath.Join(agentDir, rootMerged)
	if err := os.MkdirAll(state, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", cause(err))
	}
	lock, err := os.OpenFile(filepath.Join(state, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("lock: %w", cause(err))
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	mounts, err := readMounts()
	if err != nil {
		return fmt.Errorf("mount table: %w", cause(err))
	}
	hidden := merged + agentDir
	if mounted(mounts, merged, "overlay") && mounted(mounts, hidden, "tmpfs") {
		return nil
	}
	if slices.ContainsFunc(mounts, func(m mountEntry) bool { return m.point == merged }) {
		if err := unix.Unmount(merged, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("half-built root: %w", err)
		}
	}
	for name, data := range map[string]string{"hosts": jailHosts, "hostname": Hostname + "\n"} {
		if err := os.WriteFile(filepath.Join(state, name), []byte(data), 0o644); err != nil {
			return fmt.Errorf("%s: %w", name, cause(err))
		}
	}
	if err := os.MkdirAll(merged, 0o700); err != nil {
		return fmt.Errorf("mount point: %w", cause(err))
	}
	if err := mountLayers(state, merged, overlaid(mounts, agentDir)); err != nil {
		unix.Unmount(merged, unix.MNT_DETACH)
		return err
	}
	if err := unix.Mount("tmpfs", hidden, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_RDONLY, "mode=0700,size=4k"); err != nil {
		unix.Unmount(merged, unix.MNT_DETACH)
		return fmt.Errorf("hide the agent: %w", err)
	}
	return nil
}

// mountLayers mounts an overlay of each of points at merged+point, its
// upper and work directories under state.
func mountLayers(state, merged string, points []string) error {
	if len(points) == 0 || points[0] != "/" {
		return errors.New("the guest's / is not in its mount table")
	}
	for _, p := range points {
		if strings.ContainsAny(p, ",:\\") || strings.ContainsAny(state, ",:\\") {
			return errors.New("a mount point of the guest holds a character overlayfs options cannot carry")
		}
		target := merged
		if p != "/" {
			target += p
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return fmt.Errorf("a mount of the guest: %w", err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			// A file bound into the guest (overlayfs takes directories
			// only): the jails read it and cannot write it.
			if err := unix.Mount(p, target, "", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("a file mounted in the guest: %w", err)
			}
			if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
				return fmt.Errorf("a file mounted in the guest: %w", err)
			}
			continue
		}
		layer := filepath.Join(state, layerName(p))
		upper, work := filepath.Join(layer, "upper"), filepath.Join(layer, "work")
		// The upper directory's root is the merged directory's: it takes
		// the lower one's mode and owner, so that / stays 0755.
		for _, d := range []string{layer, upper, work} {
			if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("overlay directory: %w", cause(err))
			}
		}
		if err := unix.Chown(upper, int(st.Uid), int(st.Gid)); err != nil {
			return fmt.Errorf("overlay directory: %w", err)
		}
		if err := unix.Chmod(upper, st.Mode&0o7777); err != nil {
			return fmt.Errorf("overlay directory: %w", err)
		}
		opts := "lowerdir=" + p + ",upperdir=" + upper + ",workdir=" + work
		if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
			// A guest that is a user namespace (the fakes') keeps the
			// overlay's metadata in user.* extended attributes.
			if unix.Mount("overlay", target, "overlay", 0, opts+",userxattr") != nil {
				return fmt.Errorf("cannot mount the jails' root (overlayfs) over a file system of the guest: %w", err)
			}
		}
	}
	return nil
}

// pivotRoot makes merged (the jails' root, copied into this mount
// namespace) the calling process's root and detaches the guest's own.
func pivotRoot(merged string) error {
	if err := unix.Chdir(merged); err != nil {
		return fmt.Errorf("enter the root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the guest's root: %w", err)
	}
	return unix.Chdir("/")
}
