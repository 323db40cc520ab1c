package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/warmpool"
)

// Warm workspaces (Config.Pool): a pooled workspace is a directory made as
// Create makes one up to its disk, under <DataDir>/pool/<owner>/<id>/: its
// uid claimed (uids/<uid> names "pool/<owner>/<id>"), its disk image made
// (mkfs) and owned by that uid, or its directories. It has no labels, env,
// egress, cgroups, CPUs, deadline or record, and nothing has ever run in it.
// Its resident runs (warmPooled), pinned to CPUs placed for it, in its
// mount namespace: neither holds anything of a tenant, and no tenant code
// has run in it. A Create of its size and image takes it (takePooled): it
// writes the labels, renames the directory to workspaces/<ref>, gives the
// uid claim, the resident, the namespace and the CPUs to ref
// (adoptPooled), and then does what Create does after the disk, with the
// workspace's own spec. A taken workspace is a workspace like any other and
// never goes back to the pool; the pool refills in the background, one
// workspace at a time.
//
// <owner> is a random name per Provider, held by an flock on
// pool/<owner>.lock while the Provider lives. New removes the pooled
// workspaces of every owner whose lock it can take (a broker that crashed
// or was killed); Close removes its own.

const poolDir = "pool"

// pool is a Provider's warm workspaces.
type pool struct {
	*warmpool.Pool[pooled]
	owner string
	dir   string   // <DataDir>/pool/<owner>
	lock  *os.File // flock'ed: this owner lives
}

// pooled is one ready workspace of the pool.
type pooled struct {
	id  string
	rec record // size, uid and disk
	cg  bool   // its cgroups are made, with its size's limits (pool.cgroup)
}

// claim is what the uid claim of the pooled workspace id holds.
func (pl *pool) claim(id string) string { return poolDir + "/" + pl.owner + "/" + id }

func (pl *pool) layout(id string) layout { return layout(filepath.Join(pl.dir, id)) }

// cgroup is the name of the pooled workspace id's cgroups, which no
// workspace's can be (checkRef): sweepCgroups leaves them alone.
func (pl *pool) cgroup(id string) string { return pooledCgroup(pl.owner) + id }

// pooledCgroup is the prefix of the names of owner's pooled cgroups.
func pooledCgroup(owner string) string { return ".pool-" + owner + "-" }

