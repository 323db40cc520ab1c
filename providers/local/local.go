// Package local runs sandboxes on the broker's own host: each workspace is a
// directory, and every command runs in a fresh bubblewrap (bwrap) sandbox
// over it, with no network and nothing of the host but a read-only /usr.
// README.md says which limits are enforced and how.
package local

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/execfile"
)

// Image is the one image of the local provider: the host's /usr, read-only.
// An empty CreateSpec.Image means Image.
const Image = "host"

// Config configures the local provider. The zero value is valid when the
// broker has a data directory.
type Config struct {
	// DataDir holds the workspaces; "" means providers.Env.DataDir.
	DataDir string
	// BwrapPath is the bwrap binary; "" means look up "bwrap" in PATH.
	BwrapPath string
	// GuestCapabilities are capabilities (e.g. "CAP_DAC_OVERRIDE") every
	// sandbox's root keeps in its own user namespace, where they reach only
	// the workspace's own files. nil means none. The broker never sets it:
	// it is for a fake vendor (providers/flymachines/flytest) whose guests
	// stand for VMs with a real root.
	GuestCapabilities []string
}

// Provider runs workspaces as directories on this host under bwrap. Its
// methods are safe for concurrent use. Several Providers may share a DataDir
// (a restarted broker sees the sandboxes of the previous one), but only the
// Provider that started an exec can kill it on Terminate.
type Provider struct {
	dataDir  string // absolute
	etcDir   string // the generated /etc
	bwrap    string
	prlimit  string
	brokerID string
	log      *slog.Logger
	clock    sandgate.Clock
	cpus     []int     // the CPUs sandboxes may be pinned to
	usrLinks []usrLink // how /bin, /lib… reach /usr on this host
	caps     []string  // Config.GuestCapabilities

	mu          sync.Mutex
	runs        map[string]map[*run]struct{} // ref → execs in flight
	terminating map[string]int               // ref → Terminate calls in flight
}

// usrLink is a top-level directory such as /bin. On a merged-/usr host it
// is a symlink into /usr, recreated in the sandbox; otherwise (target "") it
// is a real directory of system binaries, bound read-only.
type usrLink struct{ name, target string }

var errUnsupported = errors.New("local: sandboxes need Linux")

