package flymachines

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/warmpool"
)

// Warm Machines (Config.Pool): a pooled Machine is created with
// skip_launch (sheet §1.3), so it has never booted, let alone run a
// tenant's code, with the config of a workspace of its size and image
// minus everything of a workspace: no env, no egress credential or CA, a
// keeper bound to poolLifetime, and the labels of a workspace named
// "pool-<owner>-<n>" plus labelPool = <owner>, a random name per Provider.
// A Create of its size and image takes it: an update (POST /{id}) with the
// workspace's own full config (env, files, keeper argv with expires_at,
// labels), a start and the wait, instead of a create and the wait; the
// pool refills in the background. A taken Machine is the workspace's; it
// is destroyed at Terminate like any other and never returns.
//
// List leaves out this Provider's own pooled Machines. Those of a Provider
// that is gone (a broker that crashed) are listed like a workspace nobody
// has a record of, so the reaper's orphan sweep destroys them. Close
// destroys its own.

const (
	// labelPool is the metadata key of a pooled Machine: its owner.
	labelPool = "sandgate-pool"
	// poolLifetime bounds a pooled Machine's keeper should it ever be
	// started without a take; the take replaces it.
	poolLifetime = 24 * time.Hour
)

// pool is a Provider's warm Machines, by id.
type pool struct {
	*warmpool.Pool[string]
	owner string
	n     atomic.Int64 // pooled Machines made, for their names
}

// startPool makes the Provider's pool and starts its refill; nothing
// when the config has none.
func (p *Provider) startPool() {
	if !p.cfg.Pool.Enabled() {
		return
	}
	var b [6]byte
	rand.Read(b[:])
	p.pool = &pool{owner: hex.EncodeToString(b[:])}
	p.pool.Pool = warmpool.Start(p.cfg.Pool, p.cfg.DefaultImage, p.clock, p.log, p.makePooled)
}

// makePooled creates one pooled Machine of key, not launched.
func (p *Provider) makePooled(ctx context.Context, key warmpool.Key) (string, error) {
	size, _ := sandgate.LookupSize(key.Size) // Pool.Validate checked it
	name := fmt.Sprintf("pool-%s-%d", p.pool.owner, p.pool.n.Add(1))
	spec := providers.CreateSpec{WorkspaceID: name, Size: size, Image: key.Image, ExpiresAt: p.clock.Now().Add(poolLifetime)}
	cfg, err := p.MachineConfig(spec, p.clock.Now(), "")
	if err != nil {
		return "", err
	}
	cfg.Metadata[labelPool] = p.pool.owner
	req := CreateMachineRequest{Config: cfg, Region: p.cfg.Region, SkipServiceRegistration: true, SkipLaunch: true}
	var m Machine
	cctx, cancel := context.WithTimeout(ctx, max(p.cfg.Timeout, createTimeout))
	err = p.c.do(cctx, "create machine", http.MethodPost, p.appPath()+"/machines", nil, req, &m, maxBody)
	cancel()
	if err != nil {
		// The create may have happened: the reaper finds it by its labels.
		return "", err
	}
	if m.ID == "" {
		return "", fmt.Errorf("create: the answer has no machine id")
	}
	return m.ID, nil
}

// takePooled starts a pooled Machine of spec's size and image with the
// workspace's config cfg: an update, a start and the wait. ok is false
// when none is ready or it could not be started (it is destroyed then, and
// Create creates one as without a pool).
func (p *Provider) takePooled(ctx context.Context, spec providers.CreateSpec, cfg MachineConfig) (m Machine, ok bool) {
	if p.pool == nil {
		return Machine{}, false
	}
	id, ok := p.pool.Take(spec.Size, spec.Image)
	if !ok {
		return Machine{}, false
	}
	err := func() error {
		// Region is immutable and left out; the body carries the agent.
		cctx, cancel := context.WithTimeout(ctx, max(p.cfg.Timeout, createTimeout))
		err := p.c.do(cctx, "update machine", http.MethodPost, p.machinePath(id), nil, CreateMachineRequest{Config: cfg, SkipServiceRegistration: true}, &m, maxBody)
		cancel()
		if err != nil {
			return err
		}
		cctx, cancel = p.callCtx(ctx)
		err = p.c.do(cctx, "start machine", http.MethodPost, p.machinePath(id)+"/start", nil, nil, nil, maxBody)
		cancel()
		if err != nil {
			return err
		}
		m.ID = cmp.Or(m.ID, id)
		return p.waitStarted(ctx, m)
	}()
	if err != nil {
		p.destroy(context.WithoutCancel(ctx), id)
		p.log.Warn("pooled machine not started; creating one", sandgate.WorkspaceAttr(spec.WorkspaceID), sandgate.KeyError, err)
		return Machine{}, false
	}
	return m, true
}

// closePool stops the refill and destroys the pooled Machines.
func (p *Provider) closePool() {
	if p.pool == nil {
		return
	}
	p.pool.Close(func(id string) {
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Timeout)
		defer cancel()
		if err := p.destroy(ctx, id); err != nil {
			p.log.Warn("pooled machine not destroyed; the reaper will", sandgate.KeyError, err)
		}
	})
}

// ownPooled reports whether md labels one of this Provider's pooled
// Machines, which List leaves out.
func (p *Provider) ownPooled(md map[string]string) bool {
	return p.pool != nil && md[labelPool] == p.pool.owner
}

// PoolStats implements providers.Pooler.
func (p *Provider) PoolStats() providers.PoolStats {
	if p.pool == nil {
		return providers.PoolStats{}
	}
	return p.pool.Stats()
}

// Interface guards
var _ providers.Pooler = (*Provider)(nil)
