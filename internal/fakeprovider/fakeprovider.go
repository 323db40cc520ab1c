// Package fakeprovider is an in-memory providers.Provider for gateway tests
// and benchmarks: creates cost nothing, files live in a map, snapshots are
// copies of that map, Exec and durable commands answer from a function the
// test sets. It runs nothing.
package fakeprovider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
)

// Provider is a fake provider. The zero value is not usable; call New.
type Provider struct {
	mu        sync.Mutex
	sandboxes map[string]map[string][]byte // ref → path → contents
	// CreateHook, when set, runs inside Create; an error fails the create.
	CreateHook func(ctx context.Context, spec providers.CreateSpec) error
	// ExecHook, when set, runs first inside Exec with its context; an
	// error fails the exec.
	ExecHook func(ctx context.Context, spec providers.ExecSpec) error
	// ExecFunc answers Exec; nil echoes argv[1:] joined by spaces.
	ExecFunc func(spec providers.ExecSpec) providers.ExecResult
	// TerminateErr, when set, fails every Terminate.
	TerminateErr error
	// SnapshotErr, RestoreErr and DeleteSnapshotErr, when set, fail every
	// call of that method. Change them (and the fields below) with Set
	// once requests run.
	SnapshotErr, RestoreErr, DeleteSnapshotErr error
	// StartCommandErr, when set, fails every StartCommand before it
	// launches anything.
	StartCommandErr error
	// StartGate, when set, holds every StartCommand until it is closed: a
	// launch delayed after its claim.
	StartGate chan struct{}
	// HoldCommands keeps durable commands running until FinishCommand;
	// otherwise they complete at once with ExecFunc's result.
	HoldCommands bool
	// Caps, when set, is what Capabilities reports; otherwise every
	// standard size, any image (default "fake"), domain egress natively.
	Caps *providers.Capabilities
	// BrokerID labels the sandboxes it creates (providers.LabelBroker).
	BrokerID string
	// Clock stamps each sandbox's confirmed start (Sandbox.StartedAt);
	// nil means sandgate.SystemClock. A test gives it its own clock, so
	// that metered time is the test clock's alone.
	Clock     sandgate.Clock
	labels    map[string]map[string]string // ref → labels
	closed    bool
	creates   int
	snapshots map[string]map[string][]byte // snapshot id → path below dir → contents
	deletes   int
	snapCalls int
	commands  map[string]*command // ref + "/" + id
}

// command is one durable command of the fake.
type command struct {
	spec     providers.ExecSpec
	status   providers.CommandStatus
	fenced   bool
	launches int
}

// Set runs f with the fake locked, so a test may change the Snapshot,
// Restore, DeleteSnapshot and StartCommand errors and HoldCommands while
// requests run.
func (p *Provider) Set(f func(p *Provider)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
}

// New returns an empty fake provider.
func New() *Provider {
	return &Provider{sandboxes: map[string]map[string][]byte{}, snapshots: map[string]map[string][]byte{},
		commands: map[string]*command{}, labels: map[string]map[string]string{}}
}

