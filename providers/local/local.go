// Package local runs sandboxes on the broker's own host: each workspace is a
// directory, and every command runs in a fresh bubblewrap (bwrap) sandbox
// over it, with no network but the broker's egress proxy (for a workspace
// with allowed domains) and nothing of the host but a read-only /usr.
// README.md says which limits are enforced and how.
package local

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/internal/running"
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
	DataDir string `yaml:"-"`
	// BwrapPath is the bwrap binary; "" means look up "bwrap" in PATH.
	BwrapPath string `yaml:"bwrap_path"`
	// Tiers holds the limits of each size beyond its cores and memory, by
	// size name; a size not listed, or a zero field, gets the default
	// noted on [Tier].
	Tiers map[string]Tier `yaml:"tiers"`
	// CgroupParent is the cgroup, relative to each cgroup hierarchy's root,
	// under which the workspaces' cgroups live; "" means
	// "sandgate/<hash of DataDir>", one per data directory.
	CgroupParent string `yaml:"cgroup_parent"`
	// AllowUnenforced decides what New does when this host cannot enforce
	// a workspace limit (no cgroup controller, no swap accounting…): false
	// (`sandgate serve`) fails, saying which limit and why; true (`sandgate
	// dev`) logs a warning for each and runs without it.
	AllowUnenforced bool `yaml:"allow_unenforced"`

	// UIDBase and UIDCount are the host uids given to workspaces, one
	// each (the gid is the same number): the sandbox's uid 0 maps to it,
	// so a process that escapes the sandbox lands without privileges, and
	// workspaces cannot touch each other's files. The range must belong to
	// no real user. 0 means 1048576 (2^20) and 65536. UIDBase itself is
	// the uid of New's probe, never a workspace's.
	UIDBase  int `yaml:"uid_base"`
	UIDCount int `yaml:"uid_count"`
	// StageDir is an existing directory of the host, searchable by every
	// user, that each sandbox's step covers with a tmpfs in a mount
	// namespace of its own to bind the workspace's directories below it
	// (the data directory itself need not be searchable); "" means the
	// first of /mnt, /srv, /opt, /media that is a directory.
	StageDir string `yaml:"stage_dir"`

	// FreeReserveMiB is the space New keeps free on the data directory's
	// file system: a create is refused ([providers.ErrNoCapacity]) when
	// this data directory's workspaces, each grown to its disk quota,
	// would leave less; 0 means 1024.
	FreeReserveMiB int `yaml:"free_reserve_mib"`

	// MaxCommands caps the durable commands one workspace may start in
	// its lifetime; past it, and past its disk quota of kept output, a
	// start is refused (cmdquota.go). 0 means DefaultMaxCommands (256).
	MaxCommands int `yaml:"max_commands"`

	// HostPidsMax and HostMemoryMaxMiB are the ceiling of all of this
	// data directory's workspaces together (ceiling.go): their processes
	// (threads included) and their memory, set on their parent cgroups. 0
	// means derived from the host: three quarters of the processes the
	// kernel allows, and the memory less a quarter of it (at least 1 GiB)
	// left to the broker, Redis and the rest; -1 means no ceiling.
	HostPidsMax      int `yaml:"host_pids_max"`
	HostMemoryMaxMiB int `yaml:"host_memory_max_mib"`

	// GuestCapabilities are capabilities (e.g. "CAP_DAC_OVERRIDE") every
	// sandbox's root keeps in its own user namespace, where they reach only
	// the workspace's own files. nil means none. Not a config setting: the
	// broker never sets it; it is for a fake vendor
	// (providers/flymachines/flytest) whose guests stand for VMs with a
	// real root.
	GuestCapabilities []string `yaml:"-"`
	// HostDirs keeps each workspace's /workspace, /root and /tmp as plain
	// directories of the data directory, with no disk image and no host
	// uid of its own (the sandbox's uid 0 is the broker's uid). Not a
	// config setting: the broker never sets it; it is for the fake vendors
	// (modaltest, spritetest, flytest) that reach into those directories
	// from the host, as a vendor's agent inside its VM would.
	HostDirs bool `yaml:"-"`
	// GuestVM makes every sandbox stand for a VM's guest rather than a
	// jail: it shares the host's network namespace, its root keeps every
	// capability in its own user namespace (so it can create namespaces
	// and mount, as a VM's root can), no seccomp filter applies, and its
	// root directory stays writable. Requires HostDirs. Not a config
	// setting: the broker never sets it; it is for the fake vendors
	// (flytest, spritetest) whose guests stand for Firecracker VMs.
	GuestVM bool `yaml:"-"`
	// Pool keeps warm workspaces of some sizes, ready before any create
	// asks (pool.go); the zero value keeps none. Its image is [Image] or "".
	Pool providers.PoolConfig `yaml:"pool"`

	// Egress serves each workspace's egress proxy listener; nil means no
	// egress. Not a config setting: cmd/sandgate passes the broker's proxy.
	Egress Egress `yaml:"-"`
	// Images gives workspaces on OCI images their root (image.go); nil
	// means [Image] is the only image. Not a config setting: the broker
	// passes its image store.
	Images Images `yaml:"-"`
	// BwrapExec starts a bwrap of its own for every exec instead of
	// forking it in the workspace's resident process (README.md, "The
	// resident"), which is the default.
	BwrapExec bool `yaml:"bwrap_exec"`

	// mountinfo replaces /proc/self/mountinfo in tests.
	mountinfo string
	// cpuTick replaces the CPU governor's tick (cpuweight.go) in tests.
	cpuTick time.Duration
	// afterUIDClaim, when set, runs in Create right after the uid claim:
	// tests end a create there as a kill would.
	afterUIDClaim func()
	// onMkfs, when set, runs after each disk image is made: tests count
	// them.
	onMkfs func()
}

