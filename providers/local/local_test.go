package local_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

const broker = "broker-test"

// newProvider returns a local provider over dataDir. It fails, never
// skips, when bwrap is missing or does not work.
func newProvider(t *testing.T, dataDir, brokerID string) *local.Provider {
	t.Helper()
	return newProviderLog(t, dataDir, brokerID, nil)
}

func newProviderLog(t *testing.T, dataDir, brokerID string, log *slog.Logger) *local.Provider {
	t.Helper()
	p, err := local.New(t.Context(), local.Config{DataDir: dataDir}, providers.Env{BrokerID: brokerID, Logger: log})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(p) })
	return p
}

func TestProvider(t *testing.T) {
	t.Parallel()
	providertest.Run(t, func(t *testing.T) providers.Provider {
		return newProvider(t, t.TempDir(), broker)
	})
}

func TestNewRefusesBrokenBwrap(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := local.New(t.Context(), local.Config{DataDir: dir, BwrapPath: filepath.Join(dir, "missing")}, providers.Env{})
	if err == nil {
		t.Errorf("New with a missing bwrap = nil error; want one")
	}
	// bwrap runs as the sandbox's unprivileged uid: it must reach it.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fake := filepath.Join(dir, "fake-bwrap")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'bwrap: no namespaces for you' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = local.New(t.Context(), local.Config{DataDir: dir, BwrapPath: fake}, providers.Env{})
	if err == nil || !strings.Contains(err.Error(), "no namespaces for you") {
		t.Errorf("New with a failing bwrap = %v; want an error quoting bwrap", err)
	}
	// The refused New leaves no parent cgroup behind (v1; a v2 parent keeps
	// its subtree_control by design).
	for _, ctl := range []string{"memory", "pids", "cpu", "cpuacct"} {
		root := filepath.Join("/sys/fs/cgroup", ctl)
		if _, err := os.Stat(filepath.Join(root, "tasks")); err != nil {
			continue // not a v1 hierarchy here
		}
		d := filepath.Join(root, local.DefaultCgroupParent(dir))
		if _, err := os.Stat(d); err == nil {
			t.Errorf("parent cgroup %s left by a New that failed", d)
		}
	}
	if _, err := local.New(t.Context(), local.Config{}, providers.Env{}); err == nil {
		t.Errorf("New without a data directory = nil error; want one")
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	spec := providertest.Spec(t)
	spec.Image = local.Image
	sb := providertest.Create(t, p, spec)
	res := providertest.Exec(t, p, sb, "pwd")
	if got := strings.TrimSpace(string(res.Stdout)); got != "/workspace" {
		t.Errorf("default working directory = %q; want /workspace", got)
	}
	// Only PATH, HOME, the workspace's Env, and PWD, which bwrap sets with --chdir.
	res = providertest.Exec(t, p, sb, "env")
	got := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
	want := map[string]bool{"HOME=/root": true, "PWD=/workspace": true, providertest.EnvVar + "=" + providertest.EnvValue: true}
	if len(got) != 4 {
		t.Errorf("environment = %q; want PATH, HOME, PWD and %s only", got, providertest.EnvVar)
	}
	for _, kv := range got {
		if !want[kv] && !strings.HasPrefix(kv, "PATH=") {
			t.Errorf("unexpected environment entry %q", kv)
		}
	}
	res = providertest.Exec(t, p, sb, "hostname")
	if got := strings.TrimSpace(string(res.Stdout)); got != "sandbox" {
		t.Errorf("hostname = %q; want sandbox", got)
	}
}

func TestCreateRefuses(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	p := newProvider(t, dataDir, broker)
	for _, tt := range []struct {
		name   string
		mutate func(*providers.CreateSpec)
	}{
		{"egress allowlist", func(s *providers.CreateSpec) { s.Egress.AllowedDomains = []string{"example.com"} }},
		{"other image", func(s *providers.CreateSpec) { s.Image = "ubuntu:24.04" }},
		{"parent dir id", func(s *providers.CreateSpec) { s.WorkspaceID = ".." }},
		{"path id", func(s *providers.CreateSpec) { s.WorkspaceID = "../escape" }},
		{"hidden id", func(s *providers.CreateSpec) { s.WorkspaceID = ".ws" }},
		{"empty id", func(s *providers.CreateSpec) { s.WorkspaceID = "" }},
		{"no size", func(s *providers.CreateSpec) { s.Size = sandgate.Size{} }},
		{"env name with =", func(s *providers.CreateSpec) { s.Env = map[string]string{"A=B": "c"} }},
		{"env value with NUL", func(s *providers.CreateSpec) { s.Env = map[string]string{"A": "b\x00c"} }},
	} {
		spec := providertest.Spec(t)
		tt.mutate(&spec)
		if sb, err := p.Create(t.Context(), spec); err == nil {
			p.Terminate(context.Background(), sb)
			t.Errorf("Create with %s = nil error; want one", tt.name)
		}
	}
	// Nothing was left behind, and nothing escaped the data directory.
	entries, err := os.ReadDir(filepath.Join(dataDir, "workspaces"))
	if err != nil || len(entries) != 0 {
		t.Errorf("workspaces after refused creates = %v, %v; want none", entries, err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "escape")); err == nil {
		t.Errorf("a refused id created a directory outside workspaces/")
	}

	spec := providertest.Spec(t)
	providertest.Create(t, p, spec)
	if _, err := p.Create(t.Context(), spec); err == nil {
		t.Errorf("second Create of one workspace id = nil error; want one")
	}
}

func TestNoNetwork(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)

	p := newProvider(t, t.TempDir(), broker)
	sb := providertest.Create(t, p, providertest.Spec(t))
	res := providertest.Exec(t, p, sb, "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/"+port)
	if res.ExitCode == 0 {
		t.Errorf("connecting to the host's 127.0.0.1:%s from the sandbox succeeded", port)
	}
	// A connection would be queued by now; none may be.
	ln.(*net.TCPListener).SetDeadline(time.Now())
	if c, err := ln.Accept(); err == nil {
		c.Close()
		t.Errorf("the host listener accepted a connection from the sandbox")
	}

	res = providertest.Exec(t, p, sb, "cat", "/proc/net/dev")
	var ifaces []string
	for _, line := range strings.Split(string(res.Stdout), "\n")[2:] {
		if name, _, ok := strings.Cut(line, ":"); ok {
			ifaces = append(ifaces, strings.TrimSpace(name))
		}
	}
	if len(ifaces) != 1 || ifaces[0] != "lo" {
		t.Errorf("network interfaces in the sandbox = %q; want [lo]", ifaces)
	}
}

