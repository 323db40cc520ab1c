package local

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Cgroups bound all of a workspace's processes together: execs, file and
// snapshot helpers and durable commands. Each workspace has one cgroup per
// controller, <mount>/<parent>/<ref>, holding its limits; every process
// runs in a leaf below it, e-<random> for an exec, c-<id> for a durable
// command, so that an exec's OOM kills can be told apart (and so that v2's
// "no processes in inner cgroups" rule holds). The paths follow from the
// ref alone, so any broker process on the same DataDir finds them.

// cpuPeriod is the CFS period the CPU quota is expressed in, microseconds.
const cpuPeriod = 100000

// quotaRoom is what a v1 workspace's CPU quota holds beyond its cores,
// microseconds a period. Its processes are pinned to at most that many
// CPUs (placement.go; seccomp refuses sched_setaffinity), so they can never
// use it, while an exec's launching thread, in the cgroup for its fork
// (selfJoin), is then never throttled by a workspace that keeps its cores
// busy: it may hold the Go runtime's locks. Less than a core, so the cores
// still read back as the quota's whole periods (cpuGovernor.cores).
const quotaRoom = cpuPeriod / 2

// cgroupHost is what this host's cgroups can do, found once by New.
type cgroupHost struct {
	v2 bool
	// dirs are the parent directories, one per controller on v1
	// (memory, pids, cpu) and one on v2.
	dirs []string
	// mem, pids, cpu are the directories under which each controller's
	// workspace cgroups live ("" when the controller cannot be used).
	mem, pids, cpu string
	// acct is where the workspace cgroups' CPU usage is counted: the
	// cpuacct hierarchy on v1 (the cpu one when both are mounted
	// together), the one hierarchy on v2; "" when there is none, and
	// then no workspace's weight is ever lowered (see cpuweight.go).
	acct string
	swap bool // swap can be limited (v1 memsw, v2 swap.max)
	// home, on v1, holds the tasks file of the broker's own cgroup in each
	// hierarchy of controllers(), in the same order, opened once: an exec's
	// launching thread joins the workspace's cgroups itself and comes back
	// through these (enter, leave). nil: bwrap is moved in by its pid.
	home []*os.File
}

// cgroupMount is one cgroup file system mount.
type cgroupMount struct {
	dir     string
	v2      bool
	options []string // v1: the controllers
}

// cgroupMounts reads the cgroup mounts from mountinfo (/proc/self/mountinfo).
func cgroupMounts(mountinfo string) ([]cgroupMount, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []cgroupMount
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "id parent maj:min root mountpoint opts [optional…] - fstype source superopts"
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 || pf[3] != "/" {
			continue // a bind mount of a sub-tree: not a hierarchy's root
		}
		switch qf[0] {
		case "cgroup2":
			out = append(out, cgroupMount{dir: pf[4], v2: true})
		case "cgroup":
			out = append(out, cgroupMount{dir: pf[4], options: strings.Split(qf[2], ",")})
		}
	}
	return out, sc.Err()
}

// defaultCgroupParent is the parent of a DataDir's workspace cgroups: one
// per DataDir, so that brokers on different data directories never touch
// each other's.
func defaultCgroupParent(dataDir string) string {
	h := sha256.Sum256([]byte(dataDir))
	return "sandgate/" + hex.EncodeToString(h[:6])
}

// detectCgroups finds the controllers and creates the parent cgroups. It
// returns the host (nil when no cgroup can be used at all) and, for each
// limit that cannot be enforced, a sentence saying which and why.
func detectCgroups(mountinfo, parent string) (*cgroupHost, []string) {
	mounts, err := cgroupMounts(mountinfo)
	if err != nil {
		return nil, []string{"cgroups: cannot read the mount table: " + scrub(err).Error()}
	}
	// v2 where it is the main hierarchy and has the controllers.
	for _, m := range mounts {
		if !m.v2 {
			continue
		}
		b, err := os.ReadFile(filepath.Join(m.dir, "cgroup.controllers"))
		ctl := strings.Fields(string(b))
		if err != nil || !hasAll(ctl, "memory", "pids", "cpu") {
			continue
		}
		return detectV2(m.dir, parent)
	}
	return detectV1(mounts, parent)
}

