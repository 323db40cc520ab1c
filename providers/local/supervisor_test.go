package local_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
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
	deadline := time.Now().Add(2 * time.Second)
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
	if ended.Sub(deadline) > 3*time.Second || ended.Before(deadline.Add(-time.Second)) {
		t.Errorf("exec ended at %s; want killed at the deadline %s", ended.Format(time.StampMilli), deadline.Format(time.StampMilli))
	}
	if _, err := p.Exec(t.Context(), sb, providers.ExecSpec{Argv: []string{"true"}, Timeout: time.Second}); !errors.Is(err, providers.ErrSandboxGone) {
		t.Errorf("Exec after the deadline: %v; want ErrSandboxGone", err)
	}
	if err := p.Terminate(t.Context(), sb); err != nil {
		t.Errorf("Terminate: %v", err)
	}
}

// TestTerminateStopsSupervisor: Terminate leaves no supervisor behind
// (it would leave by itself within 10 s; here it must be gone at once).
func TestTerminateStopsSupervisor(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	sb, err := p.Create(t.Context(), providers.CreateSpec{WorkspaceID: "ws_stopped", InstanceID: "inst_x",
		Size: sandgate.Size{CPUCores: 1, MemoryMiB: 256}, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	pid := local.SupervisorPID(p, sb.Ref)
	if pid <= 0 || !local.Alive(pid) {
		t.Fatalf("no supervisor running (pid %d)", pid)
	}
	if err := p.Terminate(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100 && local.Alive(pid); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if local.Alive(pid) {
		t.Error("supervisor still runs after Terminate")
	}
}
