package local_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// smallPool keeps n warm workspaces of size small.
func smallPool(n int) providers.PoolConfig {
	return providers.PoolConfig{Per: []providers.PoolEntry{{Size: "small", Count: n}}}
}

// newPooled returns a local provider over dataDir with pool, and the
// count of disk images it has made.
func newPooled(t *testing.T, dataDir string, pool providers.PoolConfig, egress local.Egress) (*local.Provider, *atomic.Int64) {
	t.Helper()
	var mkfs atomic.Int64
	c := local.Config{DataDir: dataDir, Pool: pool, Egress: egress}
	local.SetOnMkfs(&c, func() { mkfs.Add(1) })
	p, err := local.New(t.Context(), c, providers.Env{BrokerID: broker})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(p) })
	return p, &mkfs
}

// waitReady polls until p's pool holds n ready workspaces of small.
func waitReady(t *testing.T, p *local.Provider, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st := p.PoolStats()
		if len(st.Ready) == 1 && st.Ready[0].Ready == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool stats %+v; want %d ready small workspaces", st, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// inode returns the inode of name.
func inodeOf(t *testing.T, name string) uint64 {
	t.Helper()
	fi, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

func TestPoolOffByDefault(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	p, mkfs := newPooled(t, dataDir, providers.PoolConfig{}, nil)
	if st := p.PoolStats(); len(st.Ready) != 0 || st.Seconds != 0 || st.Taken != 0 {
		t.Errorf("pool stats with no pool configured: %+v; want none", st)
	}
	if dirs := local.PooledDirs(p); len(dirs) != 0 {
		t.Errorf("pooled directories with no pool: %d; want 0", len(dirs))
	}
	providertest.Create(t, p, providertest.Spec(t))
	if got := mkfs.Load(); got != 1 {
		t.Errorf("disk images made by a create with no pool: %d; want 1", got)
	}
}

// A create of a pooled size takes a ready workspace: its disk image is one
// the pool made before the request, and the tenant sees its own env, uid
// and files, not another's; a terminated workspace never goes back.
func TestPoolTake(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	p, _ := newPooled(t, dataDir, smallPool(2), nil)
	waitReady(t, p, 2)
	before := map[uint64]bool{}
	for _, d := range local.PooledDirs(p) {
		before[inodeOf(t, filepath.Join(d, "disk.img"))] = true
		for _, f := range []string{"labels.json", "env.json", "sandbox.json"} {
			if _, err := os.Stat(filepath.Join(d, f)); err == nil {
				t.Errorf("a pooled workspace holds %s; want nothing of any tenant", f)
			}
		}
	}
	if len(before) != 2 {
		t.Fatalf("pooled disk images: %d; want 2", len(before))
	}

	create := func(secret string) (providers.Sandbox, uint64) {
		spec := providertest.Spec(t)
		spec.Env = map[string]string{"TENANT_SECRET": secret}
		spec.ExpiresAt = time.Now().Add(time.Hour).UTC()
		start := time.Now()
		sb := providertest.Create(t, p, spec)
		if sb.StartedAt.Before(start) {
			t.Errorf("StartedAt %v is before the create (%v); want metering from the take", sb.StartedAt, start)
		}
		return sb, inodeOf(t, filepath.Join(dataDir, "workspaces", sb.Ref, "disk.img"))
	}
	a, inoA := create("alpha")
	b, inoB := create("bravo")
	if !before[inoA] || !before[inoB] || inoA == inoB {
		t.Errorf("disk images of a (%d) and b (%d); want two of the pool's %v, made before the creates", inoA, inoB, before)
	}
	if st := p.PoolStats(); st.Taken != 2 {
		t.Errorf("pool stats %+v; want 2 taken", st)
	}
	// Its mount namespace is made with the take, not by its first exec.
	deadline := time.Now().Add(time.Minute)
	for !local.HasNS(p, a.Ref) {
		if time.Now().After(deadline) {
			t.Fatalf("no mount namespace of a taken workspace before its first exec")
		}
		time.Sleep(10 * time.Millisecond)
	}
	show := func(sb providers.Sandbox) (env, uid string) {
		res := providertest.Exec(t, p, sb, "sh", "-c", `echo "$TENANT_SECRET"; ls /workspace`)
		if res.ExitCode != 0 {
			t.Fatalf("exec: exit %d: %s", res.ExitCode, res.Stderr)
		}
		var rec struct {
			UID int `json:"uid"`
		}
		readJSONFile(t, filepath.Join(dataDir, "workspaces", sb.Ref, "sandbox.json"), &rec)
		return string(res.Stdout), strconv.Itoa(rec.UID)
	}
	if res := providertest.Exec(t, p, a, "sh", "-c", "echo left > /workspace/a-was-here"); res.ExitCode != 0 {
		t.Fatalf("write in a: exit %d", res.ExitCode)
	}
	envA, uidA := show(a)
	envB, uidB := show(b)
	if envA != "alpha\na-was-here\n" || envB != "bravo\n" {
		t.Errorf("a sees %q, b sees %q; want each its own env and files only", envA, envB)
	}
	if uidA == uidB || uidA == "0" {
		t.Errorf("uids of a %s and b %s; want one each", uidA, uidB)
	}

	if err := p.Terminate(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	waitReady(t, p, 2)
	for _, d := range local.PooledDirs(p) {
		if inodeOf(t, filepath.Join(d, "disk.img")) == inoB {
			t.Errorf("b's disk image is in the pool")
		}
		for _, f := range []string{"labels.json", "env.json", "sandbox.json"} {
			if _, err := os.Stat(filepath.Join(d, f)); err == nil {
				t.Errorf("a refilled workspace holds %s; want a fresh one", f)
			}
		}
	}
	c, _ := create("charlie")
	if env, _ := show(c); env != "charlie\n" {
		t.Errorf("c, after a was terminated, sees %q; want its own env and an empty /workspace", env)
	}
}

// A workspace taken from the pool gets its own egress: its allowed domain
// answers, through a socket served for it alone.
func TestPoolEgress(t *testing.T) {
	t.Parallel()
	e := newEgressEnv(t)
	p, _ := newPooled(t, t.TempDir(), smallPool(2), e.proxy)
	waitReady(t, p, 2)
	port := strconv.Itoa(e.site.Port)
	workspace := func(domains ...string) providers.Sandbox {
		spec := providertest.Spec(t)
		spec.AccountID = egressAccount
		spec.Egress.AllowedDomains = domains
		sb := providertest.Create(t, p, spec)
		if err := providers.WriteFileBytes(t.Context(), p, sb, "/workspace/ca.pem", e.site.CAPEM); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	a := workspace("allowed.sg.test")
	b := workspace("a.sg.test")
	if st := p.PoolStats(); st.Taken != 2 {
		t.Fatalf("pool stats %+v; want both workspaces taken from the pool", st)
	}
	if out, code := fetch(t, p, a, "https://allowed.sg.test:"+port+"/"); code != 0 || !strings.Contains(out, "hello") {
		t.Errorf("a fetching its allowed domain: exit %d, %q; want the page", code, out)
	}
	if out, code := fetch(t, p, b, "https://allowed.sg.test:"+port+"/"); code == 0 || strings.Contains(out, "hello") {
		t.Errorf("b fetching a's domain: exit %d, %q; want it refused", code, out)
	}
	if u := e.proxy.Usage(a.Ref); u.BytesIn == 0 {
		t.Errorf("a's egress usage %+v; want its bytes counted for it", u)
	}
}

// The warm workspaces of a broker that died are removed by the next New
// on the data directory, with their uid claims; a live Provider's are not.
func TestPoolReclaimedAfterCrash(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	live, _ := newPooled(t, t.TempDir(), smallPool(1), nil) // another data directory: untouched
	waitReady(t, live, 1)
	dead, _ := newPooled(t, dataDir, smallPool(2), nil)
	waitReady(t, dead, 2)
	other, _ := newPooled(t, dataDir, smallPool(1), nil) // lives on through the restart below
	waitReady(t, other, 1)
	local.AbandonPool(dead)
	if n := len(local.PooledDirs(dead)); n != 3 {
		t.Fatalf("pooled directories before the restart: %d; want 3", n)
	}
	claims := func() int {
		entries, _ := os.ReadDir(filepath.Join(dataDir, "uids"))
		n := 0
		for _, e := range entries {
			if b, _ := os.ReadFile(filepath.Join(dataDir, "uids", e.Name())); strings.HasPrefix(string(b), "pool/") {
				n++
			}
		}
		return n
	}
	if n := claims(); n != 3 {
		t.Fatalf("pooled uid claims before the restart: %d; want 3", n)
	}

	newProvider(t, dataDir, broker)
	if n := len(local.PooledDirs(other)); n != 1 {
		t.Errorf("pooled directories after the restart: %d; want only the live Provider's 1", n)
	}
	if n := claims(); n != 1 {
		t.Errorf("pooled uid claims after the restart: %d; want only the live Provider's 1", n)
	}
	if n := len(local.PooledDirs(live)); n != 1 {
		t.Errorf("another data directory's pool: %d; want 1", n)
	}
	// A clean close removes the pool and its claims.
	other.Close()
	if n := len(local.PooledDirs(other)); n != 0 {
		t.Errorf("pooled directories after Close: %d; want 0", n)
	}
	if n := claims(); n != 0 {
		t.Errorf("pooled uid claims after Close: %d; want 0", n)
	}
}

func TestPoolConfigRefused(t *testing.T) {
	t.Parallel()
	for _, pc := range []providers.PoolConfig{
		{Per: []providers.PoolEntry{{Size: "huge", Count: 1}}},
		{Per: []providers.PoolEntry{{Size: "small", Count: 0}}},
		{Per: []providers.PoolEntry{{Size: "small", Count: 1, Image: "ubuntu"}}},
		{Per: []providers.PoolEntry{{Size: "small", Count: 9}}, MaxMemoryMiB: 4000},
	} {
		if _, err := local.New(t.Context(), local.Config{DataDir: t.TempDir(), Pool: pc}, providers.Env{BrokerID: broker}); err == nil {
			t.Errorf("local.New with pool %+v: no error; want it refused", pc)
		}
	}
}

func readJSONFile(t *testing.T, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

// The pool is read from the provider's settings block, strictly, as the
// broker's config (and SANDGATE_PROVIDER_LOCAL, SANDGATE_PROVIDERS) gives it.
func TestPoolFromSettings(t *testing.T) {
	t.Parallel()
	open := func(settings string) (providers.Provider, error) {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(settings), &doc); err != nil {
			t.Fatal(err)
		}
		p, err := local.Open(t.Context(), "local", *doc.Content[0], providers.Env{BrokerID: broker, DataDir: t.TempDir()})
		if err == nil {
			t.Cleanup(func() { providertest.Discard(p.(*local.Provider)) })
		}
		return p, err
	}
	p, err := open("{pool: {per: [{size: small, count: 1}], max_memory_mib: 1024}}")
	if err != nil {
		t.Fatalf("local.Open with a pool: %v", err)
	}
	st := p.(providers.Pooler).PoolStats()
	if len(st.Ready) != 1 || st.Ready[0].Size != "small" || st.Ready[0].Image != local.Image {
		t.Errorf("pool stats %+v; want one entry of small on %s", st, local.Image)
	}
	if _, err := open("{pool: {per: [{size: small, count: 1}], spare: 2}}"); err == nil {
		t.Errorf("local.Open with an unknown pool key: no error; want it refused")
	}
}

// A pooled workspace's resident runs before any create, holding nothing
// of a tenant; the create that takes it runs its first exec on that same
// resident, with the tenant's env, on the CPUs recorded for it, and
// Terminate ends it.
func TestPoolResidentStartedAtFill(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	p, _ := newPooled(t, dataDir, smallPool(1), nil)
	waitReady(t, p, 1)
	local.PausePool(p)
	before := local.Residents(p)
	if len(before) != 1 {
		t.Fatalf("residents of a pool of one before any create: %v; want one", before)
	}
	var pooled int
	for key, pid := range before {
		if !strings.HasPrefix(key, "pool/") {
			t.Fatalf("resident of %q before any create; want the pooled workspace's", key)
		}
		pooled = pid
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pooled) + "/cmdline")
	if err != nil || !strings.Contains(string(b), "--sandgate-exec-resident") {
		t.Fatalf("pooled resident's bwrap %d: %q, %v", pooled, b, err)
	}

	spec := providertest.Spec(t)
	spec.Env = map[string]string{"TENANT_SECRET": "alpha"}
	sb := providertest.Create(t, p, spec)
	if got := local.Residents(p); len(got) != 1 || got[sb.Ref] != pooled {
		t.Fatalf("residents after the take: %v; want the pooled one (%d) serving %s", got, pooled, sb.Ref)
	}
	res := providertest.Exec(t, p, sb, "sh", "-c", `echo "$TENANT_SECRET $PPID"; grep Cpus_allowed_list /proc/self/status`)
	if res.ExitCode != 0 {
		t.Fatalf("exec: exit %d: %s", res.ExitCode, res.Stderr)
	}
	var rec struct {
		CPUs []int `json:"cpus"`
	}
	readJSONFile(t, filepath.Join(dataDir, "workspaces", sb.Ref, "sandbox.json"), &rec)
	cpus := make([]string, len(rec.CPUs))
	for i, c := range rec.CPUs {
		cpus[i] = strconv.Itoa(c)
	}
	// Forked by the resident, pid 2 of the sandbox.
	want := "alpha 2\nCpus_allowed_list:\t" + strings.Join(cpus, ",") + "\n"
	if got := string(res.Stdout); got != want || len(rec.CPUs) == 0 {
		t.Errorf("first exec of the taken workspace printed %q (cpus %v); want %q", got, rec.CPUs, want)
	}
	if got := local.Residents(p); got[sb.Ref] != pooled {
		t.Errorf("residents after the first exec: %v; want still %d", got, pooled)
	}
	terminateEnds(t, p, sb, pooled)
}

// A pooled workspace's cgroups are made, with its size's limits, when the
// pool fills it; the take hands them to the workspace, whose memory limit
// then holds, and Close leaves none of the pool's behind.
func TestPoolCgroupsMadeAtFill(t *testing.T) {
	t.Parallel()
	p, _ := newPooled(t, t.TempDir(), smallPool(1), nil)
	waitReady(t, p, 1)
	local.PausePool(p)
	pooledDirs := local.PooledCgroups(p)
	if len(pooledDirs) == 0 {
		t.Fatal("a pooled workspace has no cgroups before any create")
	}
	sb := providertest.Create(t, p, providertest.Spec(t))
	if left := local.PooledCgroups(p); len(left) != 0 {
		t.Errorf("pooled cgroups after the take: %v; want them handed to the workspace", left)
	}
	if len(local.CgroupDirs(p, sb.Ref)) != len(pooledDirs) {
		t.Errorf("workspace cgroups %v; want one per pooled one %v", local.CgroupDirs(p, sb.Ref), pooledDirs)
	}
	for _, d := range local.CgroupDirs(p, sb.Ref) {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("workspace cgroup after the take: %v", err)
		}
	}
	// Its memory cgroup's 512 MiB hold across processes (RLIMIT_DATA
	// bounds each alone): four of 256 MiB are OOM-killed.
	const alloc = "(head -c 256M /dev/zero | tail >/dev/null) &"
	res := providertest.Exec(t, p, sb, "sh", "-c", alloc+alloc+alloc+alloc+" wait")
	if res.ExitCode != 137 {
		t.Errorf("1 GiB over four processes in a small workspace taken from the pool: exit %d; want 137 (%s)", res.ExitCode, res.Stderr)
	}
	if err := p.Terminate(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if left := local.PooledCgroups(p); len(left) != 0 {
		t.Errorf("pooled cgroups after Close: %v; want none", left)
	}
}