func TestHostHidden(t *testing.T) {
	// Not parallel: t.Setenv plants a value in the broker's environment.
	t.Setenv("SANDGATE_HOST_ONLY", "host-secret-value")
	dataDir := t.TempDir()
	p := newProvider(t, dataDir, broker)
	sb := providertest.Create(t, p, providertest.Spec(t))

	hidden := []string{"/work", "/home", "/etc/hostname", "/etc/shadow", "/etc/resolv.conf", "/sys", "/var", "/opt", dataDir}
	res := providertest.Exec(t, p, sb, append([]string{"sh", "-c", `for p; do [ -e "$p" ] && echo "$p"; done; true`, "sh"}, hidden...)...)
	if len(res.Stdout) != 0 || res.ExitCode != 0 {
		t.Errorf("host paths visible in the sandbox (exit %d):\n%s", res.ExitCode, res.Stdout)
	}
	res = providertest.Exec(t, p, sb, "cat", "/etc/passwd")
	if n := strings.Count(string(res.Stdout), "\n"); n != 2 {
		t.Errorf("/etc/passwd has %d lines; want the generated 2:\n%s", n, res.Stdout)
	}
	readOnly := []string{"/usr/sandgate-test", "/etc/sandgate-test", "/sandgate-test", "/dev/sandgate-test"}
	res = providertest.Exec(t, p, sb, append([]string{"sh", "-c", `for p; do touch "$p" 2>/dev/null && echo "$p"; done; true`, "sh"}, readOnly...)...)
	if len(res.Stdout) != 0 || res.ExitCode != 0 {
		t.Errorf("writable paths that should be read-only (exit %d):\n%s", res.ExitCode, res.Stdout)
	}
	if err := providers.WriteFileBytes(t.Context(), p, sb, "/usr/sandgate-test", []byte("x")); !errors.Is(err, providers.ErrNotWritable) {
		t.Errorf("WriteFile into /usr = %v; want ErrNotWritable", err)
	}
	// bwrap, pid 1 of the sandbox, shows neither the broker's environment
	// nor the host paths of its options.
	res = providertest.Exec(t, p, sb, "cat", "/proc/1/environ", "/proc/1/cmdline")
	if out := string(res.Stdout); strings.Contains(out, "host-secret-value") || strings.Contains(out, dataDir) {
		t.Errorf("pid 1 leaks the host environment or paths:\n%q", out)
	}
	// A descriptor the broker inherited without close-on-exec (here one
	// opened so) does not reach the sandbox: only stdio and ls's own.
	fd, err := syscall.Open("/dev/null", syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	res = providertest.Exec(t, p, sb, "ls", "/proc/self/fd")
	if got := strings.Fields(string(res.Stdout)); !slices.Equal(got, []string{"0", "1", "2", "3"}) {
		t.Errorf("descriptors in the sandbox = %q; want 0 1 2 and ls's own 3", got)
	}
	// No capabilities, and no nested user namespaces.
	res = providertest.Exec(t, p, sb, "grep", "CapEff", "/proc/self/status")
	if !strings.Contains(string(res.Stdout), "0000000000000000") {
		t.Errorf("effective capabilities = %q; want none", res.Stdout)
	}
	if res := providertest.Exec(t, p, sb, "unshare", "-U", "true"); res.ExitCode == 0 {
		t.Errorf("unshare -U in the sandbox succeeded; want nested user namespaces disabled")
	}
}

// TestWriteNotWritable checks that a write the sandbox can never make is
// ErrNotWritable (the client's mistake), not a plain provider failure.
func TestWriteNotWritable(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	sb := providertest.Create(t, p, providertest.Spec(t))
	// A directory of the workspace that the sandbox's root may not write:
	// it holds no capability that would override the mode.
	if res := providertest.Exec(t, p, sb, "sh", "-c",
		"mkdir -p /workspace/ro/sub /workspace/nox && chmod 555 /workspace/ro /workspace/ro/sub && chmod 222 /workspace/nox"); res.ExitCode != 0 {
		t.Fatalf("chmod in the sandbox: exit %d: %s", res.ExitCode, res.Stderr)
	}
	tests := []struct {
		path string
		want error // nil when the write succeeds
	}{
		{"/usr/x", providers.ErrNotWritable},
		{"/usr/new/dir/x", providers.ErrNotWritable},
		{"/proc/x", providers.ErrNotWritable},
		{"/proc/self/x", providers.ErrNotWritable},
		{"/proc/sys/kernel/x", providers.ErrNotWritable},
		{"/etc/x", providers.ErrNotWritable},
		{"/x", providers.ErrNotWritable},
		{"/workspace/ro/x", providers.ErrNotWritable},
		{"/workspace/ro/new/x", providers.ErrNotWritable},
		{"/workspace/ro/sub/x", providers.ErrNotWritable},
		{"/workspace/nox/x", providers.ErrNotWritable}, // writable, but cannot be entered
		{"/workspace/nox/new/x", providers.ErrNotWritable},
		{"/workspace/ro", providers.ErrNotAFile},
		{"/usr", providers.ErrNotAFile},
		{"/workspace/ok/x", nil},
		{"/tmp/x", nil},
	}
	for _, tt := range tests {
		err := providers.WriteFileBytes(t.Context(), p, sb, tt.path, []byte("x"))
		if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
			t.Errorf("WriteFile(%q) = %v; want %v", tt.path, err, tt.want)
		}
	}
}

