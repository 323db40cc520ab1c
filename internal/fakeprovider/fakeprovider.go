// Package fakeprovider is an in-memory providers.Provider for gateway tests
// and benchmarks: creates cost nothing, files live in a map, and Exec
// answers from a function the test sets. It runs nothing.
package fakeprovider

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate/providers"
)

// Provider is a fake provider. The zero value is not usable; call New.
type Provider struct {
	mu        sync.Mutex
	sandboxes map[string]map[string][]byte // ref → path → contents
	// CreateHook, when set, runs inside Create; an error fails the create.
	CreateHook func(ctx context.Context, spec providers.CreateSpec) error
	// ExecFunc answers Exec; nil echoes argv[1:] joined by spaces.
	ExecFunc func(spec providers.ExecSpec) providers.ExecResult
	// TerminateErr, when set, fails every Terminate.
	TerminateErr error
	creates      int
}

// New returns an empty fake provider.
func New() *Provider { return &Provider{sandboxes: map[string]map[string][]byte{}} }

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
	return providers.Sandbox{Ref: spec.WorkspaceID, StartedAt: time.Now().UTC()}, nil
}

// Exec implements providers.Provider.
func (p *Provider) Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	if !p.exists(sb.Ref) {
		return providers.ExecResult{}, providers.ErrSandboxGone
	}
	if p.ExecFunc != nil {
		return p.ExecFunc(spec), nil
	}
	out := []byte(strings.Join(spec.Argv[1:], " ") + "\n")
	return providers.ExecResult{Stdout: out, StdoutBytes: int64(len(out))}, nil
}

// ReadFile implements providers.Provider.
func (p *Provider) ReadFile(ctx context.Context, sb providers.Sandbox, path string, max int64) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fs, ok := p.sandboxes[sb.Ref]
	if !ok {
		return nil, providers.ErrSandboxGone
	}
	b, ok := fs[path]
	if !ok {
		for k := range fs {
			if strings.HasPrefix(k, strings.TrimSuffix(path, "/")+"/") {
				return nil, providers.ErrNotAFile
			}
		}
		return nil, providers.ErrFileNotFound
	}
	if int64(len(b)) > max {
		return nil, providers.ErrFileTooLarge
	}
	return append([]byte(nil), b...), nil
}

// WriteFile implements providers.Provider.
func (p *Provider) WriteFile(ctx context.Context, sb providers.Sandbox, path string, data []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	fs, ok := p.sandboxes[sb.Ref]
	if !ok {
		return providers.ErrSandboxGone
	}
	fs[path] = append([]byte(nil), data...)
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
	return nil
}

// List implements providers.Provider.
func (p *Provider) List(ctx context.Context) ([]providers.Sandbox, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]providers.Sandbox, 0, len(p.sandboxes))
	for ref := range p.sandboxes {
		out = append(out, providers.Sandbox{Ref: ref})
	}
	return out, nil
}

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
var _ providers.Provider = (*Provider)(nil)
