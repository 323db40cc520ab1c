package flymachines

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/running"
	"github.com/sandgate/sandgate/internal/tick"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/warmpool"
)

// Warm Machines (Config.Pool): a pooled Machine is created with
// skip_launch (sheet §1.3), so it has never booted, let alone run a
// tenant's code. Its config is a workspace's of its size and image minus
// everything of a workspace: the agent, the proxy's CA, an empty env file,
// and for main process poolInit, which waits for the Machine to be bound
// to a workspace and then becomes that workspace's keeper. Its labels are
// those of a workspace named "pool-<owner>-<n>" plus labelPool = <owner>,
// a random name per Provider.
//
// A Create of its size and image takes it with two vendor calls, a start
// and the wait, where a create is a create (the agent's megabytes, an image
// pull) and the wait. Nothing of the workspace goes to the vendor on that
// path: it is bound afterwards, off the acquire path, by one exec that
// writes the workspace's env file, its egress credential and its keeper's
// argv (its own expires_at and egress) into the agent's directory
// (bindScript), and its labels are set by one metadata update, which
// neither reboots the Machine nor changes its config. The broker's first
// exec into the Machine carries the same bind, so it never waits for the
// one in the background; no jail starts before the keeper runs, and the
// keeper starts only once bound, so no tenant command runs with anything
// but its own workspace's env, egress and lifetime. A Machine nobody binds
// (its broker died at the take) ends itself after poolBindWait.
//
// A taken Machine is the workspace's; it is destroyed at Terminate like
// any other and never returns. List leaves out this Provider's own pooled
// Machines and lists taken ones under their workspace, from memory until
// the relabel lands. Those of a Provider that is gone (a broker that
// crashed) are listed like a workspace nobody has a record of, so the
// reaper's orphan sweep destroys them. Close destroys its own.

const (
	// labelPool is the metadata key of a pooled Machine: its owner.
	labelPool = "sandgate-pool"
	// poolLifetime bounds how long a pooled Machine is kept for a take.
	poolLifetime = 24 * time.Hour
	// poolBindWait bounds how long a started pooled Machine waits for its
	// bind before it ends itself.
	poolBindWait = 10 * time.Minute
)

// poolInit is a pooled Machine's main process, run as root outside every
// jail with $1 = poolBindWait in seconds. It waits for the bind file
// (bindScript; woken through the FIFO bindq, which it holds open so that
// no wake-up is lost) and
// execs the keeper it names, which then ends the Machine at the
// workspace's expires_at; without a bind in time it exits, and Fly
// destroys the Machine (auto_destroy, restart "no").
const poolInit = `d=` + providers.GuestDir + `
rm -f "$d/bindq" && mkfifo -m 600 "$d/bindq" && exec 3<>"$d/bindq" || exit 1
[ -e "$d/bind" ] || timeout "$1" sh -c 'read -r x <&3' || exit 0
exec 3<&-
set --
while IFS= read -r a; do set -- "$@" "$a"; done <"$d/bind"
[ "$1" = ` + providers.GuestAgent + ` ] && [ "$2" = keeper ] || exit 1
exec "$@"
`

// bindScript binds a taken Machine to its workspace, then execs the
// command: $1 = the workspace's env file (base64 JSON), $2 = its egress
// credential (base64; "" for none), $3 = its keeper's argv (base64, one
// argument a line). Each file is written whole (a rename), the keeper's
// argv last; a Machine bound already (a concurrent or repeated bind) is
// left as it is. "sandgate-bound" on stdout confirms the bind.
const bindScript = `d=` + providers.GuestDir + `
if [ ! -e "$d/bind" ]; then
	umask 077
	printf %s "$1" | base64 -d >"$d/env.json.$$" && mv -f "$d/env.json.$$" "$d/env.json" || exit 89
	if [ -n "$2" ]; then printf %s "$2" | base64 -d >"$d/egress.cred.$$" && mv -f "$d/egress.cred.$$" "$d/egress.cred" || exit 89; fi
	printf %s "$3" | base64 -d >"$d/bind.$$" && mv -f "$d/bind.$$" "$d/bind" || exit 89
	if [ -p "$d/bindq" ]; then echo go 1<>"$d/bindq"; fi
fi
echo sandgate-bound
shift 3
exec "$@"
`

// boundMark is bindScript's confirmation, the first line of its stdout.
const boundMark = "sandgate-bound\n"