// Egress is the broker's egress proxy as the local provider uses it:
// Serve answers proxy requests on l, every one attributed to ws, until l
// is closed or ctx is done. *egress.Proxy satisfies it.
type Egress interface {
	Serve(ctx context.Context, l net.Listener, ws egress.Workspace) error
}

// Tier is the limits of one size beyond its cores and memory.
type Tier struct {
	// Pids caps the processes (threads included) of all of a workspace's
	// processes together; 0 means 1024 per CPU core (1024 for small).
	Pids int `yaml:"pids"`
	// DiskMiB is the disk quota across /workspace, /root and /tmp
	// together; 0 means 1024 per CPU core (1024 for small).
	DiskMiB int `yaml:"disk_mib"`
}

// tier returns the limits of size, defaults filled in.
func (c Config) tier(size sandgate.Size) Tier {
	t := c.Tiers[size.Name]
	if t.Pids <= 0 {
		t.Pids = 1024 * max(size.CPUCores, 1)
	}
	if t.DiskMiB <= 0 {
		t.DiskMiB = 1024 * max(size.CPUCores, 1)
	}
	return t
}

// Provider runs workspaces as directories on this host under bwrap. Its
// methods are safe for concurrent use. Several Providers may share a DataDir
// (a restarted broker sees the sandboxes of the previous one), but only the
// Provider that started an exec can kill it on Terminate.
type Provider struct {
	dataDir   string // absolute
	dirID     string // the data directory's id (DataDirID)
	etcDir    string // the generated /etc
	bwrap     string
	bwrapReal string // bwrap with its symlinks resolved: a workspace's namespace keeps the mounts on its way
	brokerID  string
	log       *slog.Logger
	clock     sandgate.Clock
	cpus      []int       // the CPUs sandboxes may be pinned to
	usrLinks  []usrLink   // how /bin, /lib… reach /usr on this host
	cfg       Config      // defaults filled in
	cg        *cgroupHost // nil: no cgroup at all (AllowUnenforced only)
	disk      *diskHost   // nil: no disk quota (AllowUnenforced only)
	exe       string      // the broker's binary, for durable commands' step
	stageDir  string      // see Config.StageDir
	probeUID  int         // Config.UIDBase; 0 when the broker is not root
	caps      []string    // Config.GuestCapabilities

	seccomp []byte   // bwrap's seccomp program, nil on an unknown architecture
	hostNS  *os.File // the broker's own mount namespace, for step.LeaveNS; nil: none
	// rootTrees is whether a workspace's mount namespace holds its
	// sandboxes' root tree (stageRoot): where the kernel can.
	rootTrees bool
	ns        nsTable       // the workspaces' mount namespaces (mountns.go)
	opens     openCache     // what open read
	stop      chan struct{} // closed by Close: ends the CPU governor
	stopOnce  sync.Once
	supMu     sync.Mutex // serialises ensureSupervisor
	// supStarted reports the exit of the supervisor ensureSupervisor
	// started last; nil when none was. Under supMu.
	supStarted chan error

	released releases // images in the trash seen bound (admitDisk)
	// trashing counts the terminated workspaces whose files Terminate
	// is still removing in the background; Close waits for them, and
	// admitDisk waits for their space. A Terminate may still start one
	// while Close waits (a call the broker gave up waiting for).
	trashing running.Group
	trashN   atomic.Int64
	pool     *pool     // nil: no warm workspaces (pool.go)
	pins     imagePins // each image workspace's pin on its OCI image
	unshare  string    // unshare(1), for image roots; "": none found

	placeMu sync.Mutex
	placed  map[string][]int // ref → the CPUs of each live workspace (placement.go)

	mu          sync.Mutex
	runs        map[string]map[*run]struct{} // ref → execs in flight
	terminating map[string]int               // ref → Terminate calls in flight

	res residents // each workspace's resident (README.md, "The resident")

	quiet quiet // the requests in flight, which the pool's refill lets pass (quiet.go)

	spare      *spares       // files made ahead for small writes (spares.go)
	spareStop  func()        // ends the spares' upkeep
	spareEnded chan struct{} // closed once it has removed them

	egressMu   sync.Mutex
	egress     map[string]*egressServer // ref → the egress socket this Provider serves
	egressCtx  context.Context          // the egress servers' context; ended by Close
	egressStop context.CancelFunc
}

// usrLink is a top-level directory such as /bin. On a merged-/usr host it
// is a symlink into /usr, recreated in the sandbox; otherwise (target "") it
// is a real directory of system binaries, bound read-only.
type usrLink struct{ name, target string }

var errUnsupported = errors.New("local: sandboxes need Linux")

