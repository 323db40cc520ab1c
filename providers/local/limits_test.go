package local_test

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// TestCgroupLimits checks the files that hold a small workspace's limits:
// memory (swap included) at its size, 1024 processes, one core of quota.
func TestCgroupLimits(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	sb := providertest.Create(t, p, providertest.Spec(t)) // small: 1 core, 512 MiB
	dirs := local.CgroupDirs(p, sb.Ref)
	want := map[string]string{
		"memory.limit_in_bytes":       strconv.Itoa(512 << 20),
		"memory.memsw.limit_in_bytes": strconv.Itoa(512 << 20),
		"pids.max":                    "1024",
		"cpu.cfs_quota_us":            "100000",
		"cpu.cfs_period_us":           "100000",
		// v2 names, where the host has v2.
		"memory.max":      strconv.Itoa(512 << 20),
		"memory.swap.max": "0",
		"cpu.max":         "100000 100000",
	}
	found := map[string]bool{}
	for _, d := range dirs {
		for name, w := range want {
			b, err := os.ReadFile(filepath.Join(d, name))
			if err != nil {
				continue
			}
			found[name] = true
			if got := strings.TrimSpace(string(b)); got != w {
				t.Errorf("%s = %q; want %q", name, got, w)
			}
		}
	}
	v1 := []string{"memory.limit_in_bytes", "pids.max", "cpu.cfs_quota_us"}
	v2 := []string{"memory.max", "pids.max", "cpu.max"}
	if !all(found, v1) && !all(found, v2) {
		t.Errorf("limits found in %v: %v; want memory, pids and cpu", dirs, found)
	}
	if err := p.Terminate(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	local.WaitTeardown(p)
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup %s left after Terminate's teardown", d)
		}
	}
}

// TestLateLeafAfterTerminate: an exec that opened its workspace before a
// Terminate and makes its leaf cgroup after the teardown removed the
// workspace's cgroups is told the workspace is gone, and leaves no
// cgroup behind; a live workspace whose cgroups are missing (a reboot)
// gets them again.
func TestLateLeafAfterTerminate(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	live := providertest.Create(t, p, providertest.Spec(t))
	gone := providertest.Create(t, p, providertest.Spec(t))
	exist := func(ref string) (n int) {
		for _, d := range local.CgroupDirs(p, ref) {
			if _, err := os.Stat(d); err == nil {
				n++
			}
		}
		return n
	}
	if exist(live.Ref) == 0 || exist(gone.Ref) == 0 {
		t.Fatal("a new workspace has no cgroup")
	}

	rec, err := local.ReadRecord(p, live.Ref)
	if err != nil {
		t.Fatal(err)
	}
	local.RemoveCgroups(p, live.Ref)
	if n := exist(live.Ref); n != 0 {
		t.Fatalf("%d cgroups of the workspace left after their removal", n)
	}
	if err := local.MakeLeaf(p, live.Ref, rec); err != nil {
		t.Errorf("leaf of a live workspace whose cgroups are missing: %v; want them made again", err)
	}
	for _, d := range local.CgroupDirs(p, live.Ref) {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("live workspace's cgroup after the leaf: %v; want it there", err)
		}
	}

	rec, err = local.ReadRecord(p, gone.Ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Terminate(t.Context(), gone); err != nil {
		t.Fatal(err)
	}
	local.WaitTeardown(p)
	if n := exist(gone.Ref); n != 0 {
		t.Fatalf("%d cgroups of the workspace left after Terminate's teardown", n)
	}
	if err := local.MakeLeaf(p, gone.Ref, rec); !errors.Is(err, providers.ErrSandboxGone) {
		t.Errorf("leaf after Terminate: %v; want ErrSandboxGone", err)
	}
	for _, d := range local.CgroupDirs(p, gone.Ref) {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup %s made again by a leaf after Terminate", d)
		}
	}
}

func all(found map[string]bool, names []string) bool {
	for _, n := range names {
		if !found[n] {
			return false
		}
	}
	return true
}

// TestMemoryAcrossProcesses: four processes of 256 MiB each in a 512 MiB
// workspace (each well under the per-process limit) run out of the
// workspace's memory together; the exec reports the OOM kill as 137, and
// another workspace allocating meanwhile is unaffected.
func TestMemoryAcrossProcesses(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	hog := providertest.Create(t, p, providertest.Spec(t))
	quiet := providertest.Create(t, p, providertest.Spec(t))
	// tail buffers a line without newlines whole: each one holds 256 MiB.
	const alloc = "head -c 256M /dev/zero | tail >/dev/null"
	var wg sync.WaitGroup
	var quietRes []providers.ExecResult
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 3 {
			quietRes = append(quietRes, providertest.Exec(t, p, quiet, "sh", "-c", alloc))
		}
	}()
	res := providertest.Exec(t, p, hog, "sh", "-c", "for i in 1 2 3 4; do ("+alloc+") & done; wait")
	wg.Wait()
	if res.ExitCode != 137 {
		t.Errorf("1 GiB over four processes in a 512 MiB workspace: exit %d; want 137 (%s)", res.ExitCode, res.Stderr)
	}
	for i, r := range quietRes {
		if r.ExitCode != 0 {
			t.Errorf("256 MiB in the other workspace, run %d: exit %d; want 0 (%s)", i, r.ExitCode, r.Stderr)
		}
	}
	// The hog's workspace works on afterwards.
	if r := providertest.Exec(t, p, hog, "sh", "-c", alloc); r.ExitCode != 0 {
		t.Errorf("256 MiB after the OOM kill: exit %d; want 0 (%s)", r.ExitCode, r.Stderr)
	}
}