func hasAll(have []string, want ...string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			return false
		}
	}
	return true
}

func detectV2(mount, parent string) (*cgroupHost, []string) {
	h := &cgroupHost{v2: true}
	dir := filepath.Join(mount, parent)
	// Enable the controllers on the way down: each level's children get
	// only what its subtree_control lists.
	cur := mount
	for _, seg := range strings.Split(parent, "/") {
		if err := os.WriteFile(filepath.Join(cur, "cgroup.subtree_control"), []byte("+memory +pids +cpu"), 0); err != nil {
			return nil, []string{"cgroups (v2): cannot enable memory, pids and cpu below " + cur + ": " + scrub(err).Error()}
		}
		cur = filepath.Join(cur, seg)
		if err := os.Mkdir(cur, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, []string{"cgroups (v2): cannot create " + cur + ": " + scrub(err).Error()}
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory +pids +cpu"), 0); err != nil {
		return nil, []string{"cgroups (v2): cannot enable memory, pids and cpu in " + dir + ": " + scrub(err).Error()}
	}
	h.dirs = []string{dir}
	h.mem, h.pids, h.cpu, h.acct = dir, dir, dir, dir
	return h, h.probe()
}

func detectV1(mounts []cgroupMount, parent string) (*cgroupHost, []string) {
	h := &cgroupHost{}
	var problems []string
	find := func(ctl string) string {
		for _, m := range mounts {
			if !m.v2 && hasAll(m.options, ctl) {
				return m.dir
			}
		}
		return ""
	}
	for _, c := range []struct {
		name string
		dir  *string
	}{{"memory", &h.mem}, {"pids", &h.pids}, {"cpu", &h.cpu}} {
		mount := find(c.name)
		if mount == "" {
			problems = append(problems, c.name+": no cgroup v1 "+c.name+" controller is mounted and cgroup v2 lacks it")
			continue
		}
		dir := filepath.Join(mount, parent)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			problems = append(problems, c.name+": cannot create the cgroup "+dir+": "+scrub(err).Error())
			continue
		}
		*c.dir = dir
		h.dirs = append(h.dirs, dir)
	}
	if len(h.dirs) == 0 {
		return nil, problems
	}
	// CPU usage is only read (cpuweight.go), never limited: without it
	// nothing is unenforced, so it is no problem.
	if mount := find("cpuacct"); mount != "" {
		if dir := filepath.Join(mount, parent); h.cpu != "" && os.MkdirAll(dir, 0o755) == nil {
			h.acct = dir
			if dir != h.cpu {
				h.dirs = append(h.dirs, dir)
			}
		}
	}
	problems = append(problems, h.probe()...)
	h.openHomes(find, "/proc/self/cgroup")
	return h, problems
}

// openHomes opens, in each hierarchy of controllers(), the tasks file of
// the cgroup the broker runs in, as its own cgroup file (selfCgroup,
// /proc/self/cgroup) names it. Any failure leaves home nil: execs then
// move bwrap in by its pid.
func (h *cgroupHost) openHomes(mount func(ctl string) string, selfCgroup string) {
	b, err := os.ReadFile(selfCgroup)
	if err != nil {
		return
	}
	own := make(map[string]string) // controller → the broker's cgroup
	for _, l := range strings.Split(string(b), "\n") {
		// "hierarchy-id:controller,controller:path"
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			own[c] = f[2]
		}
	}
	var home []*os.File
	for _, c := range h.parents() {
		path, ok := own[c.ctl]
		m := mount(c.ctl)
		var f *os.File
		if ok && m != "" {
			f, err = os.OpenFile(filepath.Join(m, path, "tasks"), os.O_WRONLY, 0)
		}
		if f == nil {
			closeAll(home)
			return
		}
		home = append(home, f)
	}
	h.home = home
}

