package local

import (
	"cmp"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local/internal/residentd"
)

// The resident (unless Config.BwrapExec): each workspace keeps one small
// process inside its sandbox, the broker's own binary bound at
// residentBin and run by a bwrap started exactly as an exec's (same namespaces, uid,
// seccomp filter, resource limits and cgroups), so that everything it
// forks inherits them. An exec is then a fork in it rather than a new
// sandbox:
//
//	/dev/.sandgate-resident --sandgate-exec-resident SOCKET
//
// Its one descriptor past stderr is its end of a SOCK_SEQPACKET socket
// pair whose other end only the broker holds; each message is one exec: a residentd.Request, and with
// SCM_RIGHTS the exec's own connection (a socket pair of its own), its
// stdin, stdout and stderr, and the tasks files of its leaf cgroups. The
// resident forks the command from a thread that has joined those cgroups,
// so the command is born in them, and answers on the exec's connection
// with its wait status. Output goes straight from the command to the
// broker's pipes. See README.md, "The resident".

// residentBin is where the resident's binary is bound in its sandbox: on
// bwrap's own /dev, so that no mount point of it is in the root tree.
const residentBin = "/dev/.sandgate-resident"

// residentData bounds the resident's own RLIMIT_DATA: a -race build
// maps about 450 MiB, a plain one about 120 MiB (VmData; its RSS is about
// 10 MiB). A workspace with more memory gives it its own.
const residentData = 1 << 30

// residentIdle is how long a resident is kept after its last exec.
const residentIdle = nsIdle

// unusedIdle is how long a resident that a create started is kept while
// no exec has come: a client's first exec follows its create at once,
// and a create that none follows (a thousand idle workspaces) must not
// keep a process and a mount per workspace for long.
const unusedIdle = 5 * time.Second

// resident is a workspace's running resident.
type resident struct {
	ctlMu   sync.RWMutex  // write-held to close ctl, read-held to send on it
	ctl     *os.File      // the broker's end of the control socket; nil once closed
	r       *run          // its bwrap, which Terminate kills
	dead    chan struct{} // closed once its bwrap has exited
	started chan struct{} // closed once its bwrap has started, or failed to

	// ref is the workspace's, or a pooled workspace's pool key until a
	// create takes it (adoptPooled); under the Provider's mu.
	ref string

	mu       sync.Mutex
	inflight int
	last     time.Time
	stopping bool // idleResident is stopping it: no exec may begin
	pooled   bool // its workspace is in the pool: never idle
	used     bool // it has had an exec
}

// residents are a Provider's residents, by workspace.
type residents struct {
	mu sync.Mutex
	m  map[string]*residentSlot

	// static reports whether the broker's binary needs no dynamic loader,
	// so that it runs on an image, which need not have the host's C
	// library (a -race build needs it).
	static func() bool
}

// residentSlot holds one workspace's resident; its lock is held while
// one starts, so that a start never holds up another workspace's execs.
type residentSlot struct {
	mu sync.Mutex
	rs *resident // nil: none started yet
}

// useResident reports whether j runs on its workspace's resident: unless
// Config.BwrapExec, for a workspace's exec (the file helpers included)
// on a host whose v1 cgroups a thread joins by itself, or without cgroups,
// on the host's /usr or an image the broker's binary runs on.
// Snapshots (capabilities, RLIMIT_FSIZE, streamed output) keep bwrap.
func (p *Provider) useResident(j job) bool {
	if p.cfg.BwrapExec || p.cfg.GuestVM || j.ref == "" || (p.cg != nil && !p.cg.joinsItself()) {
		return false
	}
	return j.rec.Image == nil || p.res.static()
}