// New returns a provider over c.DataDir. It checks that bwrap exists and that a sandbox actually starts here, and fails with a clear error
// otherwise (for example where user namespaces are disabled).
func New(ctx context.Context, c Config, env providers.Env) (_ *Provider, err error) {
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
	cpus, err := hostCPUs()
	if err != nil {
		return nil, fmt.Errorf("local: cpu affinity: %w", err)
	}
	c.CgroupParent = cmp.Or(c.CgroupParent, defaultCgroupParent(dataDir))
	if c.UIDBase <= 0 {
		c.UIDBase = 1 << 20
	}
	if c.UIDCount <= 0 {
		c.UIDCount = 1 << 16
	}
	if c.FreeReserveMiB <= 0 {
		c.FreeReserveMiB = 1024
	}
	if c.MaxCommands <= 0 {
		c.MaxCommands = DefaultMaxCommands
	}
	if pids, mem := hostCeiling(); c.HostPidsMax == 0 || c.HostMemoryMaxMiB == 0 {
		c.HostPidsMax = cmp.Or(c.HostPidsMax, pids)
		c.HostMemoryMaxMiB = cmp.Or(c.HostMemoryMaxMiB, mem)
	}
	if c.UIDCount < 2 || c.UIDBase+c.UIDCount > 1<<31 || (c.UIDBase <= 65534 && 65534 < c.UIDBase+c.UIDCount) {
		return nil, errors.New("local: uid_base and uid_count must name at least 2 uids, below 2^31, apart from nobody (65534)")
	}
	if err := c.Pool.Validate(); err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	for _, e := range c.Pool.Per {
		if e.Image != "" && e.Image != Image {
			return nil, errors.New("local: pool: unknown image; the only image is " + Image)
		}
	}
	stageDir, err := findStageDir(c.StageDir)
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("local: the broker's own binary: %w", err)
	}
	p := &Provider{
		cfg:         c,
		exe:         exe,
		res:         residents{static: sync.OnceValue(func() bool { return staticBinary(exe) })},
		stageDir:    stageDir,
		dataDir:     dataDir,
		etcDir:      filepath.Join(dataDir, etcDir),
		bwrap:       bwrap,
		bwrapReal:   cmp.Or(evalSymlinks(bwrap), bwrap),
		brokerID:    env.BrokerID,
		log:         env.Logger,
		clock:       env.Clock,
		cpus:        cpus,
		usrLinks:    findUsrLinks(),
		caps:        slices.Clone(c.GuestCapabilities),
		seccomp:     seccompFilter(),
		rootTrees:   rootTreesWork(),
		stop:        make(chan struct{}),
		runs:        make(map[string]map[*run]struct{}),
		placed:      make(map[string][]int),
		terminating: make(map[string]int),
		egress:      make(map[string]*egressServer),
		released:    releases{wait: releaseWait},
	}
	if c.GuestVM {
		if !c.HostDirs {
			return nil, errors.New("local: GuestVM needs HostDirs")
		}
		// A VM's root has no seccomp filter, and a guest's execs need
		// no shared root tree: bwrapOptions builds each one whole.
		p.seccomp, p.rootTrees = nil, false
	}
	if c.Images != nil {
		p.unshare, _ = exec.LookPath("unshare")
	}
	p.egressCtx, p.egressStop = context.WithCancel(context.WithoutCancel(ctx))
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.clock == nil {
		p.clock = sandgate.SystemClock{}
	}
	cg, problems := detectCgroups(cmp.Or(c.mountinfo, "/proc/self/mountinfo"), "/proc/self/cgroup", c.CgroupParent)
	// A New that fails leaves no parent cgroup behind (one that holds
	// workspaces stays: the removal fails).
	defer func() {
		if err != nil {
			cg.removeParents()
		}
	}()
	if cg != nil {
		if err := cg.setCeiling(c.HostPidsMax, c.HostMemoryMaxMiB); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) > 0 && !c.AllowUnenforced {
		return nil, fmt.Errorf("local: this host cannot enforce the workspace limits: %s", strings.Join(problems, "; "))
	}
	for _, pr := range problems {
		p.log.Warn("WORKSPACE LIMIT NOT ENFORCED: one workspace can take this host down for all", "problem", pr)
	}
	p.cg = cg
	for _, d := range []string{workspacesDir, trashDir, snapshotsDir, uidsDir, deadlinesDir, poolDir} {
		if err := os.MkdirAll(filepath.Join(dataDir, d), 0o700); err != nil {
			return nil, fmt.Errorf("local: data directory: %w", scrub(err))
		}
	}
	if err := writeEtc(p.etcDir); err != nil {
		return nil, fmt.Errorf("local: write /etc: %w", scrub(err))
	}
	if p.dirID, err = dataDirID(dataDir); err != nil {
		return nil, fmt.Errorf("local: data directory id: %w", scrub(err))
	}
	disk, problem := detectDisk()
	p.probeUID = c.UIDBase
	if c.HostDirs {
		disk, problem, p.probeUID = nil, "", 0
	} else if os.Geteuid() != 0 {
		// Only root can run a sandbox as another uid, or mount an image.
		disk, problem = nil, "uids and disk: the broker does not run as root, so sandboxes run as its own uid and workspaces get no disk quota"
		p.probeUID = 0
	}
	if problem != "" && !c.AllowUnenforced {
		return nil, fmt.Errorf("local: this host cannot enforce the workspace limits: %s", problem)
	}
	if problem != "" {
		p.log.Warn("WORKSPACE LIMIT NOT ENFORCED: one workspace can take this host down for all", "problem", problem)
	}
	if disk != nil {
		disk.dir = filepath.Join(dataDir, templatesDir)
	}
	p.disk = disk
	p.emptyTrash()
	p.sweepCgroups()
	p.reclaimPool()
	p.sweepUIDs()
	p.sweepSnapshotTemps()
	if err := p.probe(ctx); err != nil {
		p.egressStop()
		return nil, err
	}
	if err := p.superviseAll(); err != nil {
		p.egressStop()
		return nil, fmt.Errorf("local: supervisor: %w", scrub(err))
	}
	// The main thread's (/proc/self names it), which never leaves it.
	if f, err := os.Open("/proc/self/ns/mnt"); err == nil {
		p.hostNS = f
	}
	go p.ns.run(p.stop)
	go p.repinImages(p.egressCtx)
	if p.cg != nil && p.cg.acct != "" && p.cg.cpu != "" {
		go newCPUGovernor(p.cg, len(p.cpus), p.log).run(cmp.Or(c.cpuTick, cpuTick), p.stop)
	} else {
		p.log.Warn("no CPU usage accounting (cgroup cpuacct): a workspace that keeps its cores busy keeps its full CPU weight")
	}
	p.reopen()
	p.spare = newSpares(p.dataDir)
	spareCtx, spareStop := context.WithCancel(context.Background())
	p.spareStop, p.spareEnded = spareStop, make(chan struct{})
	go func() {
		defer close(p.spareEnded)
		p.spare.run(spareCtx, &p.quiet)
	}()
	if err := p.startPool(); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// evalSymlinks is filepath.EvalSymlinks, "" on error.