// probe creates a throwaway workspace cgroup, sets every limit, and removes
// it; a limit that does not take is a problem, and its controller is not
// used.
func (h *cgroupHost) probe() []string {
	ref := ".probe-" + randomHex()
	var problems []string
	swap, errs := h.setLimits(ref, cgroupLimits{memory: 64 << 20, pids: 64, cpuCores: 1})
	for _, e := range errs {
		if e.ctl == "cpuacct" {
			h.acct = "" // usage only: no limit depends on it
			continue
		}
		problems = append(problems, e.err.Error())
		if !h.v2 {
			switch e.ctl {
			case "memory":
				h.mem = ""
			case "pids":
				h.pids = ""
			case "cpu":
				h.cpu, h.acct = "", ""
			}
		}
	}
	h.swap = swap
	if h.mem != "" && !h.swap && swapConfigured() {
		problems = append(problems, "memory: swap cannot be limited (no memory.memsw.limit_in_bytes or memory.swap.max; on v1 boot with swapaccount=1), so a workspace could swap past its memory size")
	}
	h.remove(ref)
	return problems
}

// swapConfigured reports whether the host has any swap.
func swapConfigured() bool {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return true
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "SwapTotal:" {
			return f[1] != "0"
		}
	}
	return true
}

// cgroupLimits are one workspace's limits.
type cgroupLimits struct {
	memory   int64 // bytes
	pids     int
	cpuCores int
}

// limitError is a limit that did not take, and its controller.
type limitError struct {
	ctl string
	err error
}

// setLimits creates the workspace cgroups of ref and writes lim. It reports
// whether swap is limited, and every limit that did not take.
func (h *cgroupHost) setLimits(ref string, lim cgroupLimits) (swap bool, errs []limitError) {
	dirs := map[string]string{"memory": h.mem, "pids": h.pids, "cpu": h.cpu}
	if h.acctSeparate() {
		dirs["cpuacct"] = h.acct
	}
	for _, ctl := range []string{"memory", "pids", "cpu", "cpuacct"} {
		if dirs[ctl] == "" {
			continue
		}
		mkdir := os.MkdirAll // v1: the parent may have been removed by a Close
		if h.v2 {
			mkdir = os.Mkdir // v2: a parent made here would lack its controllers
		}
		if err := mkdir(filepath.Join(dirs[ctl], ref), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			errs = append(errs, limitError{ctl, fmt.Errorf("%s: cannot create a workspace cgroup: %w", ctl, scrub(err))})
			delete(dirs, ctl)
		}
	}
	write := func(ctl, file, value string) bool {
		if dirs[ctl] == "" {
			return false
		}
		if err := os.WriteFile(filepath.Join(dirs[ctl], ref, file), []byte(value), 0); err != nil {
			errs = append(errs, limitError{ctl, fmt.Errorf("%s: cannot set %s: %w", ctl, file, scrub(err))})
			return false
		}
		return true
	}
	mem := strconv.FormatInt(lim.memory, 10)
	quota := strconv.Itoa(lim.cpuCores * cpuPeriod)
	if h.v2 {
		// The leaves below get the controllers too (their OOM events).
		write("memory", "cgroup.subtree_control", "+memory +pids +cpu")
		write("memory", "memory.max", mem)
		if fileExists(filepath.Join(h.mem, ref, "memory.swap.max")) {
			swap = write("memory", "memory.swap.max", "0")
		}
		write("pids", "pids.max", strconv.Itoa(lim.pids))
		write("cpu", "cpu.max", quota+" "+strconv.Itoa(cpuPeriod))
		write("cpu", "cpu.weight", strconv.Itoa(cpuWeight(true, lim.cpuCores, false)))
		return swap, errs
	}
	write("memory", "memory.limit_in_bytes", mem)
	if dirs["memory"] != "" && fileExists(filepath.Join(h.mem, ref, "memory.memsw.limit_in_bytes")) {
		// memsw counts memory and swap together: equal to the memory
		// limit, it leaves no swap at all.
		swap = write("memory", "memory.memsw.limit_in_bytes", mem)
	}
	write("pids", "pids.max", strconv.Itoa(lim.pids))
	write("cpu", "cpu.cfs_period_us", strconv.Itoa(cpuPeriod))
	write("cpu", "cpu.cfs_quota_us", strconv.Itoa(lim.cpuCores*cpuPeriod+quotaRoom))
	write("cpu", "cpu.shares", strconv.Itoa(cpuWeight(false, lim.cpuCores, false)))
	return swap, errs
}