// Create implements providers.Provider.
func (p *Provider) Create(ctx context.Context, spec providers.CreateSpec) (providers.Sandbox, error) {
	if p.CreateHook != nil {
		if err := p.CreateHook(ctx, spec); err != nil {
			return providers.Sandbox{}, err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.creates++
	p.sandboxes[spec.WorkspaceID] = map[string][]byte{}
	p.labels[spec.WorkspaceID] = map[string]string{providers.LabelBroker: p.BrokerID,
		providers.LabelWorkspace: spec.WorkspaceID, providers.LabelInstance: spec.InstanceID}
	return providers.Sandbox{Ref: spec.WorkspaceID, StartedAt: p.now()}, nil
}

// now is the fake's time, in UTC. The caller holds p.mu.
func (p *Provider) now() time.Time {
	if p.Clock == nil {
		return sandgate.SystemClock{}.Now()
	}
	return p.Clock.Now().UTC()
}

// Exec implements providers.Provider.
func (p *Provider) Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	if !p.exists(sb.Ref) {
		return providers.ExecResult{}, providers.ErrSandboxGone
	}
	if p.ExecHook != nil {
		if err := p.ExecHook(ctx, spec); err != nil {
			return providers.ExecResult{}, err
		}
	}
	if p.ExecFunc != nil {
		return p.ExecFunc(spec), nil
	}
	out := []byte(strings.Join(spec.Argv[1:], " ") + "\n")
	return providers.ExecResult{Stdout: out, StdoutBytes: int64(len(out))}, nil
}

// ReadFile implements providers.Provider.
func (p *Provider) ReadFile(ctx context.Context, sb providers.Sandbox, path string, max int64, w io.Writer) (int64, error) {
	p.mu.Lock()
	fs, ok := p.sandboxes[sb.Ref]
	if !ok {
		p.mu.Unlock()
		return 0, providers.ErrSandboxGone
	}
	b, ok := fs[path]
	if !ok {
		defer p.mu.Unlock()
		for k := range fs {
			if strings.HasPrefix(k, strings.TrimSuffix(path, "/")+"/") {
				return 0, providers.ErrNotAFile
			}
		}
		return 0, providers.ErrFileNotFound
	}
	p.mu.Unlock()
	if int64(len(b)) > max {
		return 0, providers.ErrFileTooLarge
	}
	// A stored file is never changed in place (WriteFile replaces it), so
	// it may be written out without the lock.
	n, err := w.Write(b)
	return int64(n), err
}

// WriteFile implements providers.Provider.
// Like a real sandbox's, a file is replaced whole once r is read to its
// end: a failing r leaves it as it was.
func (p *Provider) WriteFile(ctx context.Context, sb providers.Sandbox, path string, r io.Reader) error {
	if !p.exists(sb.Ref) {
		return providers.ErrSandboxGone
	}
	data, err := providers.ReadContent(r)
	if err != nil {
		return fmt.Errorf("fakeprovider: write: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fs, ok := p.sandboxes[sb.Ref]
	if !ok {
		return providers.ErrSandboxGone
	}
	fs[path] = data
	return nil
}

// Terminate implements providers.Provider.
func (p *Provider) Terminate(ctx context.Context, sb providers.Sandbox) error {
	if p.TerminateErr != nil {
		return p.TerminateErr
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.sandboxes, sb.Ref)
	delete(p.labels, sb.Ref)
	return nil
}

// List implements providers.Provider.
func (p *Provider) List(ctx context.Context) ([]providers.Sandbox, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]providers.Sandbox, 0, len(p.sandboxes))
	for ref := range p.sandboxes {
		out = append(out, providers.Sandbox{Ref: ref, Labels: maps.Clone(p.labels[ref])})
	}
	return out, nil
}

// Capabilities implements providers.Provider.
func (p *Provider) Capabilities() providers.Capabilities {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.Caps != nil {
		return *p.Caps
	}
	return providers.Capabilities{Egress: providers.EgressNative, Snapshots: true, NativeCommands: true,
		Sizes: sandgate.StandardSizes, DefaultImage: "fake"}
}

// Close implements providers.Provider; Closed reports whether it ran.
func (p *Provider) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

// Creates counts the Create calls that created a sandbox.
func (p *Provider) Creates() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.creates
}

// Closed reports whether Close was called.
func (p *Provider) Closed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Snapshot implements providers.Provider: it copies every file below
// spec.Dir; its Bytes are the files' sizes added up.
func (p *Provider) Snapshot(ctx context.Context, sb providers.Sandbox, spec providers.SnapshotSpec) (providers.SnapshotRef, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.snapCalls++
	if p.SnapshotErr != nil {
		return providers.SnapshotRef{}, p.SnapshotErr
	}
	fs, ok := p.sandboxes[sb.Ref]
	if !ok {
		return providers.SnapshotRef{}, providers.ErrSandboxGone
	}
	prefix := strings.TrimSuffix(spec.Dir, "/") + "/"
	snap := map[string][]byte{}
	var size int64
	for k, v := range fs {
		if strings.HasPrefix(k, prefix) {
			snap[strings.TrimPrefix(k, prefix)] = append([]byte(nil), v...)
			size += int64(len(v))
		}
	}
	p.snapshots[spec.ID] = snap
	return providers.SnapshotRef{ID: spec.ID, Ref: "fake-" + spec.ID, Bytes: size}, nil
}

// Restore implements providers.Provider.
func (p *Provider) Restore(ctx context.Context, sb providers.Sandbox, ref providers.SnapshotRef, dir string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.RestoreErr != nil {
		return p.RestoreErr
	}
	fs, ok := p.sandboxes[sb.Ref]
	if !ok {
		return providers.ErrSandboxGone
	}
	snap, ok := p.snapshots[ref.ID]
	if !ok {
		return providers.ErrSnapshotGone
	}
	for k, v := range snap {
		fs[strings.TrimSuffix(dir, "/")+"/"+k] = append([]byte(nil), v...)
	}
	return nil
}