// readBindScript prints a Machine's binding for a broker process that did
// not take it: "sandgate-unbound", or "sandgate-bind", the env file in
// base64 and the keeper's argv.
const readBindScript = `d=` + providers.GuestDir + `
[ -e "$d/bind" ] || { echo sandgate-unbound; exit 0; }
echo sandgate-bind
base64 -w0 "$d/env.json" && echo && cat "$d/bind"
`

// bindWait bounds how long a broker process that did not take a Machine
// waits for its bind.
const bindWait = time.Minute

// pool is a Provider's warm Machines.
type pool struct {
	*warmpool.Pool[pooled]
	owner string
	n     atomic.Int64 // pooled Machines made, for their names

	mu    sync.Mutex
	taken map[string]map[string]string // taken Machine's id → its workspace's labels, until relabelled
	bg    running.Group                // binds and relabels in flight; a Create may still take one while closePool waits
	hold  chan struct{}                // tests only: closed to let binds and relabels run
}

// pooled is one pooled Machine: its id and version.
type pooled struct{ id, version string }

// startPool makes the Provider's pool and starts its refill; nothing
// when the config has none.
func (p *Provider) startPool() {
	if !p.cfg.Pool.Enabled() {
		return
	}
	var b [6]byte
	rand.Read(b[:])
	p.pool = &pool{owner: hex.EncodeToString(b[:]), taken: map[string]map[string]string{}}
	p.pool.Pool = warmpool.Start(p.cfg.Pool, p.cfg.DefaultImage, p.clock, p.log, p.makePooled)
}

// makePooled creates one pooled Machine of key, not launched.
func (p *Provider) makePooled(ctx context.Context, key warmpool.Key) (pooled, error) {
	size, _ := sandgate.LookupSize(key.Size) // Pool.Validate checked it
	name := fmt.Sprintf("pool-%s-%d", p.pool.owner, p.pool.n.Add(1))
	spec := providers.CreateSpec{WorkspaceID: name, Size: size, Image: key.Image, ExpiresAt: p.clock.Now().Add(poolLifetime)}
	cfg, err := p.MachineConfig(spec, p.clock.Now(), "")
	if err != nil {
		return pooled{}, err
	}
	if p.vendor != nil && len(p.vendor.CA) > 0 {
		// The proxy's CA is the broker's, not a workspace's.
		cfg.Files = append(cfg.Files, File{GuestPath: providers.GuestCAFile, RawValue: base64.StdEncoding.EncodeToString(p.vendor.CA), Mode: 0o600})
	}
	cfg.Init = &Init{Exec: outsideArgv([]string{"sh", "-c", poolInit, "sh", strconv.Itoa(int(poolBindWait / time.Second))})}
	cfg.Metadata[labelPool] = p.pool.owner
	req := CreateMachineRequest{Config: cfg, Region: p.cfg.Region, SkipServiceRegistration: true, SkipLaunch: true}
	var m Machine
	cctx, cancel := context.WithTimeout(ctx, max(p.cfg.Timeout, createTimeout))
	err = p.c.do(cctx, "create machine", http.MethodPost, p.appPath()+"/machines", nil, req, &m, maxBody)
	cancel()
	if err != nil {
		// The create may have happened: the reaper finds it by its labels.
		return pooled{}, err
	}
	if m.ID == "" {
		return pooled{}, fmt.Errorf("create: the answer has no machine id")
	}
	return pooled{id: m.ID, version: m.InstanceID}, nil
}

// isPoolInit reports whether init is a pooled Machine's main process.
func isPoolInit(init *Init) bool {
	return init != nil && slices.Contains(init.Exec, poolInit)
}

// bindArgs are bindScript's arguments for the workspace of spec.
func (p *Provider) bindArgs(spec providers.CreateSpec, now time.Time, cred string) ([]string, error) {
	if spec.ExpiresAt.IsZero() || !spec.ExpiresAt.After(now) {
		return nil, errors.New("flymachines: create: no expires_at in the future: the Machine's lifetime needs one")
	}
	env, err := jailEnvFile(spec.Env)
	if err != nil {
		return nil, err
	}
	var ve *providers.VendorEgress
	if cred != "" {
		ve = p.vendor
	}
	keeper := providers.GuestKeeperArgv(spec.ExpiresAt, ve, spec.WorkspaceID, false)
	for _, a := range keeper {
		if strings.ContainsAny(a, "\n\x00") {
			return nil, errors.New("flymachines: create: the keeper's argument holds a newline")
		}
	}
	enc := base64.StdEncoding.EncodeToString
	c := ""
	if cred != "" {
		c = enc([]byte(cred + "\n"))
	}
	return []string{env.RawValue, c, enc([]byte(strings.Join(keeper, "\n") + "\n"))}, nil
}

