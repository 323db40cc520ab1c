package main

// The idle-workspace figure (issue 17): what N live, idle local workspaces
// cost the host. The tool runs the local provider itself, as the broker
// does (the same library, real cgroups, disk images and uids), measures
// the host's CPU from /proc/stat over a window with no workspace, creates
// N `small` workspaces with an hour to live, waits for the host to settle,
// and measures the same window again. Beside the host's figure, which
// other work on a shared host moves, it reports the CPU time used in the
// window by the supervisor processes themselves (and their reaped
// children), and by this process (the provider's own goroutines), which
// nothing else moves. It removes everything at the end and exits; every
// step is bounded (the counts by -n, the whole run by -timeout).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
)

// clockTicks is USER_HZ, the unit of /proc/stat and /proc/PID/stat times.
const clockTicks = 100

func runIdle(ctx context.Context, n int, window time.Duration, diskMiB int) error {
	if n < 1 || n > 5000 || window < time.Second || window > 10*time.Minute {
		return errors.New("-n must be 1 to 5000 and -window 1s to 10m")
	}
	dir, err := os.MkdirTemp("", "sandgate-idle-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := local.New(ctx, local.Config{
		DataDir: filepath.Join(dir, "data"),
		// Small images: N of the default 1 GiB would commit more than the
		// host's disk. Nothing runs between execs either way.
		Tiers: map[string]local.Tier{"small": {DiskMiB: diskMiB}},
	}, providers.Env{BrokerID: "sandgate-load-idle"})
	if err != nil {
		return err
	}
	defer p.Close()

	fmt.Printf("host: %d CPUs; window %s; %d idle small workspaces (disk %d MiB each)\n\n", cpuCount(), window, n, diskMiB)
	dataDir := p.DataDir()
	none, err := sampleIdle(ctx, window, dataDir)
	if err != nil {
		return err
	}
	// A second empty window right after the first: how far the host's own
	// figure moves with nothing of ours running, the noise to read the
	// difference against.
	none2, err := sampleIdle(ctx, window, dataDir)
	if err != nil {
		return err
	}

	var sbs []providers.Sandbox
	defer func() {
		ctx := context.WithoutCancel(ctx)
		for _, sb := range sbs {
			p.Terminate(ctx, sb)
		}
	}()
	size := sandgate.Size{Name: "small", CPUCores: 1, MemoryMiB: 512}
	started := time.Now()
	for i := range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		sb, err := p.Create(ctx, providers.CreateSpec{
			WorkspaceID: fmt.Sprintf("ws_idle%05d", i), InstanceID: "inst_idle", Size: size,
			ExpiresAt: time.Now().Add(time.Hour),
		})
		if err != nil {
			return fmt.Errorf("create %d: %w", i, err)
		}
		sbs = append(sbs, sb)
	}
	created := time.Since(started)
	if _, err := p.Exec(ctx, sbs[0], providers.ExecSpec{Argv: []string{"true"}, Timeout: time.Minute}); err != nil {
		return fmt.Errorf("exec in a workspace: %w", err)
	}
	// Let what creating them started settle: their disk images' blocks are
	// written back now rather than in the window (a copy of the template
	// leaves them dirty for the kernel's 30 s writeback, where mkfs synced
	// them itself), then whatever that started ends.
	syscall.Sync()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(10 * time.Second):
	}
	live, err := sampleIdle(ctx, window, dataDir)
	if err != nil {
		return err
	}

	fmt.Printf("created %d workspaces in %s\n\n", n, created.Round(time.Millisecond))
	fmt.Println("| figure | no workspace | no workspace, again | " + strconv.Itoa(n) + " idle workspaces |")
	fmt.Println("| --- | ---: | ---: | ---: |")
	fmt.Printf("| host CPU busy (/proc/stat, all CPUs) | %.1f %% | %.1f %% | %.1f %% |\n", none.hostBusy*100, none2.hostBusy*100, live.hostBusy*100)
	fmt.Printf("| load average (1 min) at the end | %s | %s | %s |\n", none.load, none2.load, live.load)
	fmt.Printf("| supervisor processes | %d | %d | %d |\n", none.supervisors, none2.supervisors, live.supervisors)
	fmt.Printf("| CPU of the supervisors in the window (their reaped children included) | %.2f s | %.2f s | %.2f s |\n",
		none.supervisorCPU, none2.supervisorCPU, live.supervisorCPU)
	fmt.Printf("| CPU of the provider's own process in the window | %.2f s | %.2f s | %.2f s |\n", none.selfCPU, none2.selfCPU, live.selfCPU)
	base := (none.hostBusy + none2.hostBusy) / 2
	fmt.Printf("\nhost busy, %d workspaces − none (mean of the two): %+.1f points; the two empty windows differ by %.1f points (the noise)\n",
		n, (live.hostBusy-base)*100, math.Abs(none.hostBusy-none2.hostBusy)*100)
	return nil
}

