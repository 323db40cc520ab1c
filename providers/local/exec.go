package local

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
)

// defaultDir is the working directory of a command that names none.
const defaultDir = "/workspace"

// defaultPath is PATH in the sandbox unless the workspace's Env sets it.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// waitDelay bounds how long Exec waits for the output pipes once bwrap has
// exited. The pid namespace dies with bwrap, so the pipes close at once; this
// is a backstop, not a limit a command gets near.
const waitDelay = 5 * time.Second

// Exec runs spec.Argv in a fresh bwrap sandbox over the workspace's
// directories. Returns [providers.ErrSandboxGone] when the workspace does not
// exist, was terminated (also while the command ran), or is past its
// ExpiresAt. See README.md for what is enforced.
func (p *Provider) Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	return p.exec(ctx, sb, spec, false)
}

// helperExecer runs the file helpers of package execfile: an Exec without
// the workspace's env.
type helperExecer struct{ p *Provider }

func (h helperExecer) Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	return h.p.exec(ctx, sb, spec, true)
}

func (p *Provider) exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec, helper bool) (providers.ExecResult, error) {
	w, err := p.open(sb.Ref)
	if err != nil {
		return providers.ExecResult{}, err
	}
	if err := checkSpec(spec); err != nil {
		return providers.ExecResult{}, err
	}
	timeout := spec.Timeout
	if !w.rec.ExpiresAt.IsZero() {
		left := w.rec.ExpiresAt.Sub(p.clock.Now())
		if left <= 0 {
			return providers.ExecResult{}, fmt.Errorf("local: exec: workspace expired: %w", providers.ErrSandboxGone)
		}
		// The hard deadline holds even if the reaper is down.
		if timeout <= 0 || timeout > left {
			timeout = left
		}
	}
	j := job{
		ref:     sb.Ref,
		layout:  w.layout,
		cpus:    p.cpusOf(sb.Ref, w.rec),
		memory:  int64(w.rec.MemoryMiB) << 20,
		env:     w.env,
		dir:     cmp.Or(spec.Dir, defaultDir),
		argv:    spec.Argv,
		stdin:   spec.Stdin,
		timeout: timeout,
		maxOut:  spec.MaxOutputBytes,
		outTo:   spec.Stdout,
		errTo:   spec.Stderr,
		rec:     w.rec,
		uid:     w.rec.UID,
		disk:    p.diskOf(w),
	}
	if helper {
		// The file helpers run with the broker's PATH and nothing of the
		// client's env (no PATH, no LD_PRELOAD into the broker's sh).
		j.env = nil
	} else if len(w.rec.AllowedDomains) > 0 {
		p.ensureEgress(sb.Ref, w)
		j.egress = true
	}
	start := time.Now()
	res, err := p.run(ctx, j)
	if err != nil {
		return providers.ExecResult{}, err
	}
	p.log.Debug("exec finished", sandgate.WorkspaceAttr(sb.Ref),
		"argc", len(spec.Argv), "stdin_bytes", len(spec.Stdin), "exit_code", res.ExitCode,
		"stdout_bytes", res.StdoutBytes, "stderr_bytes", res.StderrBytes,
		"timed_out", res.TimedOut, "duration", time.Since(start))
	return res, nil
}

// checkSpec refuses what cannot be passed to a process: a NUL in argv or
// dir, a relative dir, an empty argv. Messages never carry the values.
func checkSpec(spec providers.ExecSpec) error {
	if len(spec.Argv) == 0 {
		return errors.New("local: exec: empty argv")
	}
	for _, a := range spec.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return errors.New("local: exec: argv holds a NUL byte")
		}
	}
	if spec.Dir != "" && (!path.IsAbs(spec.Dir) || strings.IndexByte(spec.Dir, 0) >= 0) {
		return errors.New("local: exec: dir must be absolute and free of NUL")
	}
	return nil
}