// New returns a provider over c.DataDir. It checks that bwrap and prlimit
// exist and that a sandbox actually starts here, and fails with a clear error
// otherwise (for example where user namespaces are disabled).
func New(ctx context.Context, c Config, env providers.Env) (*Provider, error) {
	if !supported {
		return nil, errUnsupported
	}
	c.DataDir = cmp.Or(c.DataDir, env.DataDir)
	if c.DataDir == "" {
		return nil, errors.New("local: no data directory configured")
	}
	dataDir, err := filepath.Abs(c.DataDir)
	if err != nil {
		return nil, fmt.Errorf("local: data directory: %w", err)
	}
	bwrap, err := exec.LookPath(cmp.Or(c.BwrapPath, "bwrap"))
	if err != nil {
		return nil, fmt.Errorf("local: bwrap (bubblewrap) is required: %w", err)
	}
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		return nil, fmt.Errorf("local: prlimit (util-linux) is required: %w", err)
	}
	cpus, err := hostCPUs()
	if err != nil {
		return nil, fmt.Errorf("local: cpu affinity: %w", err)
	}
	p := &Provider{
		dataDir:     dataDir,
		etcDir:      filepath.Join(dataDir, etcDir),
		bwrap:       bwrap,
		prlimit:     prlimit,
		brokerID:    env.BrokerID,
		log:         env.Logger,
		clock:       env.Clock,
		cpus:        cpus,
		usrLinks:    findUsrLinks(),
		caps:        slices.Clone(c.GuestCapabilities),
		runs:        make(map[string]map[*run]struct{}),
		terminating: make(map[string]int),
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.clock == nil {
		p.clock = sandgate.SystemClock{}
	}
	for _, d := range []string{workspacesDir, trashDir, snapshotsDir} {
		if err := os.MkdirAll(filepath.Join(dataDir, d), 0o700); err != nil {
			return nil, fmt.Errorf("local: data directory: %w", scrub(err))
		}
	}
	if err := writeEtc(p.etcDir); err != nil {
		return nil, fmt.Errorf("local: write /etc: %w", scrub(err))
	}
	p.emptyTrash()
	p.sweepSnapshotTemps()
	if err := p.probe(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// probe runs "true" in a throwaway sandbox exactly as Exec would.
func (p *Provider) probe(ctx context.Context) error {
	// Not under DataDir: another Provider's New may be emptying its trash.
	dir, err := os.MkdirTemp("", "sandgate-probe-")
	if err != nil {
		return fmt.Errorf("local: probe: %w", scrub(err))
	}
	defer removeAll(dir)
	l := layout(dir)
	if err := l.makeDirs(); err != nil {
		return fmt.Errorf("local: probe: %w", scrub(err))
	}
	res, err := p.run(ctx, job{
		layout: l,
		cpus:   p.pickCPUs("", 1),
		memory: 256 << 20,
		dir:    defaultDir,
		argv:   []string{"true"},
		maxOut: 4 << 10,
	})
	if err != nil {
		return fmt.Errorf("local: bwrap does not work here: %w", err)
	}
	if res.ExitCode != 0 {
		// bwrap's own message, such as a refused namespace, is the
		// operator's best clue; it names no client data.
		msg, _, _ := strings.Cut(strings.TrimSpace(string(res.Stderr)), "\n")
		return fmt.Errorf("local: bwrap does not work here (exit code %d): %s", res.ExitCode, msg)
	}
	return nil
}

// findUsrLinks finds how this host's top-level system directories reach /usr.
func findUsrLinks() []usrLink {
	var links []usrLink
	for _, name := range []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		fi, err := os.Lstat(name)
		switch {
		case err != nil:
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(name)
			if err == nil && (strings.HasPrefix(t, "usr/") || strings.HasPrefix(t, "/usr/")) {
				links = append(links, usrLink{name, t})
			}
		case fi.IsDir():
			links = append(links, usrLink{name: name})
		}
	}
	return links
}

// layout returns the directories of the workspace ref; ref must be checked.
func (p *Provider) layout(ref string) layout {
	return layout(filepath.Join(p.dataDir, workspacesDir, ref))
}

// pickCPUs returns n of the host's CPUs (all of them when n is larger). The
// first is chosen by the ref's hash, so that workspaces spread over the
// host rather than all sharing CPU 0.
func (p *Provider) pickCPUs(ref string, n int) []int {
	n = min(max(n, 1), len(p.cpus))
	h := fnv.New32a()
	h.Write([]byte(ref))
	first := int(h.Sum32() % uint32(len(p.cpus)))
	cpus := make([]int, n)
	for i := range cpus {
		cpus[i] = p.cpus[(first+i)%len(p.cpus)]
	}
	return cpus
}

// Create makes the workspace's directories and records its labels, env and
// size. Nothing runs until Exec. It refuses an image other than [Image], a
// non-empty egress allowlist (the local provider can only give no network at
// all), a WorkspaceID that is not a safe directory name, and an existing one.
func (p *Provider) Create(ctx context.Context, spec providers.CreateSpec) (providers.Sandbox, error) {
	if spec.Image != "" && spec.Image != Image {
		return providers.Sandbox{}, errors.New("local: create: unknown image; the only image is " + Image)
	}
	if len(spec.Egress.AllowedDomains) > 0 {
		return providers.Sandbox{}, errors.New("local: create: cannot filter egress by domain; only an empty allowlist (no network) is supported")
	}
	ref := spec.WorkspaceID
	if err := checkRef(ref); err != nil {
		return providers.Sandbox{}, err
	}
	if spec.Size.CPUCores < 1 || spec.Size.MemoryMiB < 1 {
		return providers.Sandbox{}, errors.New("local: create: size needs CPU cores and memory")
	}
	if err := checkEnv(spec.Env); err != nil {
		return providers.Sandbox{}, err
	}

	l := p.layout(ref)
	if err := os.Mkdir(string(l), 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return providers.Sandbox{}, errors.New("local: create: workspace already exists")
		}
		return providers.Sandbox{}, fmt.Errorf("local: create: %w", scrub(err))
	}
	sb := providers.Sandbox{
		Ref: ref,
		Labels: map[string]string{
			providers.LabelBroker:    p.brokerID,
			providers.LabelWorkspace: spec.WorkspaceID,
			providers.LabelInstance:  spec.InstanceID,
		},
		StartedAt: p.clock.Now(),
	}
	env := spec.Env
	if env == nil {
		env = map[string]string{}
	}
	rec := record{
		CPUCores:  spec.Size.CPUCores,
		MemoryMiB: spec.Size.MemoryMiB,
		StartedAt: sb.StartedAt,
		ExpiresAt: spec.ExpiresAt,
	}
	for _, step := range []func() error{
		func() error { return writeJSON(l.labels(), sb.Labels, 0o644) }, // first: listed from now on
		l.makeDirs,
		func() error { return writeJSON(l.env(), env, 0o600) },
		func() error { return writeJSON(l.sandbox(), rec, 0o644) }, // marks the workspace ready
		func() error { return p.supervise(l, spec.ExpiresAt) },     // the hard lifetime, without any broker
	} {
		if err := step(); err != nil {
			removeAll(string(l))
			return providers.Sandbox{}, fmt.Errorf("local: create: %w", scrub(err))
		}
	}
	p.log.Info("sandbox created", sandgate.WorkspaceAttr(ref), sandgate.InstanceAttr(spec.InstanceID),
		"cpu_cores", rec.CPUCores, "memory_mib", rec.MemoryMiB, "env_count", len(env))
	return sb, nil
}