// DeleteSnapshot implements providers.Provider.
func (p *Provider) DeleteSnapshot(ctx context.Context, ref providers.SnapshotRef) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.DeleteSnapshotErr != nil {
		return p.DeleteSnapshotErr
	}
	if _, ok := p.snapshots[ref.ID]; ok {
		p.deletes++
	}
	delete(p.snapshots, ref.ID)
	return nil
}

// Snapshots returns how many snapshots are stored.
func (p *Provider) Snapshots() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.snapshots)
}

// SnapshotCalls returns how many times Snapshot was called.
func (p *Provider) SnapshotCalls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.snapCalls
}

// HasSnapshot reports whether the contents of snapshot id are stored.
func (p *Provider) HasSnapshot(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.snapshots[id]
	return ok
}

// StartCommand implements providers.Commander.
func (p *Provider) StartCommand(ctx context.Context, sb providers.Sandbox, id string, spec providers.ExecSpec) error {
	if !p.exists(sb.Ref) {
		return providers.ErrSandboxGone
	}
	p.mu.Lock()
	gate := p.StartGate
	p.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.StartCommandErr != nil {
		return p.StartCommandErr
	}
	c := p.commands[sb.Ref+"/"+id]
	switch {
	case c != nil && c.fenced:
		return providers.ErrCommandFenced
	case c != nil:
		return nil
	}
	c = &command{spec: spec, launches: 1, status: providers.CommandStatus{State: providers.CommandRunning}}
	p.commands[sb.Ref+"/"+id] = c
	if !p.HoldCommands {
		p.finish(c)
	}
	return nil
}

// finish completes c with ExecFunc's answer. p.mu is held.
func (p *Provider) finish(c *command) {
	var res providers.ExecResult
	if p.ExecFunc != nil {
		res = p.ExecFunc(c.spec)
	} else {
		out := []byte(strings.Join(c.spec.Argv[1:], " ") + "\n")
		res = providers.ExecResult{Stdout: out, StdoutBytes: int64(len(out))}
	}
	c.status = providers.CommandStatus{State: providers.CommandCompleted, ExitCode: res.ExitCode, TimedOut: res.TimedOut,
		Stdout: res.Stdout, Stderr: res.Stderr, StdoutBytes: res.StdoutBytes, StderrBytes: res.StderrBytes}
}

// FinishCommand completes a held command of sandbox ref with ExecFunc's
// answer. It reports whether the command was running.
func (p *Provider) FinishCommand(ref, id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.commands[ref+"/"+id]
	if c == nil || c.status.State != providers.CommandRunning {
		return false
	}
	p.finish(c)
	return true
}

// Launches returns how many commands the fake launched in all.
func (p *Provider) Launches() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.commands {
		n += c.launches
	}
	return n
}

// ReadCommand implements providers.Commander.
func (p *Provider) ReadCommand(ctx context.Context, sb providers.Sandbox, id string, maxOut int64) (providers.CommandStatus, error) {
	if !p.exists(sb.Ref) {
		return providers.CommandStatus{}, providers.ErrSandboxGone
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.commands[sb.Ref+"/"+id]
	if c == nil || c.fenced {
		return providers.CommandStatus{}, nil
	}
	st := c.status
	if int64(len(st.Stdout)) > maxOut {
		st.Stdout, st.StdoutTruncated = st.Stdout[:maxOut], true
	}
	if int64(len(st.Stderr)) > maxOut {
		st.Stderr, st.StderrTruncated = st.Stderr[:maxOut], true
	}
	return st, nil
}

// CancelCommand implements providers.Commander.
func (p *Provider) CancelCommand(ctx context.Context, sb providers.Sandbox, id string) error {
	if !p.exists(sb.Ref) {
		return providers.ErrSandboxGone
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.commands[sb.Ref+"/"+id]
	switch {
	case c == nil:
		p.commands[sb.Ref+"/"+id] = &command{fenced: true}
	case c.status.State == providers.CommandRunning:
		c.status = providers.CommandStatus{State: providers.CommandCanceled, ExitCode: 137}
	}
	return nil
}

// ErrInjected is an error a test can inject, distinct from every sentinel.
var ErrInjected = errors.New("fakeprovider: injected failure")

// Live returns how many sandboxes exist.
func (p *Provider) Live() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sandboxes)
}

func (p *Provider) exists(ref string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.sandboxes[ref]
	return ok
}

// Interface guards
var (
	_ providers.Provider  = (*Provider)(nil)
	_ providers.Commander = (*Provider)(nil)
)
