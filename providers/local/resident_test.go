package local_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// newResidentProvider is newProvider on its own data directory: its
// execs run on the residents (the default).
func newResidentProvider(t *testing.T) *local.Provider {
	t.Helper()
	p, err := local.New(t.Context(), local.Config{DataDir: t.TempDir()}, providers.Env{BrokerID: broker})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(p) })
	return p
}

// residents returns the host pids of running residents.
func residents(t *testing.T) []string {
	t.Helper()
	return hostProcesses(t, "\x00--sandgate-exec-resident\x00")
}

// waitGone polls until no host process has marker in its command line.
func waitGone(t *testing.T, marker string) bool {
	t.Helper()
	for range 200 {
		if len(hostProcesses(t, marker)) == 0 {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

func TestResidentRestartedAfterKill(t *testing.T) {
	t.Parallel()
	p := newResidentProvider(t)
	sb := providertest.Create(t, p, providertest.Spec(t))
	if res := providertest.Exec(t, p, sb, "echo", "ready"); string(res.Stdout) != "ready\n" {
		t.Fatalf("first exec = %q, exit %d", res.Stdout, res.ExitCode)
	}
	// The tenant kills everything it can, the resident included.
	res := providertest.Exec(t, p, sb, "sh", "-c", "kill -9 -1; sleep 5")
	if res.ExitCode != 137 {
		t.Errorf("kill -9 -1: exit %d; want 137", res.ExitCode)
	}
	for i := range 3 {
		res := providertest.Exec(t, p, sb, "echo", "again")
		if string(res.Stdout) != "again\n" || res.ExitCode != 0 {
			t.Fatalf("exec %d after the resident was killed = %q, exit %d; want \"again\", 0", i, res.Stdout, res.ExitCode)
		}
	}
}

func TestResidentTimeoutKillsOnlyItsExec(t *testing.T) {
	t.Parallel()
	p := newResidentProvider(t)
	sb := providertest.Create(t, p, providertest.Spec(t))

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	other := make(chan error, 1)
	go func() {
		_, err := p.Exec(ctx, sb, providers.ExecSpec{Argv: []string{"sleep", "4712"}, MaxOutputBytes: 1 << 10})
		other <- err
	}()
	for range 200 {
		if len(hostProcesses(t, "sleep\x004712\x00")) > 0 {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	res := providertest.ExecWith(t, p, sb, providers.ExecSpec{
		// A grandchild in a session of its own, detached from the output.
		Argv:    []string{"sh", "-c", "setsid sleep 4711 >/dev/null 2>&1 </dev/null & sleep 4711"},
		Timeout: time.Second,
	})
	if !res.TimedOut || res.ExitCode != 137 {
		t.Errorf("Exec = exit %d, timed out %v; want 137, true", res.ExitCode, res.TimedOut)
	}
	if !waitGone(t, "sleep\x004711\x00") {
		t.Errorf("processes of the timed-out exec left: %q", hostProcesses(t, "sleep\x004711\x00"))
	}
	if len(hostProcesses(t, "sleep\x004712\x00")) == 0 {
		t.Errorf("the other exec was killed with the timed-out one")
	}
	select {
	case err := <-other:
		t.Fatalf("the other exec ended: %v", err)
	default:
	}
	cancel()
	if err := <-other; err == nil {
		t.Errorf("cancelled exec: no error")
	}
	if !waitGone(t, "sleep\x004712\x00") {
		t.Errorf("the cancelled exec's process is left")
	}
}

func TestResidentConcurrentExecs(t *testing.T) {
	t.Parallel()
	p := newResidentProvider(t)
	sb := providertest.Create(t, p, providertest.Spec(t))
	var wg sync.WaitGroup
	var a providers.ExecResult
	wg.Go(func() {
		// Waits for the other exec, which must run meanwhile; 4715 marks
		// it in its command line.
		a = providertest.Exec(t, p, sb, "sh", "-c", "while [ ! -e /tmp/b ]; do sleep 0.01; done; echo a", "sh", "4715")
	})
	// Commands of one workspace see each other, as on the vendors (the
	// marker is built so that this command's own line does not hold it).
	b := providertest.Exec(t, p, sb, "sh", "-c", `m=47; m=${m}15; until grep -qs "$m" /proc/[0-9]*/cmdline; do sleep 0.01; done; echo b; touch /tmp/b`)
	wg.Wait()
	if string(a.Stdout) != "a\n" || string(b.Stdout) != "b\n" || a.ExitCode != 0 || b.ExitCode != 0 {
		t.Errorf("execs = %q (exit %d), %q (exit %d); want \"a\", \"b\", 0", a.Stdout, a.ExitCode, b.Stdout, b.ExitCode)
	}
}

func TestResidentOutputLimits(t *testing.T) {
	t.Parallel()
	p := newResidentProvider(t)
	sb := providertest.Create(t, p, providertest.Spec(t))
	res := providertest.ExecWith(t, p, sb, providers.ExecSpec{
		Argv:           []string{"sh", "-c", "head -c 3000000 /dev/zero; head -c 5 /dev/zero >&2; exit 3"},
		MaxOutputBytes: 1000,
	})
	if len(res.Stdout) != 1000 || res.StdoutBytes != 3000000 || !res.StdoutTruncated {
		t.Errorf("stdout: kept %d of %d, truncated %v; want 1000 of 3000000, true", len(res.Stdout), res.StdoutBytes, res.StdoutTruncated)
	}
	if len(res.Stderr) != 5 || res.StderrBytes != 5 || res.StderrTruncated || res.ExitCode != 3 {
		t.Errorf("stderr: kept %d of %d, truncated %v, exit %d; want 5 of 5, false, 3", len(res.Stderr), res.StderrBytes, res.StderrTruncated, res.ExitCode)
	}
}

// TestResidentChannelUnreachable: no process of the sandbox holds or can
// reach the resident's control socket, and none can trace the resident.
func TestResidentChannelUnreachable(t *testing.T) {
	t.Parallel()
	p := newResidentProvider(t)
	sb := providertest.Create(t, p, providertest.Spec(t))
	res := providertest.Exec(t, p, sb, "sh", "-c", `
		for d in /proc/[0-9]*; do
			for f in $d/fd/*; do l=$(readlink $f 2>/dev/null) && echo "$d $l"; done
			cat $d/environ >/dev/null 2>&1 && echo "environ $d"
		done
		exit 0`)
	for _, l := range strings.Split(string(res.Stdout), "\n") {
		if strings.Contains(l, "socket:") {
			t.Errorf("a sandbox process sees a socket: %q", l)
		}
	}
	// The resident is pid 2, bwrap's init's one child: it is there, but
	// the sandbox cannot follow its descriptors or read its environment
	// (it may list their numbers: the directory belongs to the user
	// namespace's root).
	res = providertest.Exec(t, p, sb, "sh", "-c", `
		tr '\0' ' ' </proc/2/cmdline; echo
		for f in /proc/2/fd/*; do readlink $f >/dev/null 2>&1 && echo fd-readable; done
		cat /proc/2/environ >/dev/null 2>&1 && echo environ-readable
		exit 0`)
	if got := string(res.Stdout); !strings.Contains(got, "--sandgate-exec-resident") || strings.Contains(got, "readable") {
		t.Errorf("the sandbox on its pid 2 = %q; want the resident, nothing readable", got)
	}
}

type residentPid struct{ host, inner int }

// residentPids finds the residents: the host processes whose command
// line names one and that are pid 2 in their sandbox (bwrap's own
// processes have the same command line).
func residentPids(t *testing.T, p *local.Provider, sb providers.Sandbox) []residentPid {
	t.Helper()
	// It runs, as the workspace's host uid (other tests' run beside it).
	m := strings.Fields(string(providertest.Exec(t, p, sb, "cat", "/proc/self/uid_map").Stdout))
	if len(m) != 3 {
		t.Fatalf("uid_map = %q", m)
	}
	var out []residentPid
	for _, s := range residents(t) {
		b, err := os.ReadFile("/proc/" + s + "/status")
		if err != nil {
			continue
		}
		mine := false
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" {
				mine = f[1] == m[1]
			}
			if f := strings.Fields(l); mine && len(f) > 1 && f[0] == "NSpid:" {
				host, _ := strconv.Atoi(s)
				inner, _ := strconv.Atoi(f[len(f)-1])
				if inner == 2 { // not bwrap's (pid 1 inside, or outside)
					out = append(out, residentPid{host, inner})
				}
			}
		}
	}
	return out
}

// TestResidentRSS measures a resident's resident set (reported in
// README.md and docs/benchmarks.md) and bounds it.
func TestResidentRSS(t *testing.T) {
	p := newResidentProvider(t)
	sb := providertest.Create(t, p, providertest.Spec(t))
	for range 20 {
		providertest.Exec(t, p, sb, "echo", "ready")
	}
	pids := residentPids(t, p, sb)
	if len(pids) != 1 {
		t.Fatalf("residents of the workspace = %v; want one", pids)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pids[0].host) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	var rss int
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && (f[0] == "RssAnon:" || f[0] == "RssFile:" || f[0] == "VmData:") {
			t.Logf("resident %s %s KiB", f[0], f[1])
		}
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmRSS:" {
			rss, _ = strconv.Atoi(f[1])
		}
	}
	t.Logf("resident VmRSS = %d KiB", rss)
	if rss == 0 || rss > 32<<10 {
		t.Errorf("resident VmRSS = %d KiB; want (0, 32 MiB]", rss)
	}
}

// TestProviderResident runs the contract suite on resident execs.
func TestProviderResident(t *testing.T) {
	t.Parallel()
	providertest.Run(t, func(t *testing.T) providers.Provider { return newResidentProvider(t) })
}

// TestProviderBwrap runs the contract suite with a bwrap per exec
// (Config.BwrapExec), as on a host whose cgroups the resident cannot
// join a thread to.
func TestProviderBwrap(t *testing.T) {
	t.Parallel()
	providertest.Run(t, func(t *testing.T) providers.Provider {
		p, err := local.New(t.Context(), local.Config{DataDir: t.TempDir(), BwrapExec: true}, providers.Env{BrokerID: broker})
		if err != nil {
			t.Fatalf("local.New: %v", err)
		}
		t.Cleanup(func() { providertest.Discard(p) })
		return p
	})
}

// TestResidentOutsideTenantLimits: the commands a resident forks have the
// workspace's RLIMIT_DATA, soft and hard, and its memory cgroup, while
// the resident itself is in none of the workspace's cgroups and under no
// tenant limit: a command that runs its workspace out of memory is
// refused or killed, and the resident, and the execs it runs, go on.
func TestResidentOutsideTenantLimits(t *testing.T) {
	t.Parallel()
	p := newResidentProvider(t)
	spec := providertest.Spec(t)
	spec.Size = sandgate.Size{CPUCores: 1, MemoryMiB: 16}
	sb := providertest.Create(t, p, spec)

	res := providertest.Exec(t, p, sb, "sh", "-c", "grep 'Max data size' /proc/self/limits")
	if f := strings.Fields(string(res.Stdout)); len(f) < 5 || f[3] != strconv.Itoa(16<<20) || f[4] != strconv.Itoa(16<<20) {
		t.Errorf("the command's RLIMIT_DATA = %q; want 16 MiB, soft and hard", res.Stdout)
	}
	pids := residentPids(t, p, sb)
	if len(pids) != 1 {
		t.Fatalf("residents of the workspace = %v; want one", pids)
	}
	host := strconv.Itoa(pids[0].host)
	// Every thread of it, the ones that forked the commands above and
	// below (two at once) included: each went back to the resident's own
	// cgroups before its command was reported.
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { providertest.Exec(t, p, sb, "true") })
	}
	wg.Wait()
	tasks, err := os.ReadDir("/proc/" + host + "/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if b, err := os.ReadFile("/proc/" + host + "/task/" + task.Name() + "/cgroup"); err != nil || strings.Contains(string(b), sb.Ref) {
			t.Errorf("the cgroups of the resident's thread %s = %q (%v); want none of the workspace's", task.Name(), b, err)
		}
	}
	if res := providertest.Exec(t, p, sb, "sh", "-c", "head -c 32M /dev/zero | tail >/dev/null"); res.ExitCode == 0 {
		t.Errorf("a 32 MiB heap in a 16 MiB workspace: exit 0; want it refused")
	}
	if res := providertest.Exec(t, p, sb, "sh", "-c", "head -c 4M /dev/zero | tail >/dev/null && echo ok"); string(res.Stdout) != "ok\n" {
		t.Errorf("4 MiB after the refusals = %q, exit %d (%s); want ok", res.Stdout, res.ExitCode, res.Stderr)
	}
	if _, err := os.Stat("/proc/" + host); err != nil {
		t.Errorf("the resident is gone after its workspace ran out of memory: %v", err)
	}
}