// checkEnv refuses what a process environment cannot hold. The gateway
// enforces the protocol's stricter grammar; messages never carry values.
func checkEnv(env map[string]string) error {
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return errors.New("local: create: env holds an invalid name or a NUL byte")
		}
	}
	return nil
}

// opened is a workspace loaded from disk.
type opened struct {
	layout layout
	rec    record
	env    map[string]string
}

// open loads the workspace ref. Returns [providers.ErrSandboxGone] when it
// does not exist or is not ready.
func (p *Provider) open(ref string) (opened, error) {
	if checkRef(ref) != nil {
		// No workspace can have this name.
		return opened{}, fmt.Errorf("local: %w", providers.ErrSandboxGone)
	}
	w := opened{layout: p.layout(ref)}
	if ended(w.layout) {
		// Its supervisor ended it at expires_at.
		return opened{}, fmt.Errorf("local: %w", providers.ErrSandboxGone)
	}
	for _, f := range []struct {
		name string
		v    any
	}{{w.layout.sandbox(), &w.rec}, {w.layout.env(), &w.env}} {
		err := readJSON(f.name, f.v)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return opened{}, fmt.Errorf("local: %w", providers.ErrSandboxGone)
		case err != nil:
			// Not the decoder's message: it quotes the file's content.
			return opened{}, fmt.Errorf("local: %s of a workspace is unreadable", filepath.Base(f.name))
		}
	}
	return w, nil
}

// ReadFile reads a file inside the sandbox; see [execfile.ReadFile].
func (p *Provider) ReadFile(ctx context.Context, sb providers.Sandbox, path string, max int64) ([]byte, error) {
	return execfile.ReadFile(ctx, p, sb, path, max)
}

// WriteFile writes a file inside the sandbox; see [execfile.WriteFile].
func (p *Provider) WriteFile(ctx context.Context, sb providers.Sandbox, path string, data []byte) error {
	return execfile.WriteFile(ctx, p, sb, path, data)
}

