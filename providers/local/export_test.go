package local

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// SnapshotPath returns the archive of snapshot id.
func SnapshotPath(p *Provider, id string) string { return p.snapshotPath(id) }

// SeccompFilter bridges the seccomp program to the tests.
var SeccompFilter = seccompFilter

// SupervisorPID returns the pid of the data directory's supervisor, 0 when
// none has run.
func SupervisorPID(p *Provider) int {
	b, _ := os.ReadFile(filepath.Join(p.dataDir, supervisorLock))
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

// SetCPUTick sets the CPU governor's tick.
func SetCPUTick(c *Config, d time.Duration) { c.cpuTick = d }

// CPUWeight returns the workspace's CPU weight (v1 cpu.shares, v2
// cpu.weight) and the normal weight of its cores.
func CPUWeight(p *Provider, ref string, cores int) (got, normal int) {
	file := "cpu.shares"
	if p.cg.v2 {
		file = "cpu.weight"
	}
	b, _ := os.ReadFile(filepath.Join(p.cg.cpu, ref, file))
	got, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	return got, cpuWeight(p.cg.v2, cores, false)
}

// CPUTick is one tick of a workspace as the CPU governor sees it: the share
// of its cores it used, and whether long-running work of it used CPU.
type CPUTick struct {
	Share float64
	Long  bool
}

// ObserveCPU runs the governor's decision over a workspace's successive
// ticks and returns whether it had the background weight after each.
func ObserveCPU(ticks ...CPUTick) []bool {
	var s cpuState
	out := make([]bool, len(ticks))
	for i, t := range ticks {
		s.observe(t.Share, t.Long)
		out[i] = s.background
	}
	return out
}

// HasDeadline reports whether the supervisor is told of ref's deadline.
func HasDeadline(p *Provider, ref string) bool {
	_, err := os.Stat(filepath.Join(p.dataDir, deadlinesDir, ref))
	return err == nil
}

// HashCPU is the CPU the hash alone would pin the workspace ref to.
func HashCPU(p *Provider, ref string) int { return p.pickCPUs(ref, 1)[0] }

// CloseMountNamespaces closes the workspaces' mount namespaces that no exec
// uses, as the Provider does after nsIdle, unmounting their disk images;
// the residents, which hold them, are stopped first, as after their idle
// time.
func CloseMountNamespaces(p *Provider) {
	p.stopResidents()
	p.ns.sweep(time.Time{})
}

// SetReleaseWait sets how long a create waits for an image in the trash
// that stays bound (releaseWait).
func SetReleaseWait(p *Provider, d time.Duration) {
	p.released.mu.Lock()
	defer p.released.mu.Unlock()
	p.released.wait = d
}

// JoinAsStarted bridges joinAsStarted to the tests.
var JoinAsStarted = joinAsStarted

// JoinsItself reports whether an exec's bwrap joins its cgroups itself
// (cgroupHost.joinsItself).
func JoinsItself(p *Provider) bool { return p.cg.joinsItself() }

// SetAfterUIDClaim makes Create call f right after it claimed its uid.
func SetAfterUIDClaim(c *Config, f func()) { c.afterUIDClaim = f }

// SetOnMkfs makes New's Provider call f after each disk image it makes.
func SetOnMkfs(c *Config, f func()) { c.onMkfs = f }

// PooledDirs returns the directories of the data directory's warm
// workspaces, of every owner.
func PooledDirs(p *Provider) []string {
	dirs, _ := filepath.Glob(filepath.Join(p.dataDir, poolDir, "*", "*"))
	return dirs
}

// AbandonPool leaves p's warm workspaces behind as a broker that crashed
// would: its refill stops, its owner lock is let go and their residents
// die (with the broker, in a crash), nothing removed.
func AbandonPool(p *Provider) {
	p.pool.Abandon()
	p.pool.lock.Close()
	p.pool = nil
	p.stopResidents()
}

// HasNS reports whether p holds a mount namespace of the workspace ref.
func HasNS(p *Provider, ref string) bool {
	p.ns.mu.Lock()
	defer p.ns.mu.Unlock()
	return p.ns.m[ref] != nil
}

// Residents returns the host pid of the bwrap of every live resident p
// holds, by the ref it serves (a pooled workspace's: its pool key).
func Residents(p *Provider) map[string]int {
	p.res.mu.Lock()
	slots := make(map[string]*residentSlot, len(p.res.m))
	for ref, slot := range p.res.m {
		slots[ref] = slot
	}
	p.res.mu.Unlock()
	out := map[string]int{}
	for _, slot := range slots {
		slot.mu.Lock()
		rs := slot.rs
		slot.mu.Unlock()
		if rs == nil {
			continue
		}
		select {
		case <-rs.dead:
			continue
		default:
		}
		rs.r.mu.Lock()
		pid := rs.r.pgid
		rs.r.mu.Unlock()
		if pid > 0 {
			out[p.refOf(rs)] = pid
		}
	}
	return out
}

// PausePool holds p's refill, so that a test sees only what its takes do.
func PausePool(p *Provider) { p.pool.Pause() }

// PooledCgroups returns the cgroup directories of p's pooled workspaces.
func PooledCgroups(p *Provider) []string {
	var out []string
	for _, d := range p.cg.dirs {
		names, _ := filepath.Glob(filepath.Join(d, pooledCgroup(p.pool.owner)+"*"))
		out = append(out, names...)
	}
	return out
}

// WaitTeardown waits until what Terminate leaves to after its return (the
// workspace's cgroups, deadline and files) is removed.
func WaitTeardown(p *Provider) { p.trashing.Wait(context.Background()) }

// DefaultCgroupParent is the parent cgroup of dataDir's workspaces.
func DefaultCgroupParent(dataDir string) string { return defaultCgroupParent(dataDir) }

// Record is a workspace's record, as an exec that opened it holds it.
type Record = record

// ReadRecord reads the record of the workspace ref, as an exec opens it.
func ReadRecord(p *Provider, ref string) (Record, error) {
	w, err := p.open(ref)
	return w.rec, err
}

// MakeLeaf makes a leaf cgroup of ref as an exec that opened it with rec
// does (recreating the workspace's cgroups when they are missing).
func MakeLeaf(p *Provider, ref string, rec Record) error {
	_, err := p.leaf(ref, rec, "e-test", "cgroup.procs")
	return err
}

// RemoveCgroups removes the workspace cgroups of ref, as a reboot does.
func RemoveCgroups(p *Provider, ref string) { p.cg.remove(ref) }