// job is one bwrap run.
type job struct {
	ref     string // "" for New's probe, which no Terminate can reach
	layout  layout
	cpus    []int
	memory  int64 // bytes
	env     map[string]string
	dir     string
	argv    []string
	stdin   []byte
	timeout time.Duration // <= 0: none
	maxOut  int64
	// outTo and errTo, when set, receive the kept output instead of
	// buffers of the provider's own (providers.ExecSpec.Stdout).
	outTo, errTo io.Writer
	// stdinR and stdoutW, when set, replace stdin and the capped stdout:
	// snapshots stream through them.
	stdinR  io.Reader
	stdoutW io.Writer
	// capAdd are capabilities kept in the sandbox's user namespace; only
	// the broker's own tar gets any, and never the workspace's env.
	capAdd []string
	// fsize, when > 0, is RLIMIT_FSIZE: no file written may grow past it
	// (the writer gets SIGXFSZ). Only a snapshot's archive sets it.
	fsize int64
	// cgroups are the cgroup.procs files the step joins before it forks.
	cgroups []string
	// uid is the host uid (and gid) the sandbox's uid 0 maps to; 0 only
	// for a workspace from before unprivileged sandboxes.
	uid int
	// disk is the workspace's image, which the step mounts; "" for a
	// workspace without a disk quota.
	disk string
	// rec is the workspace's record, whose limits recreate its cgroups
	// when they are missing; unused when ref is "".
	rec record
	// egress runs argv below the forwarder, with the workspace's egress
	// socket bound and the proxy variables set (egress.go).
	egress bool
}

// run is one exec in flight, so that Terminate can kill it and wait for it.
type run struct {
	pgid int
	done chan struct{} // closed when the exec's processes are reaped

	mu         sync.Mutex
	exited     bool // bwrap has exited: the pgid may soon be free for reuse
	terminated bool // Terminate killed it
	recorded   bool // recordExec wrote its file; killExecs removes it before killing
}

// kill sends SIGTERM to the run's step, which kills the whole sandbox and
// exits, unless the step has already exited (a reaped pid could name
// someone else's process by then). It reports whether it sent the signal.
func (r *run) kill(byTerminate bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if byTerminate {
		r.terminated = true
	}
	if r.exited {
		return false
	}
	killStep(r.pgid) // ESRCH: it is exiting anyway
	return true
}