// startPool makes the Provider's pool and starts its refill; nothing when
// the config has none.
func (p *Provider) startPool() error {
	if !p.cfg.Pool.Enabled() {
		return nil
	}
	owner := randomHex()
	root := filepath.Join(p.dataDir, poolDir)
	lock, err := os.OpenFile(filepath.Join(root, owner+".lock"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("local: pool: %w", scrub(err))
	}
	if err := flock(int(lock.Fd()), lockExclusive|lockNonBlock); err != nil {
		lock.Close()
		return fmt.Errorf("local: pool: %w", scrub(err))
	}
	dir := filepath.Join(root, owner)
	if err := os.Mkdir(dir, 0o700); err != nil {
		lock.Close()
		return fmt.Errorf("local: pool: %w", scrub(err))
	}
	p.pool = &pool{owner: owner, dir: dir, lock: lock}
	p.pool.Pool = warmpool.Start(p.cfg.Pool, Image, p.clock, p.log, p.makePooled)
	return nil
}

// makePooled makes one pooled workspace of key: what Create does up to
// and including the disk.
func (p *Provider) makePooled(ctx context.Context, key warmpool.Key) (pooled, error) {
	p.quiet.wait(ctx, refillGap, refillMaxWait)
	size, _ := sandgate.LookupSize(key.Size) // Pool.Validate checked it
	w := pooled{id: randomHex(), rec: record{CPUCores: size.CPUCores, MemoryMiB: size.MemoryMiB, Pids: p.cfg.tier(size).Pids}}
	l := p.pool.layout(w.id)
	if err := os.Mkdir(string(l), 0o700); err != nil {
		return pooled{}, scrub(err)
	}
	err := func() (err error) {
		// The lock file Terminate takes: made now, not on the take's
		// workspace's release path.
		if err := os.WriteFile(l.lock(), nil, 0o600); err != nil {
			return err
		}
		if p.probeUID > 0 {
			if w.rec.UID, err = p.claimUID(p.pool.claim(w.id)); err != nil {
				return err
			}
		}
		return p.makeDisk(ctx, l, &w.rec, size, true)
	}()
	if err != nil {
		p.releaseUID(p.pool.claim(w.id), w.rec.UID)
		removeAll(string(l))
		return pooled{}, scrub(err)
	}
	// Its cgroups and their limits, which its size sets: the take renames
	// them. Without them, the take makes them as a create does.
	if p.cg != nil {
		if err := p.limit(p.pool.cgroup(w.id), w.rec); err != nil {
			p.cg.remove(p.pool.cgroup(w.id))
		} else {
			w.cg = true
		}
	}
	p.warmPooled(&w)
	return w, nil
}

// warmPooled starts the pooled workspace w's resident (resident.go), so
// that the first exec of the create that takes it is a fork, and returns
// once its bwrap has started: from then on it is a run of the pool key,
// which the take hands to the workspace. The resident's sandbox holds
// nothing of a tenant (env is per exec, egress is not there: a take with
// allowed domains stops it), so it is placed on its CPUs now, and the
// take keeps them. It is never stopped as idle while pooled; its memory
// (about 10 MiB RSS, most of it the broker's binary, shared) is within
// what the pool's bound counts per pooled workspace, its size's memory.
// A resident that fails to start is the first exec's to start again.
func (p *Provider) warmPooled(w *pooled) {
	key := p.pool.claim(w.id)
	ow := opened{layout: p.pool.layout(w.id), rec: w.rec}
	if !p.useResident(p.jobIn(key, ow)) {
		return
	}
	w.rec.CPUs = p.placeCPUs(key, w.rec.CPUCores)
	ow.rec = w.rec
	if rs, err := p.residentOf(key, ow); err == nil {
		<-rs.started
	}
}

// isPoolKey reports whether ref names a pooled workspace (pool.claim),
// which no workspace's ref can (checkRef).
func isPoolKey(ref string) bool { return strings.HasPrefix(ref, poolDir+"/") }

// layoutOf is the directory of ref, a workspace's or a pool key.
func (p *Provider) layoutOf(ref string) layout {
	if isPoolKey(ref) {
		return layout(filepath.Join(p.dataDir, ref))
	}
	return p.layout(ref)
}

// readyFile is the file whose existence says that ref, a workspace's or a
// pool key, may start processes.
func (p *Provider) readyFile(ref string) string {
	if isPoolKey(ref) {
		return string(p.layoutOf(ref))
	}
	return p.layout(ref).sandbox()
}

// adoptPooled hands what the pooled workspace key runs to ref, whose
// directory (to) key's (from) now is: its CPUs, and, unless the workspace
// has allowed domains, its mount namespace and resident, which then run
// its first exec. With allowed domains both are stopped instead (they
// have no egress) and warm makes them anew.
func (p *Provider) adoptPooled(key, ref string, from, to layout, egress bool) {
	p.placeMu.Lock()
	if cpus, ok := p.placed[key]; ok {
		delete(p.placed, key)
		p.placed[ref] = cpus
	}
	p.placeMu.Unlock()
	if egress {
		p.stopResident(key) // its exit forgets it under key
		p.ns.drop(key)
		return
	}
	p.ns.rekey(key, ref, func(o stepOptions) stepOptions { return rebase(o, string(from), string(to)) })
	p.res.mu.Lock()
	defer p.res.mu.Unlock()
	slot := p.res.m[key]
	if slot == nil {
		return
	}
	delete(p.res.m, key)
	p.res.m[ref] = slot
	slot.mu.Lock()
	rs := slot.rs
	slot.mu.Unlock()
	if rs == nil {
		return
	}
	p.mu.Lock()
	rs.ref = ref
	if runs := p.runs[key]; runs != nil {
		delete(p.runs, key)
		p.runs[ref] = runs
	}
	p.mu.Unlock()
	rs.mu.Lock()
	rs.pooled, rs.last = false, time.Now()
	rs.mu.Unlock()
}

// rebase is o with every path at or below from moved to to.
func rebase(o stepOptions, from, to string) stepOptions {
	mv := func(s string) string {
		if s == from || strings.HasPrefix(s, from+"/") {
			return to + s[len(from):]
		}
		return s
	}
	o.Disk = mv(o.Disk)
	o.Binds = slices.Clone(o.Binds)
	for i := range o.Binds {
		o.Binds[i][0] = mv(o.Binds[i][0])
	}
	if o.root != nil {
		t := *o.root
		t.binds = slices.Clone(t.binds)
		for i := range t.binds {
			t.binds[i].src = mv(t.binds[i].src)
		}
		t.keepPaths = slices.Clone(t.keepPaths)
		for i := range t.keepPaths {
			t.keepPaths[i] = mv(t.keepPaths[i])
		}
		t.keepTrees = slices.Clone(t.keepTrees)
		for i := range t.keepTrees {
			t.keepTrees[i] = mv(t.keepTrees[i])
		}
		o.root = &t
	}
	return o
}

// takePooled is Create from a pooled workspace, when one of spec's size and
// image is ready; ok is false when none is (Create then makes one).
func (p *Provider) takePooled(ctx context.Context, spec providers.CreateSpec, sb providers.Sandbox, env map[string]string) (ok bool, err error) {
	pl := p.pool
	if pl == nil {
		return false, nil
	}
	w, ok := pl.Take(spec.Size, spec.Image)
	if !ok {
		return false, nil
	}

	ref := sb.Ref
	src, l := pl.layout(w.id), p.layout(ref)
	if err := p.writeJSON(src.labels(), sb.Labels, 0o644); err != nil {
		p.dropPooled(w)
		return true, fmt.Errorf("local: create: %w", scrub(err))
	}
	if err := renameNoReplace(string(src), string(l)); err != nil {
		p.dropPooled(w)
		if errors.Is(err, fs.ErrExist) {
			return true, errors.New("local: create: workspace already exists")
		}
		return true, fmt.Errorf("local: create: %w", scrub(err))
	}
	rec := w.rec
	rec.StartedAt = sb.StartedAt
	p.adoptPooled(pl.claim(w.id), ref, src, l, len(spec.Egress.AllowedDomains) > 0)
	cgReady := false
	if w.cg {
		if cgReady = p.cg.rename(pl.cgroup(w.id), ref) == nil; !cgReady {
			p.cg.remove(pl.cgroup(w.id))
		}
	}
	err = p.giveUID(rec.UID, pl.claim(w.id), ref)
	if err == nil {
		err = p.finishCreate(ctx, spec, l, &rec, env, cgReady)
	}
	if err != nil {
		return true, p.undoCreate(ref, l, rec.UID, err)
	}
	go p.warm(ref, l, rec)
	p.log.Info("sandbox created", sandgate.WorkspaceAttr(ref), sandgate.InstanceAttr(spec.InstanceID),
		"cpu_cores", rec.CPUCores, "memory_mib", rec.MemoryMiB, "env_count", len(env),
		"egress_domains", len(rec.AllowedDomains), "pooled", true)
	return true, nil
}

// giveUID hands the uid claim from one name to another, in one rename.
func (p *Provider) giveUID(uid int, from, to string) error {
	if uid <= 0 {
		return nil
	}
	dir := filepath.Join(p.dataDir, uidsDir)
	name := filepath.Join(dir, strconv.Itoa(uid))
	if b, err := os.ReadFile(name); err != nil || string(b) != from {
		return errors.New("the pooled workspace's uid claim is gone")
	}
	if err := p.spare.write(name, []byte(to), 0o600, false); !errors.Is(err, errNoSpare) {
		return err
	}
	f, err := os.CreateTemp(dir, ".tmp-") // not a uid: sweepUIDs skips it
	if err != nil {
		return err
	}
	_, err = f.WriteString(to)
	if err = errors.Join(err, f.Close()); err == nil {
		err = os.Rename(f.Name(), name)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// dropPooled removes the pooled workspace w.
func (p *Provider) dropPooled(w pooled) {
	key := p.pool.claim(w.id)
	if dead := p.stopResident(key); dead != nil {
		<-dead
	}
	p.ns.drop(key)
	p.unplace(key)
	if w.cg {
		p.cg.remove(p.pool.cgroup(w.id))
	}
	p.releaseUID(key, w.rec.UID)
	removeAll(string(p.pool.layout(w.id)))
}

// pooledClaim reports whether the uid claim naming name belongs to a
// pooled workspace that is still there.
func (p *Provider) pooledClaim(name string) bool {
	parts := strings.Split(name, "/")
	if len(parts) != 3 || parts[0] != poolDir || checkRef(parts[1]) != nil || checkRef(parts[2]) != nil {
		return false
	}
	_, err := os.Lstat(filepath.Join(p.dataDir, name))
	return err == nil
}

// closePool stops the refill and removes the pooled workspaces.
func (p *Provider) closePool() {
	if p.pool == nil {
		return
	}
	p.pool.Close(p.dropPooled)
	removeAll(p.pool.dir)
	os.Remove(p.pool.lock.Name())
	p.pool.lock.Close()
}

// reclaimPool removes the pooled workspaces of owners that are gone: their
// lock is free. Their uid claims are freed by sweepUIDs after it.
func (p *Provider) reclaimPool() {
	root := filepath.Join(p.dataDir, poolDir)
	locks, _ := filepath.Glob(filepath.Join(root, "*.lock"))
	for _, name := range locks {
		f, err := os.OpenFile(name, os.O_RDWR, 0)
		if err != nil {
			continue
		}
		if flock(int(f.Fd()), lockExclusive|lockNonBlock) != nil {
			f.Close() // its Provider lives
			continue
		}
		dir := strings.TrimSuffix(name, ".lock")
		p.removePooledCgroups(filepath.Base(dir))
		entries, _ := os.ReadDir(dir)
		if err := removeAll(dir); err != nil {
			p.log.Error("pooled workspaces of a gone broker not removed", sandgate.KeyError, err)
		} else {
			os.Remove(name)
			if len(entries) > 0 {
				p.log.Info("pooled workspaces of a gone broker removed", "count", len(entries))
			}
		}
		f.Close()
	}
}

// removePooledCgroups removes the cgroups of owner's pooled workspaces.
func (p *Provider) removePooledCgroups(owner string) {
	if p.cg == nil {
		return
	}
	for _, d := range p.cg.dirs {
		names, _ := filepath.Glob(filepath.Join(d, pooledCgroup(owner)+"*"))
		for _, name := range names {
			p.cg.remove(filepath.Base(name))
		}
	}
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
