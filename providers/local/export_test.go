package local

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// SnapshotPath returns the archive of snapshot id.
func SnapshotPath(p *Provider, id string) string { return p.snapshotPath(id) }

// SeccompFilter bridges the seccomp program to the tests.
var SeccompFilter = seccompFilter

// SupervisorPID returns the pid of the workspace's supervisor, 0 when none.
func SupervisorPID(p *Provider, ref string) int {
	b, _ := os.ReadFile(filepath.Join(string(p.layout(ref)), supervisorFile))
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	pid, _ := strconv.Atoi(f[0])
	return pid
}

// Alive reports whether pid runs (and is not a zombie).
func Alive(pid int) bool { _, err := procStart(pid); return err == nil }

// CappedKeep writes chunks into a cappedBuffer of max bytes and returns
// what it kept, its buffer's capacity, the bytes counted and whether it
// reports truncation.
func CappedKeep(max int64, chunks ...[]byte) (kept []byte, capacity int, n int64, truncated bool) {
	c := &cappedBuffer{max: max}
	for _, b := range chunks {
		c.Write(b)
	}
	return c.buf, cap(c.buf), c.n, c.truncated()
}

// SetMountinfo makes New read the cgroup mounts from path.
func SetMountinfo(c *Config, path string) { c.mountinfo = path }

// CgroupDirs returns the workspace cgroup directories of ref, one per
// controller (memory, pids, cpu on v1).
func CgroupDirs(p *Provider, ref string) []string { return p.cg.controllers(ref) }
