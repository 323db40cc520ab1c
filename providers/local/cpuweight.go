package local

import (
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate"
)

// CPU weights: who yields when workspaces contend for a CPU.
//
// A workspace's CPU quota and affinity bound how much it may use, but not
// how it shares a CPU it has been given with a neighbour pinned to the
// same one: at equal weights the kernel splits a contended CPU evenly, so
// a workspace that keeps its core busy (a fork tree, a build, a loop)
// halves the speed of a neighbour's short exec. The governor below gives
// the background weight (1/16 of the normal one) to every workspace that
// is busy for two ticks in a row, and gives its normal weight back after
// three quiet ones. Busy is either of:
//
//   - long-running work using CPU: an exec or durable command (a leaf
//     cgroup) that has run for longer than longLeaf and used at least
//     leafShare of a core in the tick. This holds on an overcommitted
//     host too, where a hog gets far less than its quota;
//   - the workspace used at least hotShare of its cores in the tick
//     (short execs chained without pause, on a host with room).
//
// A background workspace still gets the whole of its quota whenever
// nobody else wants the CPU; it only yields to others' short work. What
// the processes do decides, not how they were started: a hog in an exec
// is treated as one in a durable command, and a client running one short
// exec after another (each its own leaf, well under longLeaf) keeps its
// weight.

const (
	// cpuTick is how often the governor samples the workspaces' usage.
	cpuTick = time.Second
	// hotShare is the share of its cores above which a workspace counts
	// as busy in a tick; after hotTicks busy ticks in a row it gets the
	// background weight.
	hotShare = 0.75
	hotTicks = 2
	// longLeaf and leafShare: an exec or command that has run longer
	// than longLeaf and used leafShare of a core in a tick makes its
	// workspace busy in that tick.
	longLeaf  = time.Second
	leafShare = 0.05
	// coldShare is the share below which a background workspace with no
	// long-running work counts as quiet in a tick; after coldTicks quiet
	// ticks in a row it gets its normal weight back.
	coldShare = 0.25
	coldTicks = 3
	// activeShare is the share of one core the data directory's
	// workspaces together must have used in a tick for the governor to
	// look at each of them.
	activeShare = 0.02
	// backgroundDivisor divides the normal weight into the background one.
	backgroundDivisor = 16
)

// cpuWeight is a workspace's weight: v1 cpu.shares (default 1024) or v2
// cpu.weight (default 100), in proportion to its cores, divided by
// backgroundDivisor for a busy workspace.
func cpuWeight(v2 bool, cores int, background bool) int {
	unit, lowest, highest := 1024, 2, 262144
	if v2 {
		unit, lowest, highest = 100, 1, 10000
	}
	w := unit * max(cores, 1)
	if background {
		w /= backgroundDivisor
	}
	return min(max(w, lowest), highest)
}

// cpuState is what the governor knows of one workspace.
type cpuState struct {
	usage      uint64    // nanoseconds of CPU, at sampled
	sampled    time.Time // zero: not sampled yet
	cores      int
	hot, cold  int // busy or quiet ticks in a row
	background bool
	leaves     map[string]*leafState
}

// leafState is one exec's or command's leaf cgroup.
type leafState struct {
	seen    time.Time // first seen: its age, near enough
	usage   uint64
	sampled time.Time
}

// observe records a tick in which the workspace used share of its cores,
// and had (long) long-running work using CPU or not, and reports whether
// its weight must change (background then says to which).
func (s *cpuState) observe(share float64, long bool) bool {
	if share >= hotShare || long {
		s.hot++
	} else {
		s.hot = 0
	}
	if share < coldShare && !long {
		s.cold++
	} else {
		s.cold = 0
	}
	switch {
	case !s.background && s.hot >= hotTicks:
		s.background = true
		return true
	case s.background && s.cold >= coldTicks:
		s.background = false
		return true
	}
	return false
}

// cpuGovernor samples every workspace cgroup's usage and sets its weight.
// Every broker process on a data directory runs one; they agree, since
// each decides from the same counters. With no broker process running,
// weights stay as they were last set.
type cpuGovernor struct {
	h        *cgroupHost
	hostCPUs int
	log      *slog.Logger

	parent   uint64 // the parent cgroup's usage at the last tick
	lastTick time.Time
	ws       map[string]*cpuState
}

func newCPUGovernor(h *cgroupHost, hostCPUs int, log *slog.Logger) *cpuGovernor {
	return &cpuGovernor{h: h, hostCPUs: hostCPUs, log: log, ws: make(map[string]*cpuState)}
}

// run ticks every tick until stop is closed.
func (g *cpuGovernor) run(tick time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			g.tick(now)
		}
	}
}

// tick samples and decides. When the data directory's workspaces together
// used less than activeShare of one core since the last tick, none of
// them can be busy, and only the background ones are looked at (to give
// their weight back): an idle host costs one read per tick, however many
// workspaces it holds.
func (g *cpuGovernor) tick(now time.Time) {
	parent, err := readUsage(g.h.v2, g.h.acct)
	if err != nil {
		return
	}
	quiet := !g.lastTick.IsZero() && float64(parent-g.parent) < activeShare*float64(now.Sub(g.lastTick).Nanoseconds())
	g.parent, g.lastTick = parent, now
	if quiet {
		for ref, s := range g.ws {
			if s.background {
				g.sample(now, ref, s)
			} else {
				s.hot = 0 // busy ticks must follow one another
			}
		}
		return
	}
	entries, err := os.ReadDir(g.h.acct)
	if err != nil {
		return
	}
	seen := make(map[string]bool, len(entries))
	for _, e := range entries {
		ref := e.Name()
		if !e.IsDir() || checkRef(ref) != nil {
			continue
		}
		seen[ref] = true
		s := g.ws[ref]
		if s == nil {
			s = g.first(ref)
			g.ws[ref] = s
		}
		g.sample(now, ref, s)
	}
	for ref := range g.ws {
		if !seen[ref] {
			delete(g.ws, ref) // terminated
		}
	}
}