// idleSample is one window's measurements.
type idleSample struct {
	hostBusy      float64 // share of all CPUs' time not idle
	load          string
	supervisors   int
	supervisorCPU float64 // seconds
	selfCPU       float64 // seconds
}

func sampleIdle(ctx context.Context, window time.Duration, dataDir string) (idleSample, error) {
	busy0, total0, err := procStat()
	if err != nil {
		return idleSample{}, err
	}
	sup0 := supervisorTicks(dataDir)
	self0 := selfCPU()
	select {
	case <-ctx.Done():
		return idleSample{}, ctx.Err()
	case <-time.After(window):
	}
	busy1, total1, err := procStat()
	if err != nil {
		return idleSample{}, err
	}
	sup1 := supervisorTicks(dataDir)
	var s idleSample
	s.hostBusy = float64(busy1-busy0) / float64(max(total1-total0, 1))
	s.selfCPU = (selfCPU() - self0).Seconds()
	s.supervisors = len(sup1)
	var ticks uint64
	for pid, t1 := range sup1 {
		// A supervisor that started in the window counts from zero.
		ticks += t1 - sup0[pid]
	}
	s.supervisorCPU = float64(ticks) / clockTicks
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		s.load = strings.Fields(string(b))[0]
	}
	return s, nil
}

// procStat returns the host's busy and total CPU time from /proc/stat's
// "cpu" line (idle and iowait count as not busy).
func procStat() (busy, total uint64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0, errors.New("/proc/stat: no cpu line")
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %w", err)
		}
		if i >= 8 { // guest and guest_nice are already in user and nice
			break
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total, nil
}

// supervisorTicks returns, for each supervisor process of dataDir (argv[0]
// local.SupervisorName and the data directory, or a workspace of it, in
// its command line: the one per data directory, or a per-workspace sh of
// a broker from before it), its CPU time and that of its reaped children,
// in clock ticks.
func supervisorTicks(dataDir string) map[int]uint64 {
	out := map[int]uint64{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cmdline, []byte(local.SupervisorName)) || !bytes.Contains(cmdline, []byte(dataDir)) {
			continue
		}
		if t, ok := pidTicks(pid); ok {
			out[pid] = t
		}
	}
	return out
}

// pidTicks returns process pid's CPU time and that of its reaped
// children, in clock ticks (/proc/PID/stat's utime, stime, cutime and
// cstime); false when it cannot be read.
func pidTicks(pid int) (uint64, bool) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 15 {
		return 0, false
	}
	var t uint64
	for _, v := range f[11:15] { // utime stime cutime cstime (fields 14–17)
		n, _ := strconv.ParseUint(v, 10, 64)
		t += n
	}
	return t, true
}

// selfCPU is this process's CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func cpuCount() int {
	b, _ := os.ReadFile("/proc/stat")
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "cpu") && !strings.HasPrefix(l, "cpu ") {
			n++
		}
	}
	return n
}
