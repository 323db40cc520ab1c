package local

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
	// dynmods is whether a v1 hierarchy is mounted with favordynmods:
	// the kernel then moves a process by its pid without the global
	// lock's grace period, and an exec's bwrap is moved in by its pid
	// (joinsItself).
	dynmods bool
	// own are the broker's own cgroups on v1, one in each hierarchy that
	// a workspace has a cgroup in, as controllers lists them (nil when
	// one is not found): a resident, started by the broker, is in them,
	// and its forking thread goes back to them after each fork
	// (residentd.Request.Home).
	own []string
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
// limit that cannot be enforced, a sentence saying which and why. self is
// the broker's /proc/self/cgroup.
func detectCgroups(mountinfo, self, parent string) (*cgroupHost, []string) {
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
	return detectV1(mounts, self, parent)
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

func detectV1(mounts []cgroupMount, self, parent string) (*cgroupHost, []string) {
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
	for _, m := range mounts {
		h.dynmods = h.dynmods || !m.v2 && hasAll(m.options, "favordynmods")
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
	// In the order of controllers, after probe has dropped what it drops.
	var ctls, at []string
	for _, c := range []struct{ name, dir string }{{"memory", h.mem}, {"pids", h.pids}, {"cpu", h.cpu}} {
		if c.dir != "" {
			ctls, at = append(ctls, c.name), append(at, find(c.name))
		}
	}
	if h.acctSeparate() {
		ctls, at = append(ctls, "cpuacct"), append(at, find("cpuacct"))
	}
	h.own = ownCgroups(self, ctls, at)
	return h, problems
}

// ownCgroups returns the directories of the process's v1 cgroups named by
// self (/proc/self/cgroup) in the hierarchies of the controllers ctls,
// mounted at mounts; nil unless each is found.
func ownCgroups(self string, ctls, mounts []string) []string {
	b, err := os.ReadFile(self)
	if err != nil {
		return nil
	}
	var out []string
	for i, ctl := range ctls {
		found := false
		// "hierarchy-ID:controller-list:cgroup-path"
		for line := range strings.Lines(string(b)) {
			f := strings.SplitN(strings.TrimSuffix(line, "\n"), ":", 3)
			if len(f) == 3 && hasAll(strings.Split(f[1], ","), ctl) && strings.HasPrefix(f[2], "/") {
				d := filepath.Join(mounts[i], f[2])
				if fi, err := os.Stat(d); err == nil && fi.IsDir() {
					out, found = append(out, d), true
				}
				break
			}
		}
		if !found {
			return nil
		}
	}
	return out
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
	write("cpu", "cpu.cfs_quota_us", quota)
	write("cpu", "cpu.shares", strconv.Itoa(cpuWeight(false, lim.cpuCores, false)))
	return swap, errs
}

// acctSeparate reports whether CPU usage is counted in a hierarchy of its
// own (v1 with cpuacct mounted apart from cpu), whose workspace cgroups
// are then made, joined and removed like the others.
func (h *cgroupHost) acctSeparate() bool { return !h.v2 && h.acct != "" && h.acct != h.cpu }

func fileExists(name string) bool { _, err := os.Stat(name); return err == nil }

// controllers returns the workspace cgroup directories of ref, one per
// usable controller (one on v2).
func (h *cgroupHost) controllers(ref string) []string {
	if h == nil {
		return nil
	}
	if h.v2 {
		return []string{filepath.Join(h.mem, ref)}
	}
	var out []string
	dirs := []string{h.mem, h.pids, h.cpu}
	if h.acctSeparate() {
		dirs = append(dirs, h.acct)
	}
	for _, d := range dirs {
		if d != "" {
			out = append(out, filepath.Join(d, ref))
		}
	}
	return out
}

// leaf creates the leaf cgroup name below ref's workspace cgroups and
// returns the files named file of the cgroups a process joins:
// cgroup.procs, which takes a process's pid, or, on v1, tasks, which
// takes "0" for the writer itself (selfFile). The workspace cgroups must
// exist: a missing one (a workspace created before cgroups, or removed
// under us) is an error, never an exec outside.
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

// selfFile is the file of a cgroup a single-threaded process joins by
// itself through: on v1 tasks, to which it writes "0" (its one thread,
// so itself), the one migration the kernel makes without its global
// cgroup_threadgroup_rwsem (see joinAsStarted); on v2 cgroup.procs, to
// which it writes its pid.
func (h *cgroupHost) selfFile() string {
	if h == nil || h.v2 {
		return "cgroup.procs"
	}
	return "tasks"
}

// joinsItself reports whether an exec's bwrap joins its cgroups itself,
// started under sh (joinAsStarted), rather than being moved in by its pid
// (confine): on v1, unless the kernel moves a process by its pid without
// waiting for a grace period (favordynmods), where the sh would only cost
// its exec.
func (h *cgroupHost) joinsItself() bool { return h != nil && !h.v2 && !h.dynmods }

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

// rename renames ref's workspace cgroups to to's (a pooled workspace's,
// at its take); on an error none is renamed.
func (h *cgroupHost) rename(ref, to string) error {
	var done []string
	for _, d := range h.controllers(ref) {
		if err := os.Rename(d, filepath.Join(filepath.Dir(d), to)); err != nil {
			for _, d := range done {
				os.Rename(filepath.Join(filepath.Dir(d), to), d)
			}
			return scrub(err)
		}
		done = append(done, d)
	}
	return nil
}

// removeParents removes the parent cgroups New made, on v1, where they
// are empty (a removal fails while a workspace cgroup is in one); on v2
// the parent keeps its subtree_control.
func (h *cgroupHost) removeParents() {
	if h == nil || h.v2 {
		return
	}
	for _, d := range h.dirs {
		os.Remove(d)
	}
}

// empty kills every process left in ref's cgroups, leaves included,
// until none is left; remove then removes the cgroups themselves.
// Terminate empties them on its path and removes them after it.
func (h *cgroupHost) empty(ref string) {
	for _, d := range h.controllers(ref) {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if e.IsDir() {
				killCgroup(filepath.Join(d, e.Name()))
			}
		}
		killCgroup(d)
	}
}

// remove kills every process left in ref's cgroups (empty) and removes
// them, leaves first.
func (h *cgroupHost) remove(ref string) {
	h.empty(ref)
	for _, d := range h.controllers(ref) {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if e.IsDir() {
				rmdirRetry(filepath.Join(d, e.Name()))
			}
		}
		rmdirRetry(d)
	}
}

// killCgroup SIGKILLs every process in the cgroup dir until it is empty
// (bounded: a process stuck in the kernel is left to the next try).
func killCgroup(dir string) {
	for range 100 {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		pids := strings.Fields(string(b))
		if err != nil || len(pids) == 0 {
			return
		}
		for _, s := range pids {
			if pid, err := strconv.Atoi(s); err == nil && pid > 0 {
				killPid(pid)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
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