func evalSymlinks(name string) string {
	r, err := filepath.EvalSymlinks(name)
	if err != nil {
		return ""
	}
	return r
}

// DataDir returns the provider's data directory, as an absolute path.
func (p *Provider) DataDir() string { return p.dataDir }

// DataDirID returns the id of the provider's data directory: random, made
// when the directory is first used and kept in it, so that it names this
// directory on this host however it is mounted or named, and changes when
// the directory is replaced by an empty one. The broker records it in its
// store and refuses to serve local workspaces from two data directories on
// one store (see README.md, "One data directory per store").
func (p *Provider) DataDirID() string { return p.dirID }

// dataDirID reads the data directory's id, or makes it. Two Providers
// making it at once agree: the file is created exclusively, complete.
func dataDirID(dataDir string) (string, error) {
	name := filepath.Join(dataDir, idFile)
	for range 2 {
		b, err := os.ReadFile(name)
		if err == nil {
			id := strings.TrimSpace(string(b))
			if !strings.HasPrefix(id, "ldd_") {
				return "", fmt.Errorf("%s holds no data directory id", idFile)
			}
			return id, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		var r [16]byte
		rand.Read(r[:]) // never fails; see crypto/rand.Read
		tmp, err := os.CreateTemp(dataDir, idFile+".tmp*")
		if err != nil {
			return "", err
		}
		_, werr := tmp.WriteString("ldd_" + hex.EncodeToString(r[:]) + "\n")
		cerr := tmp.Close()
		if err := errors.Join(werr, cerr); err != nil {
			os.Remove(tmp.Name())
			return "", err
		}
		// Link, not rename: it fails when another Provider made it first,
		// whose id then wins.
		err = os.Link(tmp.Name(), name)
		os.Remove(tmp.Name())
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("%s could not be read after it was made", idFile)
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
	// Exactly as a workspace: on a disk image where there are disk quotas.
	var disk string
	if p.disk != nil {
		if err := p.disk.create(ctx, l, 16, p.probeUID, false); err != nil {
			return fmt.Errorf("local: probe: disk image: %w", err)
		}
		disk = l.disk()
	} else if err := l.makeDirs(); err != nil {
		return fmt.Errorf("local: probe: %w", scrub(err))
	} else if err := l.chownIf(p.probeUID); err != nil {
		return fmt.Errorf("local: probe: %w", scrub(err))
	}
	res, err := p.run(ctx, job{
		uid:    p.probeUID,
		disk:   disk,
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
// size, and, for a workspace with allowed domains, serves its egress socket
// (egress.go). Nothing runs until Exec. It refuses an image other than
// [Image] without [Config.Images] (image.go), one whose config runs as a
// user other than root ([ErrImageUser]), a non-empty egress allowlist without [Config.Egress] (no domain
// filter: only no network at all), a WorkspaceID that is not a safe
// directory name, and an existing one.
func (p *Provider) Create(ctx context.Context, spec providers.CreateSpec) (providers.Sandbox, error) {
	defer p.quiet.enter()()
	if len(spec.Egress.AllowedDomains) > 0 && p.cfg.Egress == nil {
		return providers.Sandbox{}, errNoEgress
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
	var img *imageRecord
	release := func() {}
	if spec.Image != "" && spec.Image != Image {
		var err error
		if img, release, err = p.acquireImage(ctx, spec.Image); err != nil {
			return providers.Sandbox{}, err
		}
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
	if img == nil { // a pooled workspace is on the host image
		if ok, err := p.takePooled(ctx, spec, sb, env); ok {
			if err != nil {
				return providers.Sandbox{}, err
			}
			return sb, nil
		}
	}

	l := p.layout(ref)
	if err := os.Mkdir(string(l), 0o700); err != nil {
		release()
		if errors.Is(err, fs.ErrExist) {
			return providers.Sandbox{}, errors.New("local: create: workspace already exists")
		}
		return providers.Sandbox{}, fmt.Errorf("local: create: %w", scrub(err))
	}
	p.pins.put(ref, release) // dropped by Terminate, or by undoCreate
	rec := record{
		CPUCores:  spec.Size.CPUCores,
		MemoryMiB: spec.Size.MemoryMiB,
		Pids:      p.cfg.tier(spec.Size).Pids,
		StartedAt: sb.StartedAt,
		Image:     img,
	}
	var staged chan struct{} // closed once the namespace is made
	for _, step := range []func() error{
		func() error { return p.writeJSON(l.labels(), sb.Labels, 0o644) }, // first: listed from now on
		func() (err error) {
			if p.probeUID > 0 { // else not root: the broker's own uid (AllowUnenforced)
				rec.UID, err = p.claimUID(ref)
			}
			if err == nil && p.cfg.afterUIDClaim != nil {
				p.cfg.afterUIDClaim()
			}
			return err
		},
		func() error { return p.makeDisk(ctx, l, &rec, spec.Size, false) }, // or, without a disk quota, the directories
		func() error {
			// The image's mount, the first exec's longest wait, runs
			// beside the rest of the create (warm, below, waits for it),
			// for a workspace whose execs run on its resident (whose
			// start, unused, is short-lived: unusedIdle).
			j := p.jobIn(ref, opened{layout: l, rec: rec})
			j.stageEgress = len(spec.Egress.AllowedDomains) > 0
			if !p.useResident(j) {
				return nil
			}
			staged = make(chan struct{})
			go func() {
				defer close(staged)
				p.stageNS(j)
			}()
			return nil
		},
		func() error { return p.finishCreate(ctx, spec, l, &rec, env, false) },
	} {
		if err := step(); err != nil {
			if staged != nil {
				<-staged // so that undoCreate drops the namespace it made
			}
			return providers.Sandbox{}, p.undoCreate(ref, l, rec.UID, err)
		}
	}
	if staged != nil {
		go p.warm(ref, l, rec)
	}
	p.log.Info("sandbox created", sandgate.WorkspaceAttr(ref), sandgate.InstanceAttr(spec.InstanceID),
		"cpu_cores", rec.CPUCores, "memory_mib", rec.MemoryMiB, "env_count", len(env),
		"egress_domains", len(rec.AllowedDomains), "image_digest", imageDigest(rec))
	return sb, nil
}

// finishCreate does what a create does once the workspace at l has its
// labels, uid and disk (rec): its own lifetime, account, egress, cgroups,
// env, CPUs and record, which marks it ready, and its deadline. A pooled
// workspace gets all of it at take time (takePooled).
// cgReady is whether its cgroups are made already (a pooled workspace's).
func (p *Provider) finishCreate(ctx context.Context, spec providers.CreateSpec, l layout, rec *record, env map[string]string, cgReady bool) error {
	ref := spec.WorkspaceID
	rec.ExpiresAt, rec.Account = spec.ExpiresAt, spec.AccountID
	if len(spec.Egress.AllowedDomains) > 0 {
		rec.AllowedDomains = slices.Clone(spec.Egress.AllowedDomains)
	}
	for _, step := range []func() error{
		func() error {
			if cgReady {
				return nil
			}
			return p.limit(ref, *rec)
		},
		func() error { return p.writeJSON(l.env(), env, 0o600) },
		func() error { return p.serveEgress(ref, l, *rec) },
		func() error {
			if rec.CPUs == nil { // else placed when it was pooled
				rec.CPUs = p.placeCPUs(ref, rec.CPUCores)
			}
			return nil
		},
		func() error { return p.writeJSON(l.sandbox(), *rec, 0o644) }, // marks the workspace ready
		func() error { return p.supervise(ref, spec.ExpiresAt) },      // the hard lifetime, without any broker
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// undoCreate removes what a create that failed with err made of the
// workspace ref at l, and returns err as Create reports it.
func (p *Provider) undoCreate(ref string, l layout, uid int, err error) error {
	if dead := p.stopResident(ref); dead != nil { // a pooled workspace's
		<-dead
	}
	p.ns.drop(ref)
	p.unplace(ref)
	p.stopEgress(ref)
	p.removeDeadline(ref)
	p.cg.remove(ref)
	p.releaseUID(ref, uid)
	p.pins.drop(ref)
	removeAll(string(l))
	if errors.Is(err, providers.ErrNoCapacity) {
		return err
	}
	return fmt.Errorf("local: create: %w", scrub(err))
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
	var ids [2]fileID
	for i, name := range []string{w.layout.sandbox(), w.layout.env()} {
		fi, err := os.Stat(name)
		if err != nil {
			return opened{}, fmt.Errorf("local: %w", providers.ErrSandboxGone)
		}
		ids[i] = idOf(fi)
	}
	if c, ok := p.opens.get(ref, ids); ok {
		w.rec, w.env = c.rec, c.env
		return w, nil
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
	p.opens.put(ref, ids, w)
	return w, nil
}

// openCache keeps what open read of each workspace, so that an exec reads
// (and decodes) sandbox.json and env.json again only when they changed.
// They are written once each, never over another (writeJSON), so a file with the
// same inode, size and times has the same contents; a workspace made anew
// under the same ref has new files. Entries go at Terminate. A hit hands out copies, which the caller may change.
type openCache struct {
	mu sync.Mutex
	m  map[string]cachedOpen
}

type cachedOpen struct {
	ids [2]fileID // of sandbox.json and env.json
	rec record
	env map[string]string
}

// fileID names one version of a file.
type fileID struct {
	dev, ino           uint64
	size, mtime, ctime int64
}

func idOf(fi fs.FileInfo) fileID {
	id := fileID{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino = uint64(st.Dev), st.Ino
		id.ctime = st.Ctim.Nano()
	}
	return id
}

func (c *openCache) get(ref string, ids [2]fileID) (cachedOpen, bool) {
	c.mu.Lock()
	e, ok := c.m[ref]
	c.mu.Unlock()
	if !ok || e.ids != ids || ids[0].ino == 0 {
		return cachedOpen{}, false
	}
	e.rec.CPUs = slices.Clone(e.rec.CPUs)
	e.rec.AllowedDomains = slices.Clone(e.rec.AllowedDomains)
	e.env = maps.Clone(e.env)
	return e, true
}

func (c *openCache) put(ref string, ids [2]fileID, w opened) {
	e := cachedOpen{ids: ids, rec: w.rec, env: maps.Clone(w.env)}
	e.rec.CPUs = slices.Clone(w.rec.CPUs)
	e.rec.AllowedDomains = slices.Clone(w.rec.AllowedDomains)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]cachedOpen)
	}
	c.m[ref] = e
}

func (c *openCache) drop(ref string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, ref)
}

// ReadFile reads a file inside the sandbox; see [execfile.ReadFile].
func (p *Provider) ReadFile(ctx context.Context, sb providers.Sandbox, path string, max int64, w io.Writer) (int64, error) {
	return execfile.ReadFile(ctx, helperExecer{p}, sb, path, max, w)
}

// WriteFile writes a file inside the sandbox; see [execfile.WriteFile].
func (p *Provider) WriteFile(ctx context.Context, sb providers.Sandbox, path string, r io.Reader) error {
	return execfile.WriteFile(ctx, helperExecer{p}, sb, path, r)
}

// Terminate kills the workspace's running execs, waits for them, and
// moves its directory to the trash: it is gone when Terminate returns.
// Nothing of it runs by then (its cgroups are emptied). Its disk image is
// unmounted, its cgroups, deadline and files removed and its uid freed
// right after, off the request path (Close waits for that, and a create's disk
// check waits for the space), except for a workspace on an OCI image,
// whose image pin goes before Terminate returns. A workspace that is
// already gone is not an error.
func (p *Provider) Terminate(ctx context.Context, sb providers.Sandbox) error {
	defer p.quiet.enter()()
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
	// A resident runs no tenant code, and every process its execs
	// started is in the workspace's cgroups, which are emptied (SIGKILL,
	// until none is left) and removed below before Terminate returns: its
	// own end is waited for off the request path, before its uid is
	// freed. Without cgroups its pid namespace is what ends them.
	var residents []*run
	for _, r := range runs {
		if r.resident && p.cg != nil {
			residents = append(residents, r)
			// Killed already: killExecs below need not wait for it.
			r.mu.Lock()
			pgid := r.pgid
			r.mu.Unlock()
			os.Remove(filepath.Join(p.layout(ref).execs(), strconv.Itoa(pgid)))
			continue
		}
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
	p.opens.drop(ref)
	p.stopEgress(ref)
	// Its execs are gone: its mount namespace leaves the table now, so
	// that nothing joins it again, and is closed (the image unmounted)
	// with the files below.
	ns := p.ns.detach(ref)
	// Execs another broker process started (a stop set through one gateway
	// while another runs the workspace's command) are killed here too.
	if _, err := killExecs(ctx, p.layout(ref)); err != nil {
		closeNS(ns)
		return fmt.Errorf("local: terminate: %w", err)
	}
	commands := killCommands(p.layout(ref))
	stopSupervisor(p.layout(ref)) // a workspace's own, from before the one per data directory
	// Nothing of it runs once its cgroups are empty; the cgroups and its
	// deadline go with its files (a supervisor that meets the deadline
	// first finds nothing to end), or at the next New's sweep.
	p.cg.empty(ref)
	p.unplace(ref)
	var rec record
	haveRec := readJSON(p.layout(ref).sandbox(), &rec) == nil
	// Once nothing of it runs or is left: its image pin (the upper layer
	// is among its files) and its uid.
	release := func() {
		for _, r := range residents {
			<-r.done // its uid is in use until it is gone
		}
		p.pins.drop(ref)
		if haveRec {
			p.releaseUID(ref, rec.UID)
		} else {
			p.releaseClaimsOf(ref) // a create cut short: no record names its uid
		}
	}
	// The rename is the moment the workspace is gone, for every Provider on
	// this DataDir; removing the files then happens off the request path.
	trash := filepath.Join(p.dataDir, trashDir, ref+"-"+randomHex())
	if err := os.Rename(string(p.layout(ref)), trash); err != nil {
		closeNS(ns)
		p.cg.remove(ref)
		p.removeDeadline(ref)
		release()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("local: terminate: %w", scrub(err))
	}
	teardown := func() {
		closeNS(ns) // first: the image's space comes back once it is unmounted and removed
		p.cg.remove(ref)
		p.removeDeadline(ref)
		if err := removeAll(trash); err != nil {
			// Gone all the same; the next New retries.
			p.log.Error("sandbox files not removed", sandgate.WorkspaceAttr(ref), sandgate.KeyError, err)
		}
		release()
	}
	if !haveRec || rec.Image != nil {
		// An OCI image's pin goes when Terminate returns, so that the
		// image store may collect it from then on; a create cut short is
		// rare.
		teardown()
	} else {
		p.trashN.Add(1)
		p.trashing.Go(func() {
			defer p.trashN.Add(-1)
			teardown()
		})
	}
	p.log.Info("sandbox terminated", sandgate.WorkspaceAttr(ref), "killed_execs", len(runs), "killed_commands", commands)
	return nil
}

// makeDisk gives the new workspace at l its disk image of the size's
// quota, if the reserve allows (see disk.go), or, on a host without disk
// quotas, its directories. Either way they belong to rec.UID. A
// background one (the pool's) makes its image at a low CPU priority.
func (p *Provider) makeDisk(ctx context.Context, l layout, rec *record, size sandgate.Size, background bool) error {
	if p.disk == nil {
		if err := l.makeDirs(); err != nil {
			return err
		}
		return l.chownIf(rec.UID)
	}
	mib := p.cfg.tier(size).DiskMiB
	unlock, err := p.admitDisk(ctx, mib)
	if err != nil {
		return err
	}
	defer unlock() // once the image exists: its size counts from then on
	if err := p.disk.create(ctx, l, mib, rec.UID, background); err != nil {
		return err
	}
	if p.cfg.onMkfs != nil {
		p.cfg.onMkfs()
	}
	rec.DiskMiB = mib
	return nil
}

// jobIn returns a job inside the workspace w of sandbox ref: its mounts,
// cpus, memory limit, uid and disk, and its record, which recreates its
// cgroups when they are missing. The caller adds what to run.
func (p *Provider) jobIn(ref string, w opened) job {
	return job{
		ref:    ref,
		layout: w.layout,
		cpus:   p.cpusOf(ref, w.rec),
		memory: int64(w.rec.MemoryMiB) << 20,
		rec:    w.rec,
		uid:    w.rec.UID,
		disk:   p.diskOf(w),
		// One mount namespace serves the resident and the rest.
		stageExe: !p.cfg.BwrapExec && !p.cfg.GuestVM,
	}
}

// diskOf is the image of the workspace w, "" when it has none.
func (p *Provider) diskOf(w opened) string {
	if w.rec.DiskMiB <= 0 {
		return ""
	}
	return w.layout.disk()
}

// DiskMiB is the disk quota of a workspace of size, for the lease's sizes;
// 0 when this host gives none.
func (p *Provider) DiskMiB(size sandgate.Size) int {
	if p.disk == nil {
		return 0
	}
	return p.cfg.tier(size).DiskMiB
}

// findStageDir returns dir, or the first of the default stage directories
// that exists; see Config.StageDir.
func findStageDir(dir string) (string, error) {
	cands := []string{"/mnt", "/srv", "/opt", "/media"}
	if dir != "" {
		cands = []string{dir}
	}
	for _, d := range cands {
		if !filepath.IsAbs(d) {
			continue
		}
		if fi, err := os.Lstat(d); err == nil && fi.IsDir() && fi.Mode().Perm()&0o001 != 0 {
			return filepath.Clean(d), nil
		}
	}
	return "", fmt.Errorf("local: no stage directory: set stage_dir to an existing directory searchable by all (tried %s)", strings.Join(cands, ", "))
}

// claimUID picks a free uid of the range for the workspace ref and claims
// it, for every broker process on this DataDir, by creating uids/<uid>.
func (p *Provider) claimUID(ref string) (int, error) {
	dir := filepath.Join(p.dataDir, uidsDir)
	for range 1000 {
		var b [4]byte
		rand.Read(b[:])
		uid := p.cfg.UIDBase + 1 + int(binary.BigEndian.Uint32(b[:])%uint32(p.cfg.UIDCount-1))
		name := filepath.Join(dir, strconv.Itoa(uid))
		err := p.spare.write(name, []byte(ref), 0o600, true)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if !errors.Is(err, errNoSpare) {
			return uid, err
		}
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		_, err = f.WriteString(ref)
		return uid, errors.Join(err, f.Close())
	}
	return 0, errors.New("no free uid in uid_base…uid_base+uid_count")
}

// releaseUID frees the uid the workspace ref claimed.
func (p *Provider) releaseUID(ref string, uid int) {
	if uid <= 0 {
		return
	}
	name := filepath.Join(p.dataDir, uidsDir, strconv.Itoa(uid))
	if b, err := os.ReadFile(name); err == nil && string(b) == ref {
		os.Remove(name)
	}
}

// limit creates the workspace's cgroups with the limits of rec.
func (p *Provider) limit(ref string, rec record) error {
	if p.cg == nil {
		return nil
	}
	// Again: on v1 a Close removes the parents. New reported a failure.
	_ = p.cg.setCeiling(p.cfg.HostPidsMax, p.cfg.HostMemoryMaxMiB)
	pids := cmp.Or(rec.Pids, 1024*max(rec.CPUCores, 1)) // 0: a workspace from before the cap
	_, errs := p.cg.setLimits(ref, cgroupLimits{memory: int64(rec.MemoryMiB) << 20, pids: pids, cpuCores: rec.CPUCores})
	if len(errs) > 0 {
		return errs[0].err
	}
	return nil
}

// leaf returns the files named file (see cgroupHost.leaf) of a new leaf
// cgroup name of the workspace w, recreating the workspace's cgroups when
// they are missing (a workspace from before a reboot). nil when there are
// no cgroups at all.
func (p *Provider) leaf(ref string, rec record, name, file string) ([]string, error) {
	if p.cg == nil {
		return nil, nil
	}
	procs, err := p.cg.leaf(ref, name, file)
	if errors.Is(err, fs.ErrNotExist) {
		if err := p.limit(ref, rec); err != nil {
			return nil, err
		}
		// An exec that opened the workspace before a Terminate finds its
		// cgroups removed by the teardown: Terminate marks the workspace
		// ended and renames it away before that, so what was just made
		// is removed again rather than left until the next New.
		if _, err := os.Lstat(p.readyFile(ref)); err != nil || ended(p.layoutOf(ref)) {
			p.cg.remove(ref)
			return nil, providers.ErrSandboxGone
		}
		procs, err = p.cg.leaf(ref, name, file)
	}
	return procs, err
}

// leafFiles are an exec's leaf cgroups, opened in the broker's own mount
// namespace (a workspace's has no /sys): the files bwrap joins through
// (v1: tasks, which bwrap's sh writes "0" to itself, joinAsStarted; v2:
// cgroup.procs, which the broker writes bwrap's pid to, confine) and,
// where memory is limited, the leaf's OOM kill count (oomKills).
type leafFiles struct {
	join []*os.File
	self bool // join holds tasks files, for joinAsStarted
	oom  *os.File
	err  error
}

func (lf leafFiles) close() {
	closeAll(lf.join)
	if lf.oom != nil {
		lf.oom.Close()
	}
}

// openLeaf makes the leaf cgroup name of the workspace ref (leaf) and
// opens its files.
func (p *Provider) openLeaf(ref string, rec record, name string) leafFiles {
	self := p.cg.joinsItself()
	file := "cgroup.procs"
	if self {
		file = p.cg.selfFile()
	}
	procs, err := p.leaf(ref, rec, name, file)
	if err != nil {
		return leafFiles{err: fmt.Errorf("cgroup: %w", err)}
	}
	lf := leafFiles{self: self}
	for _, n := range procs {
		f, err := os.OpenFile(n, os.O_WRONLY, 0)
		if err != nil {
			lf.close()
			// No path: it is the broker's business, not the client's.
			return leafFiles{err: fmt.Errorf("cannot join the workspace's cgroup: %w", scrub(err))}
		}
		lf.join = append(lf.join, f)
	}
	if name := p.cg.oomFile(ref, name); name != "" {
		if f, err := os.Open(name); err == nil {
			lf.oom = f
		}
	}
	return lf
}

// Close stops serving the workspaces' egress sockets and removes the
// DataDir's parent cgroups when no workspace is left in them; workspaces
// and their durable commands stay as they are.
func (p *Provider) Close() error {
	p.closePool() // first: its refill may be starting a resident
	p.stopOnce.Do(func() {
		p.stopResidents() // before hostNS: their threads leave for it
		close(p.stop)
		if p.hostNS != nil {
			// An exec still running then stays in its workspace's
			// namespace until its thread ends.
			p.hostNS.Close()
		}
	})
	p.trashing.Wait(context.Background())
	if p.spareStop != nil {
		p.spareStop()
		<-p.spareEnded
	}
	p.ns.sweep(time.Time{})
	p.egressStop()
	p.egressMu.Lock()
	for ref, s := range p.egress {
		s.stop()
		delete(p.egress, ref)
	}
	p.egressMu.Unlock()
	p.cg.removeParents()
	return nil
}

// sweepCgroups removes the cgroups of workspaces that are gone (a
// Terminate or a create cut short by a crash). A workspace's directory
// exists before its cgroups, so one in the making is never hit; those of
// a workspace whose Terminate is tearing it down (emptied, its directory
// in the trash) may be removed here or there, whichever comes first.
func (p *Provider) sweepCgroups() {
	if p.cg == nil {
		return
	}
	for _, d := range p.cg.dirs {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			// A name no workspace can have (another New's probe, say) stays.
			if e.IsDir() && p.workspaceGone(e.Name()) {
				p.cg.remove(e.Name())
			}
		}
	}
}

// workspaceGone reports whether name can name a workspace whose directory
// does not exist: terminated, or never made.
func (p *Provider) workspaceGone(name string) bool {
	if checkRef(name) != nil {
		return false
	}
	_, err := os.Lstat(string(p.layout(name)))
	return errors.Is(err, fs.ErrNotExist)
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
	return p.ListBroker(ctx, p.brokerID)
}

// ListBroker implements providers.BrokerLister: the sandboxes broker id
// labelled in the data directory, which every gateway on the store
// shares.
func (p *Provider) ListBroker(ctx context.Context, id string) ([]providers.Sandbox, error) {
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
		if err := readJSON(l.labels(), &labels); err != nil || labels[providers.LabelBroker] != id {
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
	_ providers.Provider     = (*Provider)(nil)
	_ execfile.Execer        = (*Provider)(nil)
	_ io.Closer              = (*Provider)(nil)
	_ providers.BrokerLister = (*Provider)(nil)
)