// Terminate kills the workspace's running execs, waits for them, and
// removes its directory. A workspace that is already gone is not an error.
func (p *Provider) Terminate(ctx context.Context, sb providers.Sandbox) error {
	ref := sb.Ref
	if checkRef(ref) != nil {
		return nil // no workspace can have this name
	}
	p.mu.Lock()
	p.terminating[ref]++
	runs := slices.Collect(maps.Keys(p.runs[ref]))
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		if p.terminating[ref]--; p.terminating[ref] == 0 {
			delete(p.terminating, ref)
		}
		p.mu.Unlock()
	}()

	for _, r := range runs {
		r.kill(true)
	}
	for _, r := range runs {
		select {
		case <-r.done:
		case <-ctx.Done():
			return fmt.Errorf("local: terminate: %w", context.Cause(ctx))
		}
	}
	// Durable commands may have been launched by any broker process: the
	// exclusive lock waits out launches in flight and keeps new ones out.
	unlock, err := p.lock(ctx, ref, lockExclusive)
	if errors.Is(err, providers.ErrSandboxGone) {
		// Gone, or a create cut short before it was ready: remove what is there.
		unlock = func() {}
	} else if err != nil {
		return fmt.Errorf("local: terminate: %w", err)
	}
	defer unlock()
	// Gone from now on for every Provider on this DataDir (open refuses
	// it, and an exec killed below reports it), before anything is killed.
	markEnded(p.layout(ref))
	// Execs another broker process started (a stop set through one gateway
	// while another runs the workspace's command) are killed here too.
	if _, err := killExecs(ctx, p.layout(ref)); err != nil {
		return fmt.Errorf("local: terminate: %w", err)
	}
	commands := killCommands(p.layout(ref))
	stopSupervisor(p.layout(ref))
	// The rename is the moment the workspace is gone, for every Provider on
	// this DataDir; removing the files may then take its time.
	trash := filepath.Join(p.dataDir, trashDir, ref+"-"+randomHex())
	if err := os.Rename(string(p.layout(ref)), trash); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("local: terminate: %w", scrub(err))
	}
	if err := removeAll(trash); err != nil {
		// Gone all the same; the next New retries.
		p.log.Error("sandbox files not removed", sandgate.WorkspaceAttr(ref), sandgate.KeyError, err)
	}
	p.log.Info("sandbox terminated", sandgate.WorkspaceAttr(ref), "killed_execs", len(runs), "killed_commands", commands)
	return nil
}

// emptyTrash removes what terminated workspaces left behind.
func (p *Provider) emptyTrash() {
	entries, _ := os.ReadDir(filepath.Join(p.dataDir, trashDir))
	for _, e := range entries {
		if err := removeAll(filepath.Join(p.dataDir, trashDir, e.Name())); err != nil {
			p.log.Error("trash not removed", sandgate.KeyError, err)
		}
	}
}

// List returns the workspaces on disk that carry this broker's id, sorted
// by Ref. A workspace whose creation was cut short is listed too, so that
// the reaper finds it.
func (p *Provider) List(ctx context.Context) ([]providers.Sandbox, error) {
	entries, err := os.ReadDir(filepath.Join(p.dataDir, workspacesDir))
	if err != nil {
		return nil, fmt.Errorf("local: list: %w", scrub(err))
	}
	var out []providers.Sandbox
	for _, e := range entries {
		ref := e.Name()
		if !e.IsDir() || checkRef(ref) != nil {
			continue
		}
		l := p.layout(ref)
		var labels map[string]string
		if err := readJSON(l.labels(), &labels); err != nil || labels[providers.LabelBroker] != p.brokerID {
			continue
		}
		var rec record
		readJSON(l.sandbox(), &rec) // zero StartedAt when not ready
		out = append(out, providers.Sandbox{Ref: ref, Labels: labels, StartedAt: rec.StartedAt})
	}
	return out, nil
}

func randomHex() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Interface guards
var (
	_ providers.Provider = (*Provider)(nil)
	_ execfile.Execer    = (*Provider)(nil)
)