// TestDataDirID checks that a data directory keeps one id, whichever
// Provider made it and however many start at once, and that another
// directory has another.
func TestDataDirID(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ids := make(chan string, 4)
	for range cap(ids) {
		go func() {
			p, err := local.New(context.Background(), local.Config{DataDir: dir}, providers.Env{BrokerID: broker})
			if err != nil {
				t.Errorf("local.New: %v", err)
				ids <- ""
				return
			}
			t.Cleanup(func() { p.Close() })
			ids <- p.DataDirID()
		}()
	}
	first := <-ids
	for range cap(ids) - 1 {
		if id := <-ids; id != first {
			t.Errorf("DataDirID of Providers started at once = %q and %q; want one id", first, id)
		}
	}
	if !strings.HasPrefix(first, "ldd_") || len(first) != 4+32 {
		t.Errorf("DataDirID = %q; want ldd_ and 32 hex digits", first)
	}
	if again := newProvider(t, dir, broker).DataDirID(); again != first {
		t.Errorf("DataDirID after a restart = %q; want %q", again, first)
	}
	if other := newProvider(t, t.TempDir(), broker).DataDirID(); other == first {
		t.Errorf("DataDirID of another directory = %q, the same as the first's", other)
	}
}

func TestRestart(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	p1 := newProvider(t, dataDir, broker)
	spec := providertest.Spec(t)
	sb, err := p1.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := providers.WriteFileBytes(t.Context(), p1, sb, "/workspace/kept", []byte("kept")); err != nil {
		t.Fatal(err)
	}

	p2 := newProvider(t, dataDir, broker)
	all, err := p2.List(t.Context())
	if err != nil || len(all) != 1 || all[0].Ref != sb.Ref {
		t.Fatalf("List after restart = %v, %v; want the one sandbox", all, err)
	}
	if !all[0].StartedAt.Equal(sb.StartedAt) {
		t.Errorf("StartedAt after restart = %v; want %v", all[0].StartedAt, sb.StartedAt)
	}
	if got, err := providers.ReadFileBytes(t.Context(), p2, all[0], "/workspace/kept", 100); err != nil || string(got) != "kept" {
		t.Errorf("ReadFile after restart = %q, %v; want %q", got, err, "kept")
	}
	res := providertest.Exec(t, p2, all[0], "sh", "-c", `printf %s "$`+providertest.EnvVar+`"`)
	if got := string(res.Stdout); got != providertest.EnvValue {
		t.Errorf("env after restart = %q; want %q", got, providertest.EnvValue)
	}
	fi, err := os.Stat(filepath.Join(dataDir, "workspaces", sb.Ref, "env.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("env.json = %v, %v; want mode 0600", fi, err)
	}
	if err := p2.Terminate(t.Context(), all[0]); err != nil {
		t.Errorf("Terminate after restart: %v", err)
	}
	if _, err := p1.Exec(t.Context(), sb, providers.ExecSpec{Argv: []string{"true"}}); !errors.Is(err, providers.ErrSandboxGone) {
		t.Errorf("Exec on the old provider after the new one terminated = %v; want ErrSandboxGone", err)
	}
}

func TestListFiltersBroker(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	ours := newProvider(t, dataDir, broker)
	theirs := newProvider(t, dataDir, "other-broker")
	sbOurs := providertest.Create(t, ours, providertest.Spec(t))
	sbTheirs := providertest.Create(t, theirs, providertest.Spec(t))
	// A directory that is not a workspace at all.
	if err := os.Mkdir(filepath.Join(dataDir, "workspaces", "stray"), 0o700); err != nil {
		t.Fatal(err)
	}

	for _, tt := range []struct {
		p    *local.Provider
		want providers.Sandbox
	}{{ours, sbOurs}, {theirs, sbTheirs}} {
		all, err := tt.p.List(t.Context())
		if err != nil || len(all) != 1 || all[0].Ref != tt.want.Ref {
			t.Errorf("List = %v, %v; want only %s", all, err, tt.want.Ref)
			continue
		}
		if got := all[0].Labels[providers.LabelBroker]; got != tt.want.Labels[providers.LabelBroker] {
			t.Errorf("List broker label = %q; want %q", got, tt.want.Labels[providers.LabelBroker])
		}
	}
}

func TestMemoryLimit(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	sb := providertest.Create(t, p, providertest.Spec(t)) // small: 512 MiB
	// dd allocates its block in one piece before reading anything.
	if res := providertest.Exec(t, p, sb, "dd", "if=/dev/zero", "of=/dev/null", "bs=600M", "count=1"); res.ExitCode == 0 {
		t.Errorf("allocating 600 MiB in a 512 MiB sandbox succeeded")
	}
	if res := providertest.Exec(t, p, sb, "dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"); res.ExitCode != 0 {
		t.Errorf("allocating 64 MiB in a 512 MiB sandbox failed: exit %d: %s", res.ExitCode, res.Stderr)
	}

	// A heap that grows bit by bit is bounded too (tail buffers a line
	// without newlines whole), and so is /dev/shm, which is memory. A tiny
	// size keeps this fast. /dev/shm lives as long as the workspace (its
	// execs share the resident's), so what the failing write leaves there
	// keeps the memory full: that case comes last.
	spec := providertest.Spec(t)
	spec.Size = sandgate.Size{CPUCores: 1, MemoryMiB: 16}
	sb = providertest.Create(t, p, spec)
	for _, tt := range []struct {
		script string
		ok     bool
	}{
		{"head -c 32M /dev/zero | tail >/dev/null", false},
		{"head -c 4M /dev/zero | tail >/dev/null", true},
		{"head -c 8M /dev/zero >/dev/shm/x && rm /dev/shm/x", true},
		{"head -c 17M /dev/zero >/dev/shm/x", false},
	} {
		res := providertest.Exec(t, p, sb, "sh", "-c", tt.script)
		if ok := res.ExitCode == 0; ok != tt.ok {
			t.Errorf("%q in a 16 MiB sandbox: exit %d; want success %v (%s)", tt.script, res.ExitCode, tt.ok, res.Stderr)
		}
	}
}

func TestCPUAffinity(t *testing.T) {
	t.Parallel()
	host, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	hostCPUs := allowedCPUs(t, string(host))
	p := newProvider(t, t.TempDir(), broker)
	for _, name := range []string{"small", "standard", "xlarge"} {
		spec := providertest.Spec(t)
		spec.Size, _ = sandgate.LookupSize(name)
		sb := providertest.Create(t, p, spec)
		res := providertest.Exec(t, p, sb, "cat", "/proc/self/status")
		if got, want := allowedCPUs(t, string(res.Stdout)), min(spec.Size.CPUCores, hostCPUs); got != want {
			t.Errorf("%s: CPUs allowed in the sandbox = %d; want %d", name, got, want)
		}
		// The sandbox cannot widen its own affinity.
		if res := providertest.Exec(t, p, sb, "taskset", "-p", "ffffffff", "1"); res.ExitCode == 0 {
			t.Errorf("%s: taskset in the sandbox succeeded; want EPERM", name)
		}
		if res := providertest.Exec(t, p, sb, "sh", "-c", "taskset -p ffffffff $$"); res.ExitCode == 0 {
			t.Errorf("%s: taskset on itself succeeded; want EPERM", name)
		}
	}
}

// Workspaces whose ids hash to the same CPU run on different ones: each
// new one is placed where the fewest are, counting after a broker restart
// the workspaces that survived it.
func TestPlacementSpreadsWorkspaces(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p1 := newProvider(t, dir, broker)
	cpusOf := func(p *local.Provider, sb providers.Sandbox) string {
		res := providertest.Exec(t, p, sb, "grep", "Cpus_allowed_list", "/proc/self/status")
		return strings.TrimSpace(strings.TrimPrefix(string(res.Stdout), "Cpus_allowed_list:"))
	}
	// Ids that the hash alone would all put on one CPU, h.
	h := local.HashCPU(p1, "ws_place0000")
	var ids []string
	for i := 0; len(ids) < 3; i++ {
		if id := fmt.Sprintf("ws_place%04d", i); local.HashCPU(p1, id) == h {
			ids = append(ids, id)
		}
	}
	create := func(p *local.Provider, id string) providers.Sandbox {
		spec := providertest.Spec(t)
		spec.WorkspaceID = id
		spec.Size, _ = sandgate.LookupSize("small")
		return providertest.Create(t, p, spec)
	}
	a := create(p1, ids[0])
	if got := cpusOf(p1, a); got != strconv.Itoa(h) {
		t.Errorf("the first workspace runs on CPU %s; want %d, its hash's", got, h)
	}
	p1.Close() // the broker restarts; A stays
	p2 := newProvider(t, dir, broker)
	if got := cpusOf(p2, a); got != strconv.Itoa(h) {
		t.Errorf("after a restart A runs on CPU %s; want %d, where it was placed", got, h)
	}
	b := create(p2, ids[1])
	if runtime.NumCPU() == 1 {
		return
	}
	if got := cpusOf(p2, b); got == strconv.Itoa(h) {
		t.Errorf("B runs on CPU %s beside A, with another CPU free; want another CPU", got)
	}
	if runtime.NumCPU() == 2 {
		// One on each: the third goes where its hash says.
		if got := cpusOf(p2, create(p2, ids[2])); got != strconv.Itoa(h) {
			t.Errorf("the third of three on two CPUs runs on CPU %s; want its hash's, %d", got, h)
		}
	}
}

// allowedCPUs counts the CPUs in the Cpus_allowed_list line of a
// /proc/<pid>/status, such as "0-3,6".
func allowedCPUs(t *testing.T, status string) int {
	t.Helper()
	_, rest, ok := strings.Cut(status, "Cpus_allowed_list:")
	if !ok {
		t.Fatalf("no Cpus_allowed_list in %q", status)
	}
	list, _, _ := strings.Cut(rest, "\n")
	n := 0
	for _, r := range strings.Split(strings.TrimSpace(list), ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		if !isRange {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil {
			t.Fatalf("bad Cpus_allowed_list %q", list)
		}
		n += b - a + 1
	}
	return n
}

func TestTimeoutKillsHostProcesses(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	sb := providertest.Create(t, p, providertest.Spec(t))
	res := providertest.ExecWith(t, p, sb, providers.ExecSpec{
		// The background child detaches from the output pipes, so Exec
		// cannot wait for it through them.
		Argv:    []string{"sh", "-c", "sleep 318 >/dev/null 2>&1 </dev/null & sleep 318"},
		Timeout: time.Second,
	})
	if !res.TimedOut || res.ExitCode != 137 {
		t.Errorf("Exec = exit %d, timed out %v; want 137, true", res.ExitCode, res.TimedOut)
	}
	// Each exec has its own pid namespace, so only the host can tell that
	// the processes are gone. SIGKILL lands at once, but the kernel tears
	// the namespace down asynchronously: poll, boundedly.
	var left []string
	for range 1200 { // a minute: a loaded machine tears namespaces down slowly
		if left = hostProcesses(t, "sleep\x00318\x00"); len(left) == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("host processes left after the timeout: %q", left)
}

// hostProcesses returns the pids of host processes whose command line
// contains marker.
func hostProcesses(t *testing.T, marker string) []string {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, d := range dirs {
		if b, err := os.ReadFile(d + "/cmdline"); err == nil && bytes.Contains(b, []byte(marker)) {
			pids = append(pids, filepath.Base(d))
		}
	}
	return pids
}

func TestExpiresAt(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	spec := providertest.Spec(t)
	spec.ExpiresAt = time.Now().Add(-time.Second)
	sb := providertest.Create(t, p, spec)
	if _, err := p.Exec(t.Context(), sb, providers.ExecSpec{Argv: []string{"true"}}); !errors.Is(err, providers.ErrSandboxGone) {
		t.Errorf("Exec past ExpiresAt error = %v; want ErrSandboxGone", err)
	}

	// A timeout beyond the deadline is cut at the deadline. The create
	// and the exec's start must come before it, on a loaded machine.
	spec = providertest.Spec(t)
	spec.ExpiresAt = time.Now().Add(10 * time.Second)
	sb = providertest.Create(t, p, spec)
	res := providertest.ExecWith(t, p, sb, providers.ExecSpec{Argv: []string{"sleep", "60"}, Timeout: time.Minute})
	if !res.TimedOut {
		t.Errorf("Exec running past ExpiresAt = exit %d, timed out %v; want timed out", res.ExitCode, res.TimedOut)
	}
}

func TestLogsCarryNoContent(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p := newProviderLog(t, t.TempDir(), broker, log)
	const marker = "planted-marker-7f3a"
	spec := providertest.Spec(t)
	spec.Env = map[string]string{"PLANTED": marker}
	sb := providertest.Create(t, p, spec)
	providertest.ExecWith(t, p, sb, providers.ExecSpec{
		Argv:  []string{"sh", "-c", "cat; echo " + marker + "; echo " + marker + " >&2"},
		Stdin: []byte(marker),
		Dir:   "/tmp",
	})
	path := "/tmp/" + marker
	if err := providers.WriteFileBytes(t.Context(), p, sb, path, []byte(marker)); err != nil {
		t.Fatal(err)
	}
	if _, err := providers.ReadFileBytes(t.Context(), p, sb, path, 1); !errors.Is(err, providers.ErrFileTooLarge) {
		t.Fatalf("ReadFile over max = %v; want ErrFileTooLarge", err)
	}
	if _, err := providers.ReadFileBytes(t.Context(), p, sb, path+"-missing", 100); err == nil || strings.Contains(err.Error(), marker) {
		t.Errorf("ReadFile of a missing file error = %v; want one without the path", err)
	}
	if err := p.Terminate(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	if buf.Len() == 0 {
		t.Fatal("no log lines; want some")
	}
	if strings.Contains(buf.String(), marker) {
		t.Errorf("logs carry argv, env, stdin, output, a path or content:\n%s", buf.String())
	}
}

// TestTerminateFromAnotherProvider: a stop set through one gateway must end
// a command another gateway process is running in the same workspace.
func TestTerminateFromAnotherProvider(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	a := newProvider(t, dataDir, broker)
	b := newProvider(t, dataDir, broker)
	sb, err := a.Create(t.Context(), providertest.Spec(t))
	if err != nil {
		t.Fatal(err)
	}
	marker := "/tmp/started"
	done := make(chan error, 1)
	go func() {
		_, err := a.Exec(t.Context(), sb, providers.ExecSpec{
			Argv: []string{"sh", "-c", "touch " + marker + "; sleep 600"}, Timeout: 10 * time.Minute, MaxOutputBytes: 1024,
		})
		done <- err
	}()
	// Wait (bounded) until the command runs.
	for i := 0; ; i++ {
		if _, err := providers.ReadFileBytes(t.Context(), a, sb, marker, 10); err == nil {
			break
		}
		if i == 500 {
			t.Fatal("the command never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := b.Terminate(t.Context(), sb); err != nil {
		t.Fatalf("Terminate from the other provider: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, providers.ErrSandboxGone) {
			t.Fatalf("Exec = %v; want ErrSandboxGone", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the exec outlived Terminate from another provider")
	}
}

// TestSnapshotBytes: a snapshot's Bytes is its archive's size on disk, what
// the instance's max_snapshot_bytes quota adds up.
func TestSnapshotBytes(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	sb := providertest.Create(t, p, providertest.Spec(t))
	// Random bytes do not compress: the archive is at least their size.
	if res := providertest.Exec(t, p, sb, "sh", "-c", "mkdir -p /workspace/d && head -c 300000 /dev/urandom >/workspace/d/f"); res.ExitCode != 0 {
		t.Fatalf("writing the file: exit %d", res.ExitCode)
	}
	id := sandgate.NewID(sandgate.PrefixSnapshot)
	ref, err := p.Snapshot(t.Context(), sb, providers.SnapshotSpec{ID: id, InstanceID: "inst_t", Dir: "/workspace/d"})
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	t.Cleanup(func() { p.DeleteSnapshot(context.Background(), ref) })
	fi, err := os.Stat(local.SnapshotPath(p, id))
	if err != nil {
		t.Fatal(err)
	}
	if ref.Bytes != fi.Size() || ref.Bytes < 300000 {
		t.Errorf("Snapshot Bytes = %d; want the archive's size %d (at least 300000)", ref.Bytes, fi.Size())
	}
}

// TestSnapshotMaxBytes: an archive that would grow past SnapshotSpec.MaxBytes
// is cut short by the kernel (RLIMIT_FSIZE) and nothing is kept.
func TestSnapshotMaxBytes(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	p := newProvider(t, dataDir, broker)
	sb := providertest.Create(t, p, providertest.Spec(t))
	if res := providertest.Exec(t, p, sb, "sh", "-c", "mkdir -p /workspace/d && head -c 300000 /dev/urandom >/workspace/d/f"); res.ExitCode != 0 {
		t.Fatalf("writing the file: exit %d", res.ExitCode)
	}
	id := sandgate.NewID(sandgate.PrefixSnapshot)
	_, err := p.Snapshot(t.Context(), sb, providers.SnapshotSpec{ID: id, InstanceID: "inst_t", Dir: "/workspace/d", MaxBytes: 100000})
	if !errors.Is(err, providers.ErrSnapshotTooLarge) {
		t.Fatalf("Snapshot of 300 000 random bytes with MaxBytes 100 000 = %v; want ErrSnapshotTooLarge", err)
	}
	entries, err := os.ReadDir(filepath.Join(dataDir, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("snapshots directory after the refusal holds %d entries; want none", len(entries))
	}
	// Within the limit it is stored as usual.
	ref, err := p.Snapshot(t.Context(), sb, providers.SnapshotSpec{ID: id, InstanceID: "inst_t", Dir: "/workspace/d", MaxBytes: 1 << 20})
	if err != nil {
		t.Fatalf("Snapshot within MaxBytes: %v", err)
	}
	p.DeleteSnapshot(context.Background(), ref)
}

// TestCappedBufferBounded: a stream's buffer never grows past its cap,
// whatever the command writes, and starts small.
func TestCappedBufferBounded(t *testing.T) {
	t.Parallel()
	chunk := bytes.Repeat([]byte("x"), 30_000)
	for _, tt := range []struct {
		name          string
		max           int64
		writes        int
		wantKept      int
		wantCapAtMost int
	}{
		{"past the cap", 100_000, 10, 100_000, 100_000},
		{"exactly the cap", 90_000, 3, 90_000, 90_000},
		{"small output", 4 << 20, 1, 30_000, 64 << 10},
		{"nothing kept", 0, 2, 0, 0},
	} {
		chunks := make([][]byte, tt.writes)
		for i := range chunks {
			chunks[i] = chunk
		}
		kept, capacity, n, trunc := local.CappedKeep(tt.max, chunks...)
		total := int64(tt.writes * len(chunk))
		if len(kept) != tt.wantKept || capacity > tt.wantCapAtMost || n != total || trunc != (total > int64(tt.wantKept)) {
			t.Errorf("%s: kept %d (capacity %d), counted %d, truncated %v; want %d (capacity at most %d), %d, %v",
				tt.name, len(kept), capacity, n, trunc, tt.wantKept, tt.wantCapAtMost, total, total > int64(tt.wantKept))
		}
	}
}

// TestEnvLargerThanPipe: bwrap's options, env values included, may
// outgrow a pipe's buffer; the sandbox still gets every value whole.
func TestEnvLargerThanPipe(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	spec := providertest.Spec(t)
	for i := range 4 {
		spec.Env["BIG"+strconv.Itoa(i)] = strings.Repeat(strconv.Itoa(i), 40_000)
	}
	sb := providertest.Create(t, p, spec)
	res := providertest.Exec(t, p, sb, "sh", "-c", `for v in "$BIG0" "$BIG1" "$BIG2" "$BIG3"; do printf '%s\n' "$v" | tr -d '\n' | wc -c; done`)
	if got := strings.Fields(string(res.Stdout)); res.ExitCode != 0 || !slices.Equal(got, []string{"40000", "40000", "40000", "40000"}) {
		t.Errorf("sizes of the env values in the sandbox = %q (exit %d, %s); want 40000 each", got, res.ExitCode, res.Stderr)
	}
}