// TestPidsLimit: a fork tree stops at the tier's process cap.
func TestPidsLimit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p, err := local.New(t.Context(), local.Config{DataDir: dir, Tiers: map[string]local.Tier{"small": {Pids: 64}}}, providers.Env{BrokerID: broker})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(p) })
	sb := providertest.Create(t, p, providertest.Spec(t))
	// Each round forks a sleeper; the shell dies when fork fails.
	res := providertest.Exec(t, p, sb, "sh", "-c", `n=0; while [ $n -lt 500 ]; do sleep 600 & n=$((n+1)); echo $n > /tmp/n; done`)
	b := providertest.Exec(t, p, sb, "cat", "/tmp/n").Stdout
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if res.ExitCode == 0 || n >= 64 || n < 10 {
		t.Errorf("fork tree under a cap of 64: exit %d after %d sleepers; want a failure before 64", res.ExitCode, n)
	}
	// The sleepers died with their exec: the workspace can fork again.
	if r := providertest.Exec(t, p, sb, "sh", "-c", "sleep 0 & wait"); r.ExitCode != 0 {
		t.Errorf("fork after the tree ended: exit %d; want 0 (%s)", r.ExitCode, r.Stderr)
	}
}

// TestCommandsInCgroup: a durable command's runner, and so its sandbox,
// runs in its workspace's cgroups.
func TestCommandsInCgroup(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	p := newProvider(t, dataDir, broker)
	sb := providertest.Create(t, p, providertest.Spec(t))
	if err := p.StartCommand(t.Context(), sb, "cg", providers.ExecSpec{Argv: []string{"sleep", "60"}, Timeout: time.Minute}); err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
	pid := runnerPID(t, dataDir, sb, "cg")
	// The runner joins them first thing, before it forks, one controller
	// after another: wait until it has written its pid into every one. On
	// v1 it joins a leaf of its own in memory (OOM kills) and cpuacct (CPU
	// usage), and the workspace's cgroup itself in pids and cpu.
	ctls := []string{"memory", "pids", "cpu"}
	missing := func(b []byte) []string {
		var out []string
		for _, ctl := range ctls {
			found := false
			for _, l := range strings.Split(string(b), "\n") {
				f := strings.SplitN(l, ":", 3)
				if len(f) == 3 && (f[1] == "" || strings.Contains(","+f[1]+",", ","+ctl+",")) &&
					(strings.HasSuffix(f[2], "/"+sb.Ref+"/c-cg") || (ctl != "memory" && strings.HasSuffix(f[2], "/"+sb.Ref))) {
					found = true
				}
			}
			if !found {
				out = append(out, ctl)
			}
		}
		return out
	}
	var b []byte
	waitUntil(t, "the runner to join its cgroups", func() bool {
		b, _ = os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
		return len(missing(b)) == 0
	})
	for _, ctl := range missing(b) {
		t.Errorf("runner's %s cgroup not its workspace's: %s", ctl, b)
	}
	if err := p.Terminate(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
}

// TestNewRefusesUnenforceable: without cgroups, New fails and says which
// limits cannot be enforced; allowed (sandgate dev), it warns and runs.
func TestNewRefusesUnenforceable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fake := filepath.Join(dir, "mountinfo")
	if err := os.WriteFile(fake, []byte("22 1 0:21 / /proc rw - proc proc rw\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := local.Config{DataDir: filepath.Join(dir, "data")}
	local.SetMountinfo(&c, fake)
	_, err := local.New(t.Context(), c, providers.Env{BrokerID: broker})
	if err == nil {
		t.Fatalf("New without cgroups = nil error; want a refusal")
	}
	for _, ctl := range []string{"memory", "pids", "cpu"} {
		if !strings.Contains(err.Error(), ctl) {
			t.Errorf("New without cgroups = %q; want it to name %s", err, ctl)
		}
	}
	c.AllowUnenforced = true
	var logs bytes.Buffer
	p, err := local.New(t.Context(), c, providers.Env{BrokerID: broker, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("New without cgroups, allowed = %v; want a provider", err)
	}
	if !strings.Contains(logs.String(), "NOT ENFORCED") || !strings.Contains(logs.String(), "memory") {
		t.Errorf("New without cgroups, allowed, logged %q; want a warning naming memory", logs.String())
	}
	t.Cleanup(func() { providertest.Discard(p) })
	sb := providertest.Create(t, p, providertest.Spec(t))
	if r := providertest.Exec(t, p, sb, "true"); r.ExitCode != 0 {
		t.Errorf("exec without cgroups: exit %d (%s)", r.ExitCode, r.Stderr)
	}
}
