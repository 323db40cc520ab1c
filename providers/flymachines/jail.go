package flymachines

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate/internal/tick"

	"github.com/sandgate/sandgate/providers"
)

// jailOf is what every jail of a Machine gets: the workspace's env, and
// whether the keeper serves it egress; bind is the bindScript arguments
// of a taken pooled Machine not bound yet (pool.go).
type jailOf struct {
	env    map[string]string
	egress bool
	bind   []string
}

// byMachine is a map by Machine id, safe for concurrent use.
type byMachine[V any] struct {
	mu sync.Mutex
	m  map[string]V
}

func (c *byMachine[V]) get(id string) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[id]
	return v, ok
}

func (c *byMachine[V]) put(id string, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]V{}
	}
	c.m[id] = v
}

func (c *byMachine[V]) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, id)
}

// jailCache remembers each Machine's jailOf; another broker process
// reads it from the Machine's config (jailFor).
type jailCache struct{ byMachine[jailOf] }

// pendingBind returns the bind Machine id still needs, nil for none.
func (c *jailCache) pendingBind(id string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[id].bind
}

// bound records that Machine id is bound.
func (c *jailCache) bound(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if j, ok := c.m[id]; ok {
		j.bind = nil
		c.m[id] = j
	}
}

// envFile is where a Machine's config.files puts the workspace's env
// (JSON, mode 0600, root's, under the agent's directory that no jail
// sees): never config.env, which Fly gives to every process of the guest,
// the broker's root scripts outside the jails included (a client's
// PATH=/tmp/p:... would pick their tools).
const envFile = providers.GuestDir + "/env.json"

// jailEnvFile is the config.files entry of env.
func jailEnvFile(env map[string]string) (File, error) {
	if env == nil {
		env = map[string]string{}
	}
	b, err := json.Marshal(env)
	if err != nil {
		return File{}, fmt.Errorf("flymachines: create: env: %w", err)
	}
	return File{GuestPath: envFile, RawValue: base64.StdEncoding.EncodeToString(b), Mode: 0o600}, nil
}

// envOf reads the workspace's env back from a Machine's config.files.
func envOf(files []File) (map[string]string, error) {
	for _, f := range files {
		if f.GuestPath != envFile {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(f.RawValue)
		if err != nil {
			return nil, errors.New("the Machine's env file is not base64")
		}
		var env map[string]string
		if err := json.Unmarshal(b, &env); err != nil {
			return nil, errors.New("the Machine's env file is not a JSON object")
		}
		return env, nil
	}
	return nil, errors.New("the Machine has no env file: it was not made by this version of the broker")
}

// jailFor returns the jail settings of sb's Machine: remembered from its
// create, or read from its config (the env file, and the keeper's egress
// flags).
func (p *Provider) jailFor(ctx context.Context, sb providers.Sandbox) (jailOf, error) {
	if j, ok := p.jails.get(sb.Ref); ok {
		return j, nil
	}
	m, err := p.get(ctx, sb.Ref)
	switch {
	case statusIs(err, http.StatusNotFound):
		return jailOf{}, providers.ErrSandboxGone
	case err != nil:
		return jailOf{}, err
	}
	cfg := m.Config
	if cfg == nil {
		cfg = m.IncompleteConfig
	}
	if goneStates[m.State] {
		return jailOf{}, providers.ErrSandboxGone
	}
	if cfg != nil && isPoolInit(cfg.Init) {
		j, err := p.readBind(ctx, sb)
		if err != nil {
			return jailOf{}, err
		}
		p.jails.put(sb.Ref, j)
		return j, nil
	}
	if cfg == nil || cfg.Init == nil || len(cfg.Init.Exec) == 0 || cfg.Init.Exec[0] != providers.GuestAgent {
		return jailOf{}, errors.New("the Machine has no sandgate-guest keeper: it was not made by this version of the broker")
	}
	env, err := envOf(cfg.Files)
	if err != nil {
		return jailOf{}, err
	}
	j := jailOf{env: env, egress: providers.GuestEgress(cfg.Init.Exec)}
	p.jails.put(sb.Ref, j)
	return j, nil
}

// jailed returns spec with its argv run in a fresh jail of sb's Machine.
func (p *Provider) jailed(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecSpec, error) {
	j, err := p.jailFor(ctx, sb)
	if err != nil {
		return providers.ExecSpec{}, fmt.Errorf("flymachines: exec: %w", err)
	}
	spec.Argv = providers.GuestRunArgv(j.env, spec.Dir, j.egress, spec.Argv)
	spec.Dir = ""
	return spec, nil
}

// readBind reads the binding of a taken pooled Machine that another
// broker process took, waiting at most bindWait for that process to bind
// it (it does so right after the take). A Machine never bound lost its
// workspace's env and credential with the process that took it: it is
// gone for the workspace.
func (p *Provider) readBind(ctx context.Context, sb providers.Sandbox) (jailOf, error) {
	ctx, cancel := context.WithTimeout(ctx, bindWait)
	defer cancel()
	for {
		out, err := p.vendorExec(ctx, sb, []string{"sh", "-c", readBindScript}, "", 10*time.Second, 1<<20)
		if err != nil {
			err, _ = p.mapGone(ctx, sb, err)
			return jailOf{}, err
		}
		lines := strings.Split(strings.TrimRight(string(out.Stdout), "\n"), "\n")
		switch {
		case len(lines) >= 4 && lines[0] == "sandgate-bind":
			b, err := base64.StdEncoding.DecodeString(lines[1])
			var env map[string]string
			if err != nil || json.Unmarshal(b, &env) != nil {
				return jailOf{}, errors.New("the Machine's env file is not a JSON object")
			}
			return jailOf{env: env, egress: providers.GuestEgress(lines[2:])}, nil
		case len(lines) == 0 || lines[0] != "sandgate-unbound":
			return jailOf{}, errors.New("the Machine's binding is unreadable")
		}
		if err := tick.Sleep(ctx, 500*time.Millisecond); err != nil {
			return jailOf{}, fmt.Errorf("%w: the pooled Machine was never bound to its workspace", providers.ErrSandboxGone)
		}
	}
}