// run executes j under bwrap, through the step, and waits for it. It kills the
// sandbox when j.timeout passes or ctx ends.
func (p *Provider) run(ctx context.Context, j job) (providers.ExecResult, error) {
	if err := ctx.Err(); err != nil {
		return providers.ExecResult{}, fmt.Errorf("local: exec: %w", context.Cause(ctx))
	}
	// bwrap reads its options, env values and host paths included, from a
	// pipe: they never appear in a command line on the host or inside the
	// sandbox (its pid 1 is bwrap). Only the command's own argv does.
	argsR, argsW, err := os.Pipe()
	if err != nil {
		return providers.ExecResult{}, fmt.Errorf("local: exec: %w", err)
	}
	defer argsR.Close()
	defer argsW.Close()
	files := []*os.File{argsR}
	filter := p.seccomp // built once, by New
	if filter != nil {
		// The filter is far smaller than a pipe's buffer: write it now.
		secR, secW, err := os.Pipe()
		if err != nil {
			return providers.ExecResult{}, fmt.Errorf("local: exec: %w", err)
		}
		defer secR.Close()
		_, err = secW.Write(filter)
		secW.Close()
		if err != nil {
			return providers.ExecResult{}, fmt.Errorf("local: exec: %w", err)
		}
		files = append(files, secR)
	}

	var leaf string
	if j.ref != "" && p.cg != nil {
		leaf = "e-" + randomHex()
		procs, err := p.leaf(j.ref, j.rec, leaf)
		if err != nil {
			return providers.ExecResult{}, fmt.Errorf("local: exec: cgroup: %w", err)
		}
		// Off the exec's path: the kernel may hold an emptied cgroup for
		// a moment, and removeLeaf waits it out; the exec's result (its
		// OOM kills included) is read before.
		defer func() { go p.cg.removeLeaf(j.ref, leaf) }()
		j.cgroups = procs
	}

	stdout := &cappedBuffer{max: j.maxOut, w: j.outTo}
	stderr := &cappedBuffer{max: j.maxOut, w: j.errTo}
	// The step (step_linux.go) joins the workspace's cgroups, sets the
	// limits, then runs bwrap and outlives neither the broker nor bwrap.
	cmd := exec.Command(selfExe)
	cmd.Args = append([]string{stepName}, p.stepArgs(j, len(files))...)
	cmd.Args = append(cmd.Args, "--", p.bwrap, "--args", "3", "--")
	cmd.Args = append(cmd.Args, sandboxArgv(j)...)
	// bwrap's own environment is visible in the sandbox (/proc/1/environ),
	// and with the workspace's Env it could even load code on the host
	// (LD_PRELOAD): give it none. The sandbox's comes from --setenv.
	cmd.Env = []string{}
	if len(j.stdin) > 0 {
		cmd.Stdin = bytes.NewReader(j.stdin)
	}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if j.stdinR != nil {
		cmd.Stdin = j.stdinR
	}
	if j.stdoutW != nil {
		cmd.Stdout = j.stdoutW
	}
	cmd.ExtraFiles = files // fd 3: options; fd 4: seccomp filter
	cmd.SysProcAttr = sysProcAttr()
	cmd.WaitDelay = waitDelay

	r := &run{done: make(chan struct{})}
	defer close(r.done)
	if err := p.start(j.ref, cmd, j.cpus, r); err != nil {
		return providers.ExecResult{}, err
	}
	defer p.forget(j.ref, r)
	argsR.Close()
	// Written after Start: the options can outgrow a pipe's buffer, and
	// bwrap reads them before anything else. If bwrap dies first, the write
	// fails at once and the error shows in its exit status.
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		argsW.Write(p.bwrapOptions(j, filter != nil))
		argsW.Close()
	}()

	// The killer goroutine exits when the command has exited (stop closes)
	// or after it killed the command.
	stop := make(chan struct{})
	killed := make(chan bool, 1) // true when the timeout killed it
	go func() {
		var timer <-chan time.Time
		if j.timeout > 0 {
			t := time.NewTimer(j.timeout)
			defer t.Stop()
			timer = t.C
		}
		select {
		case <-stop:
			killed <- false
		case <-timer:
			killed <- r.kill(false)
		case <-ctx.Done():
			r.kill(false)
			killed <- false
		}
	}()

	exitErr := waitExited(cmd.Process.Pid)
	if exitErr != nil {
		// Not reaped yet, so the step is still ours to kill; without
		// this, nothing would enforce the timeout.
		killStep(r.pgid)
	}
	r.mu.Lock()
	r.exited = true
	r.mu.Unlock()
	close(stop)
	timedOut := <-killed
	waitErr := cmd.Wait()
	<-wrote
	if exitErr != nil {
		return providers.ExecResult{}, fmt.Errorf("local: exec: wait: %w", exitErr)
	}

	r.mu.Lock()
	terminated := r.terminated
	r.mu.Unlock()
	if !terminated && j.ref != "" {
		// Another broker process may have terminated the workspace under
		// us: it removes our record before killing us, and the workspace
		// after that; the supervisor marks it ended at expires_at.
		if _, err := os.Stat(j.layout.sandbox()); err != nil || ended(j.layout) {
			terminated = true
		} else if _, err := os.Stat(filepath.Join(j.layout.execs(), strconv.Itoa(r.pgid))); r.recorded && errors.Is(err, fs.ErrNotExist) {
			terminated = true
		}
	}
	switch {
	case terminated:
		return providers.ExecResult{}, fmt.Errorf("local: exec: terminated while running: %w", providers.ErrSandboxGone)
	case ctx.Err() != nil:
		return providers.ExecResult{}, fmt.Errorf("local: exec: %w", context.Cause(ctx))
	}
	var ee *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &ee) && !errors.Is(waitErr, exec.ErrWaitDelay) {
		return providers.ExecResult{}, fmt.Errorf("local: exec: %w", waitErr)
	}
	if err := cmp.Or(stdout.err, stderr.err); err != nil {
		return providers.ExecResult{}, fmt.Errorf("local: exec: output: %w", err)
	}

	res := providers.ExecResult{
		ExitCode:        exitCode(cmd.ProcessState),
		Stdout:          stdout.buf,
		Stderr:          stderr.buf,
		StdoutBytes:     stdout.n,
		StderrBytes:     stderr.n,
		StdoutTruncated: stdout.truncated(),
		StderrTruncated: stderr.truncated(),
		TimedOut:        timedOut,
	}
	if timedOut {
		res.ExitCode = 128 + int(syscall.SIGKILL)
	}
	if leaf != "" && p.cg.oomKills(j.ref, leaf) > 0 {
		// The workspace's memory ran out and the kernel killed a process
		// of this exec: report it as the kill it was (protocol notes:
		// 128+9), whatever the command made of it.
		res.ExitCode = 128 + int(syscall.SIGKILL)
		p.log.Info("exec oom killed", sandgate.WorkspaceAttr(j.ref))
	}
	return res, nil
}

// start starts cmd pinned to cpus, with no descriptor of the broker but
// its own, and records r as a run of ref. It holds p.mu across the liveness
// check and Start, so a concurrent Terminate either sees the run and kills
// it or has already made ref gone.
func (p *Provider) start(ref string, cmd *exec.Cmd, cpus []int, r *run) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ref != "" {
		if p.terminating[ref] > 0 {
			return fmt.Errorf("local: exec: %w", providers.ErrSandboxGone)
		}
		if _, err := os.Stat(p.layout(ref).sandbox()); err != nil {
			return fmt.Errorf("local: exec: %w", providers.ErrSandboxGone)
		}
	}
	if err := closeOnExec(); err != nil {
		return fmt.Errorf("local: exec: %w", scrub(err))
	}
	if err := startPinned(cmd, cpus); err != nil {
		return fmt.Errorf("local: exec: start: %w", scrub(err))
	}
	r.pgid = cmd.Process.Pid
	if ref != "" {
		if p.runs[ref] == nil {
			p.runs[ref] = make(map[*run]struct{})
		}
		p.runs[ref][r] = struct{}{}
		r.recorded = recordExec(p.layout(ref), r.pgid)
	}
	return nil
}

