package local_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// lateClock is an hour behind the wall clock: the provider's own exec
// clamp then allows an hour, so only the supervisor (which reads the wall
// clock) can end the sandbox at its deadline.
type lateClock struct{}

func (lateClock) Now() time.Time { return time.Now().Add(-time.Hour) }

// TestSupervisorEndsAtDeadline: a workspace whose lifetime passes ends on
// time with no broker code involved: its processes are killed and it is
// gone for every later call.
func TestSupervisorEndsAtDeadline(t *testing.T) {
	t.Parallel()
	p, err := local.New(t.Context(), local.Config{DataDir: t.TempDir()}, providers.Env{BrokerID: broker, Clock: lateClock{}})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(p) })
	// Room for the create and the exec's start, which must come before the
	// deadline, on a loaded machine (the package's tests run in parallel).
	deadline := time.Now().Add(15 * time.Second)
	sb, err := p.Create(t.Context(), providers.CreateSpec{WorkspaceID: "ws_supervised", InstanceID: "inst_x",
		Size: sandgate.Size{CPUCores: 1, MemoryMiB: 256}, ExpiresAt: deadline})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Exec(t.Context(), sb, providers.ExecSpec{Argv: []string{"sleep", "60"}, Timeout: time.Hour})
	ended := time.Now()
	if !errors.Is(err, providers.ErrSandboxGone) {
		t.Errorf("Exec across the deadline: %v; want ErrSandboxGone", err)
	}
	// Killed at the deadline, not by the sleep's own end (60 s); the kill
	// and the answer may lag on a loaded machine.
	if ended.Sub(deadline) > 15*time.Second || ended.Before(deadline.Add(-time.Second)) {
		t.Errorf("exec ended at %s; want killed at the deadline %s", ended.Format(time.StampMilli), deadline.Format(time.StampMilli))
	}
	if _, err := p.Exec(t.Context(), sb, providers.ExecSpec{Argv: []string{"true"}, Timeout: time.Second}); !errors.Is(err, providers.ErrSandboxGone) {
		t.Errorf("Exec after the deadline: %v; want ErrSandboxGone", err)
	}
	if err := p.Terminate(t.Context(), sb); err != nil {
		t.Errorf("Terminate: %v", err)
	}
}

// TestOneSupervisorPerDataDir: the workspaces of a data directory share
// one supervisor, which forgets a workspace at Terminate and keeps running
// for the others.
func TestOneSupervisorPerDataDir(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	var sbs []providers.Sandbox
	for _, id := range []string{"ws_one", "ws_two"} {
		sb, err := p.Create(t.Context(), providers.CreateSpec{WorkspaceID: id, InstanceID: "inst_x",
			Size: sandgate.Size{CPUCores: 1, MemoryMiB: 256}, ExpiresAt: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		sbs = append(sbs, sb)
	}
	pid := waitSupervisor(t, p)
	// A create does not wait for the supervisor it starts: a second one
	// may be on its way while the first takes the lock, and leaves once
	// it finds the lock taken.
	n := countSupervisors(t, pid)
	for deadline := time.Now().Add(time.Minute); n != 1 && time.Now().Before(deadline); n = countSupervisors(t, pid) {
		time.Sleep(20 * time.Millisecond)
	}
	if n != 1 {
		t.Errorf("%d supervisors for one data directory; want 1", n)
	}
	if err := p.Terminate(t.Context(), sbs[0]); err != nil {
		t.Fatal(err)
	}
	local.WaitTeardown(p)
	if local.HasDeadline(p, sbs[0].Ref) {
		t.Error("the supervisor still holds the deadline of a terminated workspace")
	}
	if !local.HasDeadline(p, sbs[1].Ref) || !local.Alive(pid) {
		t.Error("the supervisor stopped supervising the workspace left")
	}
}

// TestSupervisorRestarted: a supervisor killed with SIGKILL is started
// again by the next broker process (New), which ends a workspace created
// before at its deadline, with no broker code involved.
func TestSupervisorRestarted(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	p1 := newProvider(t, dataDir, broker)
	deadline := time.Now().Add(4 * time.Second)
	sb, err := p1.Create(t.Context(), providers.CreateSpec{WorkspaceID: "ws_orphaned", InstanceID: "inst_x",
		Size: sandgate.Size{CPUCores: 1, MemoryMiB: 256}, ExpiresAt: deadline})
	if err != nil {
		t.Fatal(err)
	}
	pid := waitSupervisor(t, p1)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Gone from /proc, reaped: a process whose main thread has exited
	// reads as a zombie while its other threads still hold its files (the
	// lock), and a New then would find the lock still held.
	for i := 0; i < 500 && procExists(pid); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	p2, err := local.New(t.Context(), local.Config{DataDir: dataDir}, providers.Env{BrokerID: broker, Clock: lateClock{}})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(p2) })
	if got := waitSupervisor(t, p2); got == pid {
		t.Fatalf("supervisor pid %d after New; want a new one", got)
	}
	_, err = p2.Exec(t.Context(), sb, providers.ExecSpec{Argv: []string{"sleep", "60"}, Timeout: time.Hour})
	if !errors.Is(err, providers.ErrSandboxGone) {
		t.Errorf("Exec across the deadline: %v; want ErrSandboxGone", err)
	}
}