// acctSeparate reports whether CPU usage is counted in a hierarchy of its
// own (v1 with cpuacct mounted apart from cpu), whose workspace cgroups
// are then made, joined and removed like the others.
func (h *cgroupHost) acctSeparate() bool { return !h.v2 && h.acct != "" && h.acct != h.cpu }

func fileExists(name string) bool { _, err := os.Stat(name); return err == nil }

// parent is one controller's directory of workspace cgroups.
type parent struct{ ctl, dir string }

// parents are the usable controllers' directories of workspace cgroups, in
// the order of controllers (v2: the one hierarchy, as "memory").
func (h *cgroupHost) parents() []parent {
	if h.v2 {
		return []parent{{"memory", h.mem}}
	}
	var out []parent
	all := []parent{{"memory", h.mem}, {"pids", h.pids}, {"cpu", h.cpu}}
	if h.acctSeparate() {
		all = append(all, parent{"cpuacct", h.acct})
	}
	for _, c := range all {
		if c.dir != "" {
			out = append(out, c)
		}
	}
	return out
}

// controllers returns the workspace cgroup directories of ref, one per
// usable controller (one on v2).
func (h *cgroupHost) controllers(ref string) []string {
	if h == nil {
		return nil
	}
	var out []string
	for _, c := range h.parents() {
		out = append(out, filepath.Join(c.dir, ref))
	}
	return out
}

// leaf creates the leaf cgroup name below ref's workspace cgroups and
// returns the files named file of the cgroups a process joins:
// cgroup.procs, which takes a process's pid, or, on v1, tasks, which
// takes a thread's ("0": the writer's own; see enter). The workspace cgroups must exist: a missing one (a workspace created
// before cgroups, or removed under us) is an error, never an exec outside.
//
// On v1 only two hierarchies get a leaf: memory, from whose leaf an exec's
// OOM kills are read, and the one that counts CPU usage, whose leaves the
// CPU governor reads. The pids and cpu limits sit on the workspace's
// cgroup, which a process joins directly (v1 lets a cgroup hold processes
// beside child cgroups): two directories fewer to make and remove per exec.
// v2 has one hierarchy, whose processes must all be in leaves.
func (h *cgroupHost) leaf(ref, name, file string) ([]string, error) {
	var procs []string
	for _, d := range h.controllers(ref) {
		if !h.leafIn(d, ref) {
			if _, err := os.Stat(d); err != nil {
				return nil, fmt.Errorf("workspace cgroup: %w", scrub(err))
			}
			procs = append(procs, filepath.Join(d, file))
			continue
		}
		l := filepath.Join(d, name)
		if err := os.Mkdir(l, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			// ENOENT: the workspace's cgroup is missing.
			return nil, fmt.Errorf("leaf cgroup: %w", scrub(err))
		}
		if h.v2 {
			// An OOM kill takes the whole exec, not one of its processes.
			_ = os.WriteFile(filepath.Join(l, "memory.oom.group"), []byte("1"), 0)
		}
		procs = append(procs, filepath.Join(l, file))
	}
	return procs, nil
}

// leafIn reports whether processes of ref get leaves in its workspace
// cgroup d (one of controllers(ref)); see leaf.
func (h *cgroupHost) leafIn(d, ref string) bool {
	return h.v2 || d == filepath.Join(h.mem, ref) || (h.acct != "" && d == filepath.Join(h.acct, ref))
}

// selfJoin reports whether an exec's launching thread joins the exec's
// cgroups itself (enter) before it forks bwrap, which is then born in
// them, rather than moving bwrap in by its pid once it runs. A pid written
// to cgroup.procs (or to tasks) takes the kernel's global
// cgroup_threadgroup_rwsem for writing, which on a host with default
// settings first waits for an RCU grace period: 4 ms on average here, up
// to 26. A thread writing "0" to a v1 tasks file moves only itself, and
// the kernel then skips that lock (cgroup_procs_write_start). The thread
// is never a process's main one (onSpareThread), which keeps it out of
// what the broker exposes to the workspace's cgroups while it is in them:
//   - a memory cgroup's OOM killer walks only thread-group leaders;
//   - killCgroup kills only processes whose leader is in the cgroup;
//   - it is in them for the fork alone (leave), counted in pids.max for
//     that long, and its CPU time then is the workspace's (the v1 quota
//     leaves a core of room for it: setLimits).
func (h *cgroupHost) selfJoin() bool { return h != nil && h.home != nil }