// TestCreateStartsResident: a create starts the workspace's resident
// itself, so that the first exec does not wait for its start; Terminate
// ends it.
func TestCreateStartsResident(t *testing.T) {
	t.Parallel()
	p := newResidentProvider(t)
	sb := providertest.Create(t, p, providertest.Spec(t))
	pid := waitResident(t, p, sb)
	if res := providertest.Exec(t, p, sb, "echo", "ready"); string(res.Stdout) != "ready\n" {
		t.Fatalf("first exec = %q, exit %d", res.Stdout, res.ExitCode)
	}
	if got := local.Residents(p)[sb.Ref]; got != pid {
		t.Errorf("resident after the first exec: %d; want the one the create started, %d", got, pid)
	}
	terminateEnds(t, p, sb, pid)
}

// TestUnusedResidentStops: the resident a create started, when no exec
// comes, is stopped within seconds, its mount namespace with it, so that
// idle workspaces keep neither; the next exec starts another.
func TestUnusedResidentStops(t *testing.T) {
	t.Parallel()
	p := newResidentProvider(t)
	sb := providertest.Create(t, p, providertest.Spec(t))
	pid := waitResident(t, p, sb)
	for deadline := time.Now().Add(time.Minute); local.Residents(p)[sb.Ref] != 0 || local.HasNS(p, sb.Ref) || local.Alive(pid); {
		if time.Now().After(deadline) {
			t.Fatalf("an unused resident (%d) or its namespace (%v) is kept a minute after the create", pid, local.HasNS(p, sb.Ref))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if res := providertest.Exec(t, p, sb, "echo", "ready"); string(res.Stdout) != "ready\n" {
		t.Fatalf("exec after the resident stopped = %q, exit %d", res.Stdout, res.ExitCode)
	}
}

// waitResident returns the host pid of sb's resident's bwrap once p has
// started one (the create does, in the background).
func waitResident(t *testing.T, p *local.Provider, sb providers.Sandbox) int {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if pid := local.Residents(p)[sb.Ref]; pid != 0 {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("no resident of a created workspace before its first exec: %v", local.Residents(p))
		}
	}
}

// terminateEnds terminates sb and checks that its resident (the host pid
// of its bwrap) ends: Terminate kills it, and waits for what the tenant
// ran (TestTerminateLeavesNothingOfTheTenant), not for the resident's own
// exit.
func terminateEnds(t *testing.T, p *local.Provider, sb providers.Sandbox, pid int) {
	t.Helper()
	if err := p.Terminate(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); local.Alive(pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the resident (%d) runs a minute after Terminate", pid)
		}
	}
}