// first is the state of a workspace the governor has not seen before:
// its cores from its quota, and whether an earlier broker process left it
// at the background weight.
func (g *cpuGovernor) first(ref string) *cpuState {
	s := &cpuState{cores: g.cores(ref), leaves: make(map[string]*leafState)}
	file := "cpu.shares"
	if g.h.v2 {
		file = "cpu.weight"
	}
	if b, err := os.ReadFile(filepath.Join(g.h.cpu, ref, file)); err == nil {
		w, err := strconv.Atoi(strings.TrimSpace(string(b)))
		s.background = err == nil && w < cpuWeight(g.h.v2, s.cores, false)
	}
	return s
}

// sample reads ref's usage and, once it has a previous sample, decides.
func (g *cpuGovernor) sample(now time.Time, ref string, s *cpuState) {
	usage, err := readUsage(g.h.v2, filepath.Join(g.h.acct, ref))
	if err != nil {
		return
	}
	prev, prevAt := s.usage, s.sampled
	s.usage, s.sampled = usage, now
	if prevAt.IsZero() || usage < prev {
		return
	}
	share := float64(usage-prev) / float64(now.Sub(prevAt).Nanoseconds()*int64(s.cores))
	if !s.observe(share, g.longRunning(now, ref, s)) {
		return
	}
	w := cpuWeight(g.h.v2, s.cores, s.background)
	file := "cpu.shares"
	if g.h.v2 {
		file = "cpu.weight"
	}
	if err := os.WriteFile(filepath.Join(g.h.cpu, ref, file), []byte(strconv.Itoa(w)), 0); err != nil {
		return // terminated meanwhile
	}
	if s.background {
		g.log.Info("workspace kept its cores busy: background CPU weight", sandgate.WorkspaceAttr(ref), "weight", w)
	} else {
		g.log.Info("workspace quiet again: normal CPU weight", sandgate.WorkspaceAttr(ref), "weight", w)
	}
}

// longRunning samples the leaves of ref and reports whether one that has
// run longer than longLeaf used at least leafShare of a core since its
// last sample.
func (g *cpuGovernor) longRunning(now time.Time, ref string, s *cpuState) bool {
	dir := filepath.Join(g.h.acct, ref)
	entries, _ := os.ReadDir(dir)
	long := false
	seen := make(map[string]bool, len(entries))
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		name := e.Name()
		seen[name] = true
		l := s.leaves[name]
		if l == nil {
			l = &leafState{seen: now}
			s.leaves[name] = l
		}
		usage, err := readUsage(g.h.v2, filepath.Join(dir, name))
		if err != nil {
			continue
		}
		prev, prevAt := l.usage, l.sampled
		l.usage, l.sampled = usage, now
		if prevAt.IsZero() || usage < prev || now.Sub(l.seen) < longLeaf {
			continue
		}
		if float64(usage-prev) >= leafShare*float64(now.Sub(prevAt).Nanoseconds()) {
			long = true
		}
	}
	for name := range s.leaves {
		if !seen[name] {
			delete(s.leaves, name)
		}
	}
	return long
}

// cores is the workspace's CPU quota in cores, from its cgroup; the host's
// CPUs when it has none.
func (g *cpuGovernor) cores(ref string) int {
	var quota, period int
	if g.h.v2 {
		b, _ := os.ReadFile(filepath.Join(g.h.cpu, ref, "cpu.max"))
		f := strings.Fields(string(b))
		if len(f) == 2 {
			quota, _ = strconv.Atoi(f[0])
			period, _ = strconv.Atoi(f[1])
		}
	} else {
		q, _ := os.ReadFile(filepath.Join(g.h.cpu, ref, "cpu.cfs_quota_us"))
		p, _ := os.ReadFile(filepath.Join(g.h.cpu, ref, "cpu.cfs_period_us"))
		quota, _ = strconv.Atoi(strings.TrimSpace(string(q)))
		period, _ = strconv.Atoi(strings.TrimSpace(string(p)))
	}
	if quota <= 0 || period <= 0 {
		return max(g.hostCPUs, 1)
	}
	return max((quota+period-1)/period, 1)
}

// readUsage returns the CPU time, in nanoseconds, that the cgroup dir and
// its descendants used: v1 cpuacct.usage, v2 cpu.stat's usage_usec.
func readUsage(v2 bool, dir string) (uint64, error) {
	if !v2 {
		b, err := os.ReadFile(filepath.Join(dir, "cpuacct.usage"))
		if err != nil {
			return 0, err
		}
		return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	b, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "usage_usec" {
			us, err := strconv.ParseUint(f[1], 10, 64)
			return us * 1000, err
		}
	}
	return 0, os.ErrNotExist
}