// recordExec leaves a file naming the exec's process group and start time
// in the workspace, for killExecs. Best effort: without it only this
// process's Terminate can kill the exec.
func recordExec(l layout, pgid int) bool {
	start, err := procStart(pgid)
	if err != nil {
		return false
	}
	if err := os.MkdirAll(l.execs(), 0o700); err != nil {
		return false
	}
	return os.WriteFile(filepath.Join(l.execs(), strconv.Itoa(pgid)), []byte(strconv.FormatUint(start, 10)), 0o600) == nil
}

// liveExecs returns the process groups of the execs recorded in the
// workspace whose process still has its recorded start time, so that a
// reused pid is never signalled.
func liveExecs(l layout) []int {
	entries, _ := os.ReadDir(l.execs())
	var out []int
	for _, e := range entries {
		pgid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(l.execs(), e.Name()))
		if err != nil {
			continue
		}
		want, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if got, err := procStart(pgid); err == nil && got == want {
			out = append(out, pgid)
		}
	}
	return out
}

// killExecs kills every exec recorded in the workspace whose process still
// has its recorded start time (liveExecs), and waits until they are gone
// or ctx ends. It returns how many it killed.
func killExecs(ctx context.Context, l layout) (int, error) {
	var killed []int
	for _, pgid := range liveExecs(l) {
		// Removing the record first tells the exec's own process that a
		// Terminate killed it (run checks for its record once bwrap exits).
		if os.Remove(filepath.Join(l.execs(), strconv.Itoa(pgid))) != nil {
			continue
		}
		if killStep(pgid) == nil {
			killed = append(killed, pgid)
		}
	}
	for _, pgid := range killed {
		for {
			if _, err := procStart(pgid); err != nil {
				break
			}
			select {
			case <-ctx.Done():
				return len(killed), context.Cause(ctx)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return len(killed), nil
}

// forget drops r from the runs of ref.
func (p *Provider) forget(ref string, r *run) {
	if ref != "" {
		_ = os.Remove(filepath.Join(p.layout(ref).execs(), strconv.Itoa(r.pgid)))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.runs[ref], r)
	if len(p.runs[ref]) == 0 {
		delete(p.runs, ref)
	}
}

// stepArgs are the step's options for j, with nfds descriptors past stderr.
func (p *Provider) stepArgs(j job, nfds int) []string {
	a := []string{"--fds", strconv.Itoa(nfds)}
	a = append(a, rlimitArgs(j)...)
	for _, f := range j.cgroups {
		a = append(a, "--cgroup", f)
	}
	if j.uid > 0 {
		u := strconv.Itoa(j.uid)
		a = append(a, "--uid", u, "--gid", u)
	}
	if j.uid > 0 || j.disk != "" {
		a = append(a, "--stage", p.stageDir, "--bind", p.etcDir, "e")
		if j.disk != "" {
			mount := "/usr/bin/mount"
			if p.disk != nil {
				mount = p.disk.mount
			}
			a = append(a, "--disk", j.disk, "--mount-bin", mount)
		} else {
			a = append(a,
				"--bind", j.layout.workspace(), "w",
				"--bind", j.layout.home(), "h",
				"--bind", j.layout.tmp(), "t")
		}
		if j.egress {
			a = append(a, "--bind", j.layout.egress(), "g", "--bind", p.exe, "x")
		}
	}
	return a
}

// rlimitArgs are the step's --rlimit options: the limits, soft and hard,
// that the step sets on itself just before it starts bwrap, so that bwrap
// and everything in the sandbox inherit them; see README.md for why
// RLIMIT_DATA and not RLIMIT_AS.
func rlimitArgs(j job) []string {
	args := []string{
		"--rlimit", "data=" + strconv.FormatInt(j.memory, 10),
		"--rlimit", "core=0", // no core files written where a host helper might read them
	}
	if j.fsize > 0 {
		args = append(args, "--rlimit", "fsize="+strconv.FormatInt(j.fsize, 10))
	}
	return args
}

// bwrapOptions returns bwrap's options, each NUL-terminated, for --args.
func (p *Provider) bwrapOptions(j job, seccomp bool) []byte {
	// src is where bwrap finds a host directory: below the step's stage
	// when the step stages them (see stepArgs).
	src := func(name, host string) string {
		switch {
		case j.disk != "" && (name == "w" || name == "h" || name == "t"):
			return p.stageDir + "/d/" + map[string]string{"w": "workspace", "h": "home", "t": "tmp"}[name]
		case j.uid > 0 || j.disk != "":
			return p.stageDir + "/" + name
		}
		return host
	}
	o := []string{
		"--unshare-all", // mount, pid, ipc, uts, net, cgroup
		"--unshare-user", "--uid", "0", "--gid", "0",
		"--cap-drop", "ALL",
	}
	if !seccomp {
		// No nested user namespaces: less kernel surface. The seccomp
		// filter does that where there is one, without a nested namespace.
		o = append(o, "--disable-userns")
	}
	for _, c := range slices.Concat(p.caps, j.capAdd) {
		o = append(o, "--cap-add", c)
	}
	o = append(o,
		"--die-with-parent",
		"--new-session",
		"--hostname", hostname,
		"--ro-bind", "/usr", "/usr",
	)
	for _, l := range p.usrLinks {
		if l.target != "" {
			o = append(o, "--symlink", l.target, l.name)
		} else {
			o = append(o, "--ro-bind", l.name, l.name)
		}
	}
	o = append(o,
		"--proc", "/proc",
		"--dev", "/dev",
		// /dev/shm is memory: bound it like the rest of memory.
		"--size", strconv.FormatInt(j.memory, 10), "--tmpfs", "/dev/shm",
		"--ro-bind", src("e", p.etcDir), "/etc",
		"--bind", src("w", j.layout.workspace()), defaultDir,
		"--bind", src("h", j.layout.home()), "/root",
		"--bind", src("t", j.layout.tmp()), "/tmp",
	)
	if j.egress {
		// Before / is read-only: bwrap makes the mount points there.
		o = append(o,
			"--ro-bind", src("x", p.exe), forwardBin,
			"--ro-bind", src("g", j.layout.egress()), egressMount)
	}
	o = append(o,
		// The root and /dev are tmpfs, that is memory: make them read-only.
		"--remount-ro", "/dev",
		"--remount-ro", "/",
		"--clearenv",
		"--setenv", "PATH", defaultPath,
		"--setenv", "HOME", "/root",
	)
	for _, k := range slices.Sorted(maps.Keys(j.env)) {
		o = append(o, "--setenv", k, j.env[k])
	}
	if j.egress {
		for _, kv := range proxyEnv {
			o = append(o, "--setenv", kv[0], kv[1])
		}
	}
	o = append(o, "--chdir", j.dir)
	if seccomp {
		o = append(o, "--seccomp", "4")
	}
	var b []byte
	for _, s := range o {
		b = append(b, s...)
		b = append(b, 0)
	}
	return b
}

// exitCode is the process's exit status, or 128+n when signal n killed it.
// bwrap already folds a signal that killed the command into its own exit
// status; the signal case here is bwrap itself being killed.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// cappedBuffer keeps the first max bytes written to it and counts the rest,
// so memory stays bounded whatever a command writes. The zero max keeps
// nothing. With w set it passes the kept bytes on to w and holds none
// itself; otherwise it keeps them in buf, which never grows past max.
type cappedBuffer struct {
	max  int64
	w    io.Writer
	buf  []byte
	kept int64
	n    int64 // bytes written, kept or not
	err  error // w's first error; nothing more is passed on after it
}

// minGrow is the first capacity of a cappedBuffer's buf.
const minGrow = 64 << 10

func (c *cappedBuffer) Write(b []byte) (int, error) {
	c.n += int64(len(b))
	room := c.max - c.kept
	if room <= 0 || c.err != nil {
		return len(b), nil // keep draining the pipe: the command must not block
	}
	k := b[:min(room, int64(len(b)))]
	c.kept += int64(len(k))
	if c.w != nil {
		_, c.err = c.w.Write(k)
		return len(b), nil
	}
	if need := len(c.buf) + len(k); need > cap(c.buf) {
		// Grow geometrically but never past max, so a capped stream holds
		// at most max bytes (append would round up past it).
		nb := make([]byte, len(c.buf), min(max(2*cap(c.buf), minGrow, need), int(c.max)))
		copy(nb, c.buf)
		c.buf = nb
	}
	c.buf = append(c.buf, k...)
	return len(b), nil
}

func (c *cappedBuffer) truncated() bool { return c.n > c.kept }
