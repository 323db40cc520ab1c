// Package noop is a provider that runs nothing: a create, an exec and a
// file transfer answer at once from memory. It exists so that load tests
// and benchmarks measure the broker (Redis, admission, billing, HTTP)
// rather than a sandbox. It isolates nothing and must never serve real
// work: the broker never picks it unless the config names it
// (`providers: [{name: bench, kind: noop}]`), and Open logs a warning.
package noop

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"

	"go.yaml.in/yaml/v3"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
)

// Kind is the provider kind of the config's `providers:` table.
const Kind = "noop"

// Image is the one image name it reports; it runs any image reference
// the scope allows, since it runs nothing.
const Image = "noop"

// Config is the kind-specific block of a `kind: noop` provider. It has no
// fields: an unknown key is an error.
type Config struct{}

// Provider runs no sandbox. Each sandbox is an entry in memory with its
// files; everything is lost when the process ends. It is safe for
// concurrent use.
type Provider struct {
	name string
	seq  atomic.Uint64

	mu        sync.Mutex
	sandboxes map[string]*sandbox // by ref
}

type sandbox struct {
	spec  providers.CreateSpec
	files map[string][]byte
}

// Open decodes the (empty) settings strictly, logs that this provider
// isolates nothing, and calls New.
func Open(ctx context.Context, name string, raw yaml.Node, env providers.Env) (providers.Provider, error) {
	var c Config
	if err := providers.DecodeSettings(raw, &c); err != nil {
		return nil, err
	}
	if env.Logger != nil {
		env.Logger.Warn("provider of kind noop configured: its workspaces run nothing and isolate nothing; use it for load tests and benchmarks only",
			slog.String("provider", name))
	}
	return New(name), nil
}

// New returns a noop provider called name (only used in sandbox refs).
func New(name string) *Provider {
	return &Provider{name: name, sandboxes: map[string]*sandbox{}}
}

// Create implements providers.Provider: it records the sandbox and returns.
func (p *Provider) Create(ctx context.Context, spec providers.CreateSpec) (providers.Sandbox, error) {
	ref := "noop-" + p.name + "-" + strconv.FormatUint(p.seq.Add(1), 10)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sandboxes[ref] = &sandbox{spec: spec, files: map[string][]byte{}}
	return providers.Sandbox{Ref: ref, Labels: labels(spec)}, nil
}

// Exec implements providers.Provider: nothing runs; the command exits 0
// with no output. Returns ErrSandboxGone for a sandbox it does not hold.
func (p *Provider) Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	if _, err := p.get(sb); err != nil {
		return providers.ExecResult{}, err
	}
	return providers.ExecResult{}, nil
}

// ReadFile implements providers.Provider from the sandbox's memory.
func (p *Provider) ReadFile(ctx context.Context, sb providers.Sandbox, path string, max int64, w io.Writer) (int64, error) {
	p.mu.Lock()
	s, ok := p.sandboxes[sb.Ref]
	var b []byte
	found := false
	if ok {
		b, found = s.files[path]
	}
	p.mu.Unlock()
	switch {
	case !ok:
		return 0, providers.ErrSandboxGone
	case !found:
		return 0, providers.ErrFileNotFound
	}
	if int64(len(b)) > max {
		return 0, providers.ErrFileTooLarge
	}
	n, err := w.Write(b) // b is never changed in place: WriteFile replaces it
	return int64(n), err
}

// WriteFile implements providers.Provider into the sandbox's memory.
func (p *Provider) WriteFile(ctx context.Context, sb providers.Sandbox, path string, r io.Reader) error {
	data, err := providers.ReadContent(r)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.sandboxes[sb.Ref]
	if !ok {
		return providers.ErrSandboxGone
	}
	s.files[path] = data
	return nil
}

// Terminate implements providers.Provider: it forgets the sandbox.
func (p *Provider) Terminate(ctx context.Context, sb providers.Sandbox) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.sandboxes, sb.Ref)
	return nil
}

// List implements providers.Provider: the sandboxes this process holds.
func (p *Provider) List(ctx context.Context) ([]providers.Sandbox, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]providers.Sandbox, 0, len(p.sandboxes))
	for ref, s := range p.sandboxes {
		out = append(out, providers.Sandbox{Ref: ref, Labels: labels(s.spec)})
	}
	return out, nil
}

// errNoSnapshots refuses snapshots, which Capabilities does not offer.
var errNoSnapshots = fmt.Errorf("noop: %w", providers.ErrSnapshotGone)

// Snapshot implements providers.Provider: not supported (Capabilities
// says so, so the broker never asks).
func (p *Provider) Snapshot(ctx context.Context, sb providers.Sandbox, spec providers.SnapshotSpec) (providers.SnapshotRef, error) {
	return providers.SnapshotRef{}, errNoSnapshots
}

// Restore implements providers.Provider: not supported.
func (p *Provider) Restore(ctx context.Context, sb providers.Sandbox, ref providers.SnapshotRef, dir string) error {
	return errNoSnapshots
}

// DeleteSnapshot implements providers.Provider: there is nothing to delete.
func (p *Provider) DeleteSnapshot(ctx context.Context, ref providers.SnapshotRef) error { return nil }

// Capabilities implements providers.Provider, honestly: no network (nothing
// runs), no lifetime or idle enforcement of its own (the broker's reaper
// ends workspaces; nothing runs meanwhile), no snapshots, durable commands
// through the broker's generic runner, every standard size.
func (p *Provider) Capabilities() providers.Capabilities {
	return providers.Capabilities{
		Egress:       providers.EgressNoneOnly,
		Sizes:        sandgate.StandardSizes,
		DefaultImage: Image,
	}
}

// Close implements providers.Provider.
func (p *Provider) Close() error { return nil }

// Live returns how many sandboxes it holds.
func (p *Provider) Live() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sandboxes)
}

// labels are the broker's labels of a sandbox created for spec.
func labels(spec providers.CreateSpec) map[string]string {
	return map[string]string{providers.LabelWorkspace: spec.WorkspaceID, providers.LabelInstance: spec.InstanceID}
}

func (p *Provider) get(sb providers.Sandbox) (*sandbox, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.sandboxes[sb.Ref]
	if !ok {
		return nil, providers.ErrSandboxGone
	}
	return s, nil
}

// Interface guards.
var _ providers.Provider = (*Provider)(nil)