// staticBinary reports whether the ELF file name has no interpreter.
func staticBinary(name string) bool {
	f, err := elf.Open(name)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

// residentOf returns ref's resident, starting one when there is none or
// it has died.
func (p *Provider) residentOf(ref string, w opened) (*resident, error) {
	p.res.mu.Lock()
	if p.res.m == nil {
		p.res.m = make(map[string]*residentSlot)
	}
	slot := p.res.m[ref]
	if slot == nil {
		slot = &residentSlot{}
		p.res.m[ref] = slot
	}
	p.res.mu.Unlock()

	slot.mu.Lock()
	defer slot.mu.Unlock()
	if slot.rs != nil {
		select {
		case <-slot.rs.dead:
		default:
			return slot.rs, nil
		}
	}
	rs, err := p.startResident(ref, w)
	if err != nil {
		return nil, err
	}
	slot.rs = rs
	go func() {
		<-rs.dead
		p.res.mu.Lock()
		defer p.res.mu.Unlock()
		ref := p.refOf(rs) // a pooled workspace's changes at its take
		if p.res.m[ref] == slot && slot.mu.TryLock() {
			if slot.rs == rs {
				delete(p.res.m, ref) // else a start is under way, or done
			}
			slot.mu.Unlock()
		}
	}()
	return rs, nil
}

// warm readies what the new workspace ref's first exec needs while the
// create's answer travels: its mount namespace (mountns.go), staged
// exactly as that exec will ask, and its resident, so that the exec finds
// it up or starting rather than starting one itself (a bwrap set-up and a
// Go start of the broker's binary). Neither runs tenant code. A Terminate
// that came first or meanwhile leaves nothing behind: it marks the
// workspace ended before it drops the namespace, and a resident start
// checks under the Provider's lock that the workspace is not being
// terminated (start), so the check below, after both, sees it gone.
func (p *Provider) warm(ref string, l layout, rec record) {
	w := opened{layout: l, rec: rec}
	j := p.jobIn(ref, w)
	j.stageEgress = len(rec.AllowedDomains) > 0
	if p.useResident(j) {
		// Its failure is the first exec's to report, which starts another.
		p.residentOf(ref, w)
	} else {
		p.stageNS(j)
	}
	if _, err := os.Stat(string(l)); err != nil || ended(l) {
		p.stopResident(ref)
		p.ns.drop(ref)
	}
}

// stageNS makes j's workspace's mount namespace, staged as j's exec
// asks, unless it is there; an error is the first exec's to report.
func (p *Provider) stageNS(j job) {
	o, ok := p.stageOptions(j)
	if !ok {
		return
	}
	if p.rootTrees {
		o = p.rootOptions(j, o)
	}
	if _, release, err := p.ns.acquire(j.ref, o); err == nil {
		release()
	}
}

// startResident starts ref's resident and returns at once: requests
// queue in the control socket until it reads them.
func (p *Provider) startResident(ref string, w opened) (*resident, error) {
	j := p.jobIn(ref, w)
	j.dir = "/"
	j.env = map[string]string{"GOMAXPROCS": "1", "GOGC": "20"}
	j.perCommandData = true
	sock := ""
	if len(w.rec.AllowedDomains) > 0 {
		p.ensureEgress(ref, w)
		j.egress, j.stageEgress = true, true
		sock = egressSock
	}
	argsR, argsW, err := blockingPipe()
	if err != nil {
		return nil, fmt.Errorf("local: exec: %w", err)
	}
	files := []*os.File{argsR}
	filter := p.seccomp
	if filter != nil {
		secR, secW, err := blockingPipe()
		if err != nil {
			argsR.Close()
			argsW.Close()
			return nil, fmt.Errorf("local: exec: %w", err)
		}
		_, err = secW.Write(filter)
		secW.Close()
		files = append(files, secR)
		if err != nil {
			closeAll(files)
			argsW.Close()
			return nil, fmt.Errorf("local: exec: %w", err)
		}
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		closeAll(files)
		argsW.Close()
		return nil, fmt.Errorf("local: exec: %w", err)
	}
	// One message is one request, whose env may be large: past the
	// default buffer it could not be sent at all. Best effort (root only).
	_ = unix.SetsockoptInt(pair[0], unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 8<<20)
	ctl, theirs := os.NewFile(uintptr(pair[0]), "resident"), os.NewFile(uintptr(pair[1]), "resident")
	j.argv = []string{residentBin, "--" + residentd.Name, sock}

	// The resident joins none of the workspace's cgroups: like the
	// broker's threads, it must never be what the tenant's memory or
	// process count kills (that would end every exec in flight), nor
	// count against them. The commands it forks join their exec's.
	leaves := make(chan leafFiles, 1)
	leaves <- leafFiles{}
	j.bindExe = true
	cmd := exec.Command(p.bwrap)
	cmd.Args = append([]string{p.bwrap, "--args", "3", "--"}, j.argv...)
	cmd.Env = []string{} // as an exec's bwrap: see run
	cmd.ExtraFiles = files
	cmd.SysProcAttr = sandboxProcAttr(j.uid)
	cmd.WaitDelay = waitDelay

	rs := &resident{ctl: ctl, r: &run{done: make(chan struct{}), resident: true}, dead: make(chan struct{}), started: make(chan struct{}),
		ref: ref, last: time.Now(), pooled: isPoolKey(ref)}
	fail := func(err error) (*resident, error) {
		ctl.Close()
		theirs.Close()
		closeAll(files)
		argsW.Close()
		return nil, fmt.Errorf("local: exec: resident: %w", err)
	}
	o, staged := p.stageOptions(j)
	var ns *os.File
	release := func() {}
	rooted := false
	if staged {
		if p.rootTrees {
			o = p.rootOptions(j, o)
			rooted = true
		}
		ns, release, err = p.ns.acquire(ref, o)
		if err != nil {
			return fail(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := launch{cmd: cmd, r: rs.r, ns: ns, leaves: leaves, argsR: argsR, argsW: argsW,
		opts: p.bwrapOptions(j, filter != nil, rooted), ctx: ctx,
		// The seccomp filter and the resident's end of the socket: only
		// bwrap keeps them, so that the resident's end closes with it.
		closeStarted: append(files[1:], theirs), last: []*os.File{theirs}, started: rs.started}
	exited := p.launchBwrap(j, l)
	go func() {
		end := <-exited
		cancel()
		if end.oom != nil {
			end.oom.Close()
		}
		release()
		if end.started && end.startErr == nil {
			p.forgetResident(rs)
		}
		argsW.Close()
		rs.ctlMu.Lock()
		rs.ctl.Close()
		rs.ctl = nil
		rs.ctlMu.Unlock()
		close(rs.r.done)
		close(rs.dead)
		p.log.Debug("resident exited", sandgate.WorkspaceAttr(ref))
	}()
	go p.idleResident(ref, rs)
	return rs, nil
}

// stopResidents kills every resident and waits until they are gone
// (Close): the namespaces they hold then end with their descriptors.
func (p *Provider) stopResidents() {
	p.res.mu.Lock()
	var all []*resident
	for _, slot := range p.res.m {
		slot.mu.Lock()
		if slot.rs != nil {
			all = append(all, slot.rs)
		}
		slot.mu.Unlock()
	}
	p.res.mu.Unlock()
	for _, rs := range all {
		rs.r.kill(false)
	}
	for _, rs := range all {
		<-rs.dead
	}
}

// stopResident kills ref's resident, if any, and returns a channel
// closed once it is gone; nil when there is none.
func (p *Provider) stopResident(ref string) <-chan struct{} {
	p.res.mu.Lock()
	slot := p.res.m[ref]
	p.res.mu.Unlock()
	if slot == nil {
		return nil
	}
	slot.mu.Lock()
	defer slot.mu.Unlock()
	if slot.rs == nil {
		return nil
	}
	slot.rs.r.kill(false)
	return slot.rs.dead
}

// forgetResident is forget for rs, whose ref a take may change meanwhile.
func (p *Provider) forgetResident(rs *resident) {
	p.mu.Lock()
	ref := rs.ref
	p.forgetLocked(ref, rs.r)
	p.mu.Unlock()
	go os.Remove(filepath.Join(p.layoutOf(ref).execs(), strconv.Itoa(rs.r.pgid)))
}

// refOf is rs's workspace's ref now.
func (p *Provider) refOf(rs *resident) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return rs.ref
}

// idleResident stops rs once it has run no exec for residentIdle, and
// when the Provider closes.
//
// One that never had an exec is stopped after unusedIdle, and the mount
// namespace made for it goes with it.
func (p *Provider) idleResident(ref string, rs *resident) {
	t := time.NewTimer(unusedIdle / 2)
	defer t.Stop()
	for {
		select {
		case <-rs.dead:
			return
		case <-p.stop:
		case <-t.C:
			rs.mu.Lock()
			limit := residentIdle
			if !rs.used {
				limit = unusedIdle
			}
			idle := rs.inflight == 0 && !rs.pooled && time.Since(rs.last) >= limit
			rs.stopping = idle
			used := rs.used
			rs.mu.Unlock()
			if !idle {
				t.Reset(limit / 3)
				continue
			}
			if !used {
				p.ns.drop(p.refOf(rs)) // closed once the resident is gone
			}
		}
		rs.mu.Lock()
		rs.stopping = true
		rs.mu.Unlock()
		rs.r.kill(false) // residentOf forgets it once it is dead
		return
	}
}

// send sends one request to rs.
func (rs *resident) send(req, oob []byte) error {
	rs.ctlMu.RLock()
	defer rs.ctlMu.RUnlock()
	if rs.ctl == nil {
		return syscall.EPIPE
	}
	sc, err := rs.ctl.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = sc.Control(func(fd uintptr) {
		serr = unix.Sendmsg(int(fd), req, oob, nil, unix.MSG_NOSIGNAL)
	})
	return cmp.Or(err, serr)
}

// begin and end count rs's execs in flight, for idleResident. begin
// reports false when rs is being stopped: an exec sent to it then would
// die with it.
func (rs *resident) begin() bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.stopping {
		return false
	}
	rs.inflight++
	rs.used = true
	return true
}

func (rs *resident) end() {
	rs.mu.Lock()
	rs.inflight--
	rs.last = time.Now()
	rs.mu.Unlock()
}

// residentEnv is the command's environment, as bwrap would set it: PATH,
// HOME, the workspace's env, the proxy variables, and PWD.
func residentEnv(j job) []string {
	env := map[string]string{"PATH": defaultPath, "HOME": "/root"}
	maps.Copy(env, j.env)
	if j.egress {
		for _, kv := range proxyEnv {
			env[kv[0]] = kv[1]
		}
	}
	env["PWD"] = j.dir
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// execResident runs j on its workspace's resident (w) and waits for it.
// It kills every process of the exec (its leaf cgroups) when j.timeout
// passes or ctx ends, and when the command exits.
func (p *Provider) execResident(ctx context.Context, w opened, j job) (providers.ExecResult, error) {
	if err := ctx.Err(); err != nil {
		return providers.ExecResult{}, fmt.Errorf("local: exec: %w", context.Cause(ctx))
	}
	var lf leafFiles
	leaf := ""
	if p.cg != nil {
		leaf = "e-" + randomHex()
		lf = p.openLeaf(j.ref, j.rec, leaf)
		defer func() { go p.cg.removeLeaf(j.ref, leaf) }()
		if lf.err != nil {
			lf.close()
			return providers.ExecResult{}, fmt.Errorf("local: exec: %w", lf.err)
		}
	}
	defer lf.close()

	stdout := &cappedBuffer{max: j.maxOut, w: j.outTo}
	stderr := &cappedBuffer{max: j.maxOut, w: j.errTo}
	var pipes residentPipes
	defer pipes.close()
	if err := pipes.open(len(j.stdin) > 0); err != nil {
		return providers.ExecResult{}, fmt.Errorf("local: exec: %w", err)
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return providers.ExecResult{}, fmt.Errorf("local: exec: %w", err)
	}
	conn := os.NewFile(uintptr(pair[0]), "exec")
	defer conn.Close()
	theirs := pair[1]

	leave, home := p.leaveFiles(j.ref)
	defer closeAll(leave)
	req := residentd.Request{Argv: j.argv, Env: residentEnv(j), Dir: j.dir, Stdin: pipes.stdinR >= 0,
		Join: len(lf.join), Leave: len(leave), Home: home, Data: uint64(j.memory)}.Append(nil)
	fds := []int{theirs}
	if pipes.stdinR >= 0 {
		fds = append(fds, pipes.stdinR)
	}
	fds = append(fds, pipes.stdoutW, pipes.stderrW)
	for _, f := range lf.join {
		fds = append(fds, int(f.Fd()))
	}
	for _, f := range leave {
		fds = append(fds, int(f.Fd()))
	}
	var rs *resident
	for try := 0; ; try++ {
		if rs, err = p.residentOf(j.ref, w); err != nil {
			unix.Close(theirs)
			return providers.ExecResult{}, err
		}
		if !rs.begin() {
			<-rs.dead // stopped for idleness: start another
			continue
		}
		err = rs.send(req, unix.UnixRights(fds...))
		if err == nil {
			break
		}
		rs.end()
		// The resident died before it read the request (killed from
		// inside, say): nothing ran; start another once.
		select {
		case <-rs.dead:
		case <-time.After(waitDelay):
			rs.r.kill(false)
			<-rs.dead
		}
		if try > 0 {
			unix.Close(theirs)
			return providers.ExecResult{}, fmt.Errorf("local: exec: resident: %w", err)
		}
	}
	unix.Close(theirs)
	defer rs.end()
	pipes.closeTheirs()
	closeAll(lf.join)

	copied := pipes.copy(j.stdin, stdout, stderr)
	killLeaf := func() {
		if p.cg != nil {
			for _, d := range p.cg.leafDirs(j.ref, leaf) {
				killCgroup(d)
			}
		}
	}
	stop := make(chan struct{})
	var timedOut bool
	var killMu sync.Mutex
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		var timer <-chan time.Time
		if j.timeout > 0 {
			t := time.NewTimer(j.timeout)
			defer t.Stop()
			timer = t.C
		}
		select {
		case <-stop:
			return
		case <-timer:
			killMu.Lock()
			timedOut = true
			killMu.Unlock()
		case <-ctx.Done():
		case <-rs.dead:
		}
		unix.Shutdown(int(conn.Fd()), unix.SHUT_WR) // the resident kills the command's group
		killLeaf()
		select {
		case <-stop:
		case <-time.After(waitDelay):
			rs.r.kill(false) // the resident does not answer: end the sandbox
		}
	}()
	var rep residentd.Reply
	buf := make([]byte, 512)
	n, rerr := conn.Read(buf)
	if rerr == nil {
		rep, rerr = residentd.ParseReply(buf[:n])
	}
	close(stop)
	<-watchDone
	// What the command left behind dies with it, as with its own pid
	// namespace before: its pipes then close.
	killLeaf()
	select {
	case <-copied:
	case <-time.After(waitDelay):
		pipes.closeOurs()
		<-copied
	}
	killMu.Lock()
	to := timedOut
	killMu.Unlock()

	terminated := rs.r.isTerminated()
	if !terminated {
		if _, err := os.Stat(j.layout.sandbox()); err != nil || ended(j.layout) {
			terminated = true
		}
	}
	to, err = p.cutShort(ctx, j, terminated, to)
	if err != nil {
		return providers.ExecResult{}, err
	}
	var code int
	switch {
	case rerr != nil:
		// The resident died under the exec (killed from inside): the
		// exec was killed with it.
		code = 128 + int(syscall.SIGKILL)
	case rep.Cgroup:
		return providers.ExecResult{}, errors.New("local: exec: cannot join the workspace's cgroup")
	case rep.Chdir:
		_, _ = stderr.Write([]byte("bwrap: Can't chdir to " + j.dir + ": " + rep.Err + "\n"))
		code = 1
	case rep.Err != "":
		f := &execFailure{next: stderr, argv0: j.argv[0]}
		_, _ = f.Write([]byte(f.prefix() + rep.Err + "\n"))
		code = f.end(1, stdout.n == 0)
	default:
		ws := syscall.WaitStatus(rep.Status)
		code = ws.ExitStatus()
		if ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
	}
	return p.execResult(j.ref, code, to, stdout, stderr, lf.oom)
}

// residentPipes are an exec's stdio: the resident's ends (handed over and
// closed) and the broker's.
type residentPipes struct {
	stdinR, stdoutW, stderrW int // theirs; stdinR -1: none
	stdinW, stdoutR, stderrR *os.File
}

// open makes the pipes; the broker's ends are non-blocking (the runtime's
// poller), so that closing them ends a copy.
func (rp *residentPipes) open(stdin bool) error {
	rp.stdinR, rp.stdoutW, rp.stderrW = -1, -1, -1
	mk := func(ours int) (theirs int, f *os.File, err error) {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			return -1, nil, os.NewSyscallError("pipe2", err)
		}
		o := p[ours]
		unix.SetNonblock(o, true)
		return p[1-ours], os.NewFile(uintptr(o), "|"), nil
	}
	var err error
	if stdin {
		if rp.stdinR, rp.stdinW, err = mk(1); err != nil {
			return err
		}
	}
	if rp.stdoutW, rp.stdoutR, err = mk(0); err != nil {
		return err
	}
	rp.stderrW, rp.stderrR, err = mk(0)
	return err
}

// copy writes stdin to the command and reads its output into stdout and
// stderr; the channel closes once both streams have ended.
func (rp *residentPipes) copy(stdin []byte, stdout, stderr io.Writer) <-chan struct{} {
	if rp.stdinW != nil {
		go func() {
			rp.stdinW.Write(stdin) // EPIPE: the command did not read it all
			rp.stdinW.Close()
		}()
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, s := range []struct {
		r *os.File
		w io.Writer
	}{{rp.stdoutR, stdout}, {rp.stderrR, stderr}} {
		wg.Go(func() { io.Copy(s.w, s.r) })
	}
	go func() {
		wg.Wait()
		close(done)
	}()
	return done
}

func (rp *residentPipes) closeTheirs() {
	for _, fd := range []*int{&rp.stdinR, &rp.stdoutW, &rp.stderrW} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

func (rp *residentPipes) closeOurs() {
	for _, f := range []*os.File{rp.stdinW, rp.stdoutR, rp.stderrR} {
		if f != nil {
			f.Close()
		}
	}
}

func (rp *residentPipes) close() {
	rp.closeTheirs()
	rp.closeOurs()
}

// isTerminated reports whether a Terminate killed r.
func (r *run) isTerminated() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.terminated
}

// leaveFiles are the tasks files, opened for writing, that the resident's
// forking thread moves to once it has forked an exec (see
// residentd.Request.Leave): the broker's own cgroups, where the resident
// is, when home; else, when one of those cannot be opened, those of ref's
// workspace cgroups that have leaves.
func (p *Provider) leaveFiles(ref string) (files []*os.File, home bool) {
	if !p.cg.joinsItself() {
		return nil, false
	}
	if own := p.cg.own; own != nil {
		for _, d := range own {
			f, err := os.OpenFile(filepath.Join(d, "tasks"), os.O_WRONLY, 0)
			if err != nil {
				closeAll(files)
				files = nil
				break
			}
			files = append(files, f)
		}
		if files != nil {
			return files, true
		}
	}
	var out []*os.File
	for _, d := range p.cg.controllers(ref) {
		if p.cg.leafIn(d, ref) {
			if f, err := os.OpenFile(filepath.Join(d, "tasks"), os.O_WRONLY, 0); err == nil {
				out = append(out, f)
			}
		}
	}
	return out, false
}

// leafDirs are the directories of ref's leaf cgroup name.
func (h *cgroupHost) leafDirs(ref, name string) []string {
	var out []string
	for _, d := range h.controllers(ref) {
		if h.leafIn(d, ref) {
			out = append(out, filepath.Join(d, name))
		}
	}
	return out
}