// TestTerminateLeavesNothingOfTheTenant: when Terminate returns, no
// process an exec started runs any more, the exec's own and one it left
// in the background included, though it was in flight on the resident.
func TestTerminateLeavesNothingOfTheTenant(t *testing.T) {
	t.Parallel()
	p := newResidentProvider(t)
	sb := providertest.Create(t, p, providertest.Spec(t))
	done := make(chan error, 1)
	go func() {
		_, err := p.Exec(t.Context(), sb, providers.ExecSpec{
			Argv:    []string{"sh", "-c", "sleep 319 >/dev/null 2>&1 </dev/null & touch /tmp/started; sleep 319"},
			Timeout: 10 * time.Minute,
		})
		done <- err
	}()
	for i := 0; ; i++ {
		if _, err := providers.ReadFileBytes(t.Context(), p, sb, "/tmp/started", 10); err == nil {
			break
		}
		if i == 1000 {
			t.Fatal("the command never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := len(hostProcesses(t, "sleep\x00319\x00")); n != 2 {
		t.Fatalf("the exec's processes before Terminate: %d; want 2", n)
	}
	if err := p.Terminate(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	if left := hostProcesses(t, "sleep\x00319\x00"); len(left) != 0 {
		t.Errorf("processes of the tenant left when Terminate returned: %q", left)
	}
	if err := <-done; !errors.Is(err, providers.ErrSandboxGone) {
		t.Errorf("Exec across Terminate: %v; want ErrSandboxGone", err)
	}
}