// takePooled starts a pooled Machine of spec's size and image for the
// workspace: a start and the wait. ok is false when none is ready or it
// could not be started (it is destroyed then, and Create creates one as
// without a pool). Create then has settleTake bind and relabel it.
func (p *Provider) takePooled(ctx context.Context, spec providers.CreateSpec) (m Machine, ok bool) {
	if p.pool == nil {
		return Machine{}, false
	}
	pm, ok := p.pool.Take(spec.Size, spec.Image)
	if !ok {
		return Machine{}, false
	}
	m = Machine{ID: pm.id, InstanceID: pm.version}
	cctx, cancel := p.callCtx(ctx)
	err := p.c.do(cctx, "start machine", http.MethodPost, p.machinePath(pm.id)+"/start", nil, nil, nil, maxBody)
	cancel()
	if err == nil {
		err = p.waitStarted(ctx, m)
	}
	if err != nil {
		p.destroy(context.WithoutCancel(ctx), pm.id)
		p.log.Warn("pooled machine not started; creating one", sandgate.WorkspaceAttr(spec.WorkspaceID), sandgate.KeyError, err)
		return Machine{}, false
	}
	p.pool.mu.Lock()
	p.pool.taken[pm.id] = p.labels(spec)
	p.pool.mu.Unlock()
	return m, true
}

// settleTake binds and relabels a taken Machine, off the acquire path.
func (p *Provider) settleTake(sb providers.Sandbox, version string) {
	hold := p.pool.hold
	p.pool.bg.Go(func() {
		if hold != nil {
			<-hold
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*p.cfg.DirectExecMax)
		defer cancel()
		if _, err := p.vendorExec(ctx, sb, []string{"true"}, "", 5*time.Second, 64<<10); err != nil {
			p.log.Warn("pooled machine not bound; the first exec binds it", "fly_machine_id", sb.Ref, sandgate.KeyError, err)
		}
	})
	p.pool.bg.Go(func() {
		if hold != nil {
			<-hold
		}
		if err := p.relabel(sb, version); err != nil {
			p.log.Warn("pooled machine not relabelled: a restart of the broker would take it for an orphan", "fly_machine_id", sb.Ref, sandgate.KeyError, err)
		}
	})
}

// relabel gives a taken Machine its workspace's labels and drops
// labelPool, with the bulk metadata update; a 412 (another version) is
// answered by reading the Machine's version and trying again.
func (p *Provider) relabel(sb providers.Sandbox, version string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*p.cfg.Timeout)
	defer cancel()
	md := map[string]string{labelPool: ""} // "" removes it (sheet §1.3)
	for k, v := range sb.Labels {
		md[k] = v
	}
	var err error
	for attempt := range 5 {
		if attempt > 0 {
			if serr := tick.Sleep(ctx, backoff(attempt)); serr != nil {
				return err
			}
		}
		cctx, ccancel := p.callCtx(ctx)
		err = p.c.do(cctx, "update metadata", http.MethodPatch, p.machinePath(sb.Ref)+"/metadata", nil,
			MetadataRequest{Metadata: md, MachineVersion: version}, nil, maxBody)
		ccancel()
		switch {
		case err == nil:
			p.pool.mu.Lock()
			delete(p.pool.taken, sb.Ref)
			p.pool.mu.Unlock()
			return nil
		case statusIs(err, http.StatusNotFound):
			return nil // terminated already
		case statusIs(err, http.StatusPreconditionFailed):
			if m, gerr := p.get(ctx, sb.Ref); gerr == nil {
				version = m.InstanceID
			}
		case !retryable(err):
			var ae *APIError
			if errors.As(err, &ae) {
				return err
			}
		}
	}
	return err
}

// takenLabels returns the labels of a Machine this Provider took and has
// not relabelled yet.
func (p *Provider) takenLabels(id string) (map[string]string, bool) {
	if p.pool == nil {
		return nil, false
	}
	p.pool.mu.Lock()
	defer p.pool.mu.Unlock()
	l, ok := p.pool.taken[id]
	return l, ok
}

// closePool stops the refill, waits for the binds and relabels in flight
// and destroys the pooled Machines.
func (p *Provider) closePool() {
	if p.pool == nil {
		return
	}
	p.pool.bg.Wait(context.Background())
	p.pool.Close(func(pm pooled) {
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Timeout)
		defer cancel()
		if err := p.destroy(ctx, pm.id); err != nil {
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