// TestStaleDeadlineDropped: a deadline whose workspace is gone (its
// broker died after Terminate returned, before the teardown removed the
// deadline) is dropped by the next New, so no supervisor waits for it.
func TestStaleDeadlineDropped(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	p1 := newProvider(t, dataDir, broker)
	sb, err := p1.Create(t.Context(), providers.CreateSpec{WorkspaceID: "ws_kept", InstanceID: "inst_x",
		Size: sandgate.Size{CPUCores: 1, MemoryMiB: 256}, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dataDir, "deadlines", "ws_gone")
	if err := os.WriteFile(stale, []byte(strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)), 0o600); err != nil {
		t.Fatal(err)
	}
	p2 := newProvider(t, dataDir, broker)
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the deadline of a workspace that is gone after New: %v; want it removed", err)
	}
	if !local.HasDeadline(p2, sb.Ref) {
		t.Error("New dropped the deadline of a live workspace")
	}
}

// TestSupervisorLeavesWithDataDir: the supervisor exits once its data
// directory is removed.
func TestSupervisorLeavesWithDataDir(t *testing.T) {
	t.Parallel()
	dataDir := filepath.Join(t.TempDir(), "data")
	p := newProvider(t, dataDir, broker)
	sb, err := p.Create(t.Context(), providers.CreateSpec{WorkspaceID: "ws_left", InstanceID: "inst_x",
		Size: sandgate.Size{CPUCores: 1, MemoryMiB: 256}, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	pid := waitSupervisor(t, p)
	if err := p.Terminate(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dataDir); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 500 && local.Alive(pid); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if local.Alive(pid) {
		t.Error("the supervisor still runs after its data directory was removed")
	}
}

// waitSupervisor returns the pid of p's supervisor once it runs.
// procExists reports whether pid is in /proc, a zombie included.
func procExists(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err == nil
}

func waitSupervisor(t *testing.T, p *local.Provider) int {
	t.Helper()
	for range 500 {
		if pid := local.SupervisorPID(p); pid > 0 && local.Alive(pid) {
			return pid
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no supervisor runs")
	return 0
}

// countSupervisors counts the supervisor processes whose command line
// names the same data directory as pid's.
func countSupervisors(t *testing.T, pid int) int {
	t.Helper()
	want, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	procs, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range procs {
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && bytes.Equal(b, want) {
			n++
		}
	}
	return n
}

// TestSupervisorLingers: once its last workspace is terminated, the
// supervisor stays for the next create, which then starts none.
func TestSupervisorLingers(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	create := func(id string) providers.Sandbox {
		sb, err := p.Create(t.Context(), providers.CreateSpec{WorkspaceID: id, InstanceID: "inst_x",
			Size: sandgate.Size{CPUCores: 1, MemoryMiB: 256}, ExpiresAt: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	sb := create("ws_first")
	pid := waitSupervisor(t, p)
	if err := p.Terminate(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	// With no deadline left it stays (a minute), where it used to leave
	// within milliseconds (a -race build under load: within a second).
	for range 500 {
		if !local.Alive(pid) {
			t.Fatal("the supervisor left with its last deadline; want it to stay for the next create")
		}
		time.Sleep(10 * time.Millisecond)
	}
	create("ws_second")
	if got := waitSupervisor(t, p); got != pid {
		t.Errorf("supervisor after the next create: %d; want the one that stayed, %d", got, pid)
	}
}
