package flymachines

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/tick"
	"github.com/sandgate/sandgate/providers"
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
	// poolRetry is how long the refill waits after a failed create.
	poolRetry = 5 * time.Second
)

// pool is a Provider's warm Machines.
type pool struct {
	cfg   providers.PoolConfig
	owner string
	kick  chan struct{}
	done  chan struct{} // closed when the refill has ended
	ctx   context.Context
	stop  context.CancelFunc
	once  sync.Once

	mu      sync.Mutex
	ready   map[poolKey][]pooled
	seconds float64 // of pooled Machines gone
	taken   int64
	n       int  // pooled Machines made, for their names
	paused  bool // tests hold the refill
}

type poolKey struct{ size, image string }

type pooled struct {
	id   string
	made time.Time
}

// startPool makes the Provider's pool and starts its refill; nothing
// when the config has none.
func (p *Provider) startPool() {
	if !p.cfg.Pool.Enabled() {
		return
	}
	var b [6]byte
	rand.Read(b[:])
	pl := &pool{cfg: p.cfg.Pool, owner: hex.EncodeToString(b[:]), kick: make(chan struct{}, 1),
		done: make(chan struct{}), ready: map[poolKey][]pooled{}}
	pl.ctx, pl.stop = context.WithCancel(context.Background())
	p.pool = pl
	go p.refill()
}

// refill keeps the pool full, one Machine at a time, until Close.
func (p *Provider) refill() {
	pl := p.pool
	defer close(pl.done)
	for {
		key, ok := pl.want(p.cfg.DefaultImage)
		if !ok {
			select {
			case <-pl.ctx.Done():
				return
			case <-pl.kick:
			}
			continue
		}
		id, err := p.makePooled(pl.ctx, key)
		if err != nil {
			if pl.ctx.Err() != nil {
				return
			}
			p.log.Warn("pooled machine not made", "size", key.size, sandgate.KeyError, err)
			if tick.Sleep(pl.ctx, poolRetry) != nil {
				return
			}
			continue
		}
		pl.mu.Lock()
		pl.ready[key] = append(pl.ready[key], pooled{id: id, made: p.clock.Now()})
		pl.mu.Unlock()
	}
}

// want returns a (size, image) below its count.
func (pl *pool) want(defImage string) (poolKey, bool) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.paused {
		return poolKey{}, false
	}
	for _, e := range pl.cfg.Per {
		k := poolKey{e.Size, cmp.Or(e.Image, defImage)}
		if len(pl.ready[k]) < e.Count {
			return k, true
		}
	}
	return poolKey{}, false
}

// makePooled creates one pooled Machine of key, not launched.
func (p *Provider) makePooled(ctx context.Context, key poolKey) (string, error) {
	size, _ := sandgate.LookupSize(key.size) // Pool.Validate checked it
	p.pool.mu.Lock()
	p.pool.n++
	name := fmt.Sprintf("pool-%s-%d", p.pool.owner, p.pool.n)
	p.pool.mu.Unlock()
	spec := providers.CreateSpec{WorkspaceID: name, Size: size, Image: key.image, ExpiresAt: p.clock.Now().Add(poolLifetime)}
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
	pl := p.pool
	if pl == nil {
		return Machine{}, false
	}
	if std, known := sandgate.LookupSize(spec.Size.Name); !known || std.CPUCores != spec.Size.CPUCores || std.MemoryMiB != spec.Size.MemoryMiB {
		return Machine{}, false
	}
	key := poolKey{spec.Size.Name, cmp.Or(spec.Image, p.cfg.DefaultImage)}
	pl.mu.Lock()
	ws := pl.ready[key]
	if len(ws) == 0 {
		pl.mu.Unlock()
		return Machine{}, false
	}
	w := ws[0] // the oldest
	pl.ready[key] = ws[1:]
	pl.taken++
	pl.seconds += p.clock.Now().Sub(w.made).Seconds()
	pl.mu.Unlock()
	select {
	case pl.kick <- struct{}{}:
	default:
	}
	err := func() error {
		// Region is immutable and left out; the body carries the agent.
		cctx, cancel := context.WithTimeout(ctx, max(p.cfg.Timeout, createTimeout))
		err := p.c.do(cctx, "update machine", http.MethodPost, p.machinePath(w.id), nil, CreateMachineRequest{Config: cfg, SkipServiceRegistration: true}, &m, maxBody)
		cancel()
		if err != nil {
			return err
		}
		cctx, cancel = p.callCtx(ctx)
		err = p.c.do(cctx, "start machine", http.MethodPost, p.machinePath(w.id)+"/start", nil, nil, nil, maxBody)
		cancel()
		if err != nil {
			return err
		}
		m.ID = cmp.Or(m.ID, w.id)
		return p.waitStarted(ctx, m)
	}()
	if err != nil {
		p.destroy(context.WithoutCancel(ctx), w.id)
		p.log.Warn("pooled machine not started; creating one", sandgate.WorkspaceAttr(spec.WorkspaceID), sandgate.KeyError, err)
		return Machine{}, false
	}
	return m, true
}

// closePool stops the refill and destroys the pooled Machines.
func (p *Provider) closePool() {
	pl := p.pool
	if pl == nil {
		return
	}
	pl.once.Do(func() {
		pl.stop()
		<-pl.done
		pl.mu.Lock()
		defer pl.mu.Unlock()
		now := p.clock.Now()
		for k, ws := range pl.ready {
			for _, w := range ws {
				pl.seconds += now.Sub(w.made).Seconds()
				ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Timeout)
				if err := p.destroy(ctx, w.id); err != nil {
					p.log.Warn("pooled machine not destroyed; the reaper will", sandgate.KeyError, err)
				}
				cancel()
			}
			delete(pl.ready, k)
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
	var st providers.PoolStats
	pl := p.pool
	if pl == nil {
		return st
	}
	now := p.clock.Now()
	pl.mu.Lock()
	defer pl.mu.Unlock()
	st.Seconds, st.Taken = pl.seconds, pl.taken
	for _, e := range pl.cfg.Per {
		k := poolKey{e.Size, cmp.Or(e.Image, p.cfg.DefaultImage)}
		for _, w := range pl.ready[k] {
			st.Seconds += now.Sub(w.made).Seconds()
		}
		st.Ready = append(st.Ready, providers.PoolReady{Size: k.size, Image: k.image, Ready: len(pl.ready[k])})
	}
	return st
}

// Interface guards
var _ providers.Pooler = (*Provider)(nil)