// joinFile is the file of a cgroup an exec's bwrap joins through.
func (h *cgroupHost) joinFile() string {
	if h.selfJoin() {
		return "tasks"
	}
	return "cgroup.procs"
}

// runnerFile is the file of a cgroup a durable command's runner, a
// single-threaded sh, joins through (joinScript): on v1 tasks, which
// takes "0" for the writer itself without the global lock.
func (h *cgroupHost) runnerFile() string {
	if h == nil || h.v2 {
		return "cgroup.procs"
	}
	return "tasks"
}

// enter moves the calling thread into the cgroups whose tasks files are
// open in files (leaf, joinFile); leave brings it back. The thread must be
// locked to its goroutine.
func enter(files []*os.File) error {
	for _, f := range files {
		if _, err := f.Write([]byte("0")); err != nil {
			return fmt.Errorf("cannot join the workspace's cgroup: %w", scrub(err))
		}
	}
	return nil
}

// leave moves the calling thread back into the broker's own cgroups.
func (h *cgroupHost) leave() error {
	for _, f := range h.home {
		if _, err := f.Write([]byte("0")); err != nil {
			return fmt.Errorf("cannot leave the workspace's cgroup: %w", scrub(err))
		}
	}
	return nil
}

// oomFile is the file of the leaf name of ref that counts its OOM kills
// (oomKills); "" when memory is not limited.
func (h *cgroupHost) oomFile(ref, name string) string {
	if h == nil || h.mem == "" {
		return ""
	}
	file := "memory.oom_control" // v1: "oom_kill N"
	if h.v2 {
		file = "memory.events" // v2: "oom_kill N"
	}
	return filepath.Join(h.mem, ref, name, file)
}

// oomKills returns how many processes the OOM killer killed in a leaf, from
// its oomFile, opened (and read from its start, as often as asked).
func oomKills(f *os.File) int {
	var buf [512]byte
	n, _ := f.ReadAt(buf[:], 0)
	for _, l := range strings.Split(string(buf[:n]), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "oom_kill" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}

// removeLeaf removes the leaf name of ref; its processes must be gone.
// Best effort: Terminate removes what is left.
func (h *cgroupHost) removeLeaf(ref, name string) {
	for _, d := range h.controllers(ref) {
		if h.leafIn(d, ref) {
			rmdirRetry(filepath.Join(d, name))
		}
	}
}

// remove kills every process left in ref's cgroups and removes them,
// leaves first.
func (h *cgroupHost) remove(ref string) {
	for _, d := range h.controllers(ref) {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if e.IsDir() {
				killCgroup(filepath.Join(d, e.Name()))
				rmdirRetry(filepath.Join(d, e.Name()))
			}
		}
		killCgroup(d)
		rmdirRetry(d)
	}
}

// killCgroup SIGKILLs every process in the cgroup dir until it is empty
// (bounded: a process stuck in the kernel is left to the next try). On v1
// a cgroup.procs lists the process of every thread in the cgroup, so it
// can name a broker whose exec's launching thread is passing through
// (selfJoin): a process is killed only when its leader thread is in the
// cgroup (its tasks) or has exited, leaving threads behind in it.
func killCgroup(dir string) {
	self := os.Getpid()
	for range 100 {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		pids := strings.Fields(string(b))
		if err != nil || len(pids) == 0 {
			return
		}
		var tasks []string
		if b, err := os.ReadFile(filepath.Join(dir, "tasks")); err == nil {
			tasks = strings.Fields(string(b))
		}
		for _, s := range pids {
			pid, err := strconv.Atoi(s)
			if err != nil || pid <= 0 || pid == self {
				continue
			}
			if tasks != nil && !slices.Contains(tasks, s) && !zombie(pid) {
				continue // only a thread of it is here
			}
			killPid(pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// zombie reports whether process pid's leader thread has exited (its
// other threads may still run).
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false // gone: nothing to kill
	}
	// "pid (comm) state …": comm may hold anything, ")" included.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// rmdirRetry removes an empty cgroup directory; the kernel may still hold
// it for a moment after its last process exited.
func rmdirRetry(dir string) {
	for range 50 {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
