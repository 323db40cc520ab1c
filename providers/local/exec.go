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
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local/internal/residentd"
	"github.com/sandgate/sandgate/providers/local/internal/step"
)

// defaultDir is the working directory of a command that names none.
const defaultDir = "/workspace"

// defaultPath is PATH in the sandbox unless the workspace's Env sets it.
const defaultPath = residentd.DefaultPath

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
	defer p.quiet.enter()()
	w, err := p.open(sb.Ref)
	if err != nil {
		if errors.Is(err, providers.ErrSandboxGone) {
			p.ns.drop(sb.Ref) // ended by another broker process, or its supervisor
			p.opens.drop(sb.Ref)
		}
		return providers.ExecResult{}, err
	}
	if err := checkSpec(spec); err != nil {
		return providers.ExecResult{}, err
	}
	timeout := spec.Timeout
	var expiry time.Time
	if !w.rec.ExpiresAt.IsZero() {
		left := w.rec.ExpiresAt.Sub(p.clock.Now())
		if left <= 0 {
			return providers.ExecResult{}, fmt.Errorf("local: exec: workspace expired: %w", providers.ErrSandboxGone)
		}
		// The hard deadline holds even if the reaper is down.
		if timeout <= 0 || timeout > left {
			timeout, expiry = left, w.rec.ExpiresAt
		}
	}
	j := p.jobIn(sb.Ref, w)
	j.env = imageEnv(w)
	j.dir = cmp.Or(spec.Dir, imageDir(w))
	j.argv = spec.Argv
	j.stdin = spec.Stdin
	j.timeout, j.expiry = timeout, expiry
	j.maxOut = spec.MaxOutputBytes
	j.outTo, j.errTo = spec.Stdout, spec.Stderr
	// Staged even for a file helper, which binds none of it: one mount
	// namespace serves all of the workspace's execs.
	j.stageEgress = len(w.rec.AllowedDomains) > 0
	if helper {
		// The file helpers run with the broker's PATH and nothing of the
		// client's env (no PATH, no LD_PRELOAD into the broker's sh).
		j.env = nil
	} else if len(w.rec.AllowedDomains) > 0 {
		p.ensureEgress(sb.Ref, w)
		j.egress = true
	}
	start := time.Now()
	var res providers.ExecResult
	if p.useResident(j) {
		res, err = p.execResident(ctx, w, j)
	} else {
		res, err = p.run(ctx, j)
	}
	if err != nil {
		return providers.ExecResult{}, err
	}
	p.log.Debug("exec finished", sandgate.WorkspaceAttr(sb.Ref),
		"argc", len(spec.Argv), "stdin_bytes", len(spec.Stdin), "exit_code", res.ExitCode,
		"stdout_bytes", res.StdoutBytes, "stderr_bytes", res.StderrBytes,
		"timed_out", res.TimedOut, "duration", time.Since(start))
	return res, nil
}

// checkSpec refuses what cannot be passed to a process
// (providers.ExecSpec.Check).
func checkSpec(spec providers.ExecSpec) error {
	if err := spec.Check(); err != nil {
		return fmt.Errorf("local: exec: %w", err)
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
	// expiry is the workspace's expires_at when it cut timeout short
	// (zero otherwise): an exec still running then timed out, whoever
	// ended the workspace at that moment.
	expiry time.Time
	maxOut int64
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
	// cgroups are the cgroup.procs files bwrap (a durable command: its step)
	// joins before it forks anything.
	cgroups []string
	// uid is the host uid (and gid) the sandbox's uid 0 maps to; 0 only
	// for a workspace from before unprivileged sandboxes.
	uid int
	// disk is the workspace's image, which stage mounts; "" for a
	// workspace without a disk quota.
	disk string
	// rec is the workspace's record, whose limits recreate its cgroups
	// when they are missing; unused when ref is "".
	rec record
	// egress runs argv below the forwarder, with the workspace's egress
	// socket bound and the proxy variables set (egress.go).
	egress bool
	// stageEgress stages the egress socket's directory and the forwarder
	// (see stageOptions) even when egress is false.
	stageEgress bool
	// stageExe stages the broker's binary for the workspace's resident,
	// for every job of the workspace, so that they share one mount
	// namespace; bindExe binds it at residentBin: the job is the
	// resident (resident.go).
	stageExe, bindExe bool
	// perCommandData gives bwrap residentData as RLIMIT_DATA when that is
	// more than the workspace's memory: the resident (a Go runtime that
	// must not live under a tenant's limit) sets the workspace's on each
	// command it starts (internal/residentd).
	perCommandData bool
	// hostTools runs the job on the host's /usr and generated /etc even
	// when its workspace runs on an image, in a mount namespace of its
	// own: the snapshot helpers, whose GNU tar and gzip an image need not
	// have. They reach only /workspace, /root and /tmp, which are the
	// same on either root.
	hostTools bool
}

// run is one exec in flight, so that Terminate can kill it and wait for it.
type run struct {
	pgid     int
	done     chan struct{} // closed when the exec's processes are reaped
	resident bool          // a workspace's resident (resident.go), not an exec

	mu         sync.Mutex
	killEarly  bool // killed before bwrap started: start kills it
	exited     bool // bwrap has exited: the pgid may soon be free for reuse
	terminated bool // Terminate killed it
	timedOut   bool // the exec's timeout killed it (watch)
}

// kill SIGKILLs the run's bwrap, and with it the whole sandbox, unless
// bwrap has already exited (a reaped pid could name someone else's process
// by then). It reports whether it sent the signal.
func (r *run) kill(byTerminate bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if byTerminate {
		r.terminated = true
	}
	if r.exited {
		return false
	}
	if r.pgid == 0 {
		// Not started yet (a resident: resident.go); kill(0) would be
		// the broker's own process group.
		r.killEarly = true
		return false
	}
	killExec(r.pgid) // ESRCH: it is exiting anyway
	return true
}

// timeOut is kill for the exec's timeout: the exec timed out if it was
// still running.
func (r *run) timeOut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.exited && r.pgid != 0 {
		r.timedOut = true
		killExec(r.pgid) // ESRCH: it is exiting anyway
	}
}

// run executes j under bwrap and waits for it. It kills the sandbox when
// j.timeout passes or ctx ends.
func (p *Provider) run(ctx context.Context, j job) (providers.ExecResult, error) {
	if err := ctx.Err(); err != nil {
		return providers.ExecResult{}, fmt.Errorf("local: exec: %w", context.Cause(ctx))
	}
	// bwrap reads its options, env values and host paths included, from a
	// pipe: they never appear in a command line on the host or inside the
	// sandbox (its pid 1 is bwrap). Only the command's own argv does.
	argsR, argsW, err := blockingPipe()
	if err != nil {
		return providers.ExecResult{}, fmt.Errorf("local: exec: %w", err)
	}
	defer argsR.Close()
	defer argsW.Close()
	files := []*os.File{argsR}
	filter := p.seccomp // built once, by New
	if filter != nil {
		// The filter is far smaller than a pipe's buffer: write it now.
		secR, secW, err := blockingPipe()
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

	// The exec's leaf cgroups are made, and their files opened, beside
	// bwrap's start: launchBwrap waits for them before it confines bwrap.
	leaves := make(chan leafFiles, 1)
	var leaf string
	if j.ref != "" && p.cg != nil {
		leaf = "e-" + randomHex()
		made := make(chan struct{})
		go func() {
			defer close(made)
			leaves <- p.openLeaf(j.ref, j.rec, leaf)
		}()
		// Off the exec's path: the kernel may hold an emptied cgroup for
		// a moment, and removeLeaf waits it out; the exec's result (its
		// OOM kills included) is read before.
		defer func() {
			go func() {
				<-made
				p.cg.removeLeaf(j.ref, leaf)
			}()
		}()
	} else {
		leaves <- leafFiles{}
	}

	stdout := &cappedBuffer{max: j.maxOut, w: j.outTo}
	stderr := &cappedBuffer{max: j.maxOut, w: j.errTo}
	// bwrap is started directly, from a thread of its own (launchBwrap), as the
	// first process of a pid namespace of its own: nothing it starts can
	// outlive it, and it dies with the broker (see README.md, "No exec
	// outlives its broker").
	cmd := exec.Command(p.bwrap)
	cmd.Args = append([]string{p.bwrap, "--args", "3", "--"}, sandboxArgv(j)...)
	// bwrap's own environment is visible in the sandbox (/proc/1/environ),
	// and with the workspace's Env it could even load code on the host
	// (LD_PRELOAD): give it none. The sandbox's comes from --setenv.
	cmd.Env = []string{}
	if len(j.stdin) > 0 {
		cmd.Stdin = bytes.NewReader(j.stdin)
	}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	var failed *execFailure // bwrap's line when it cannot execute the command
	if !j.egress {
		failed = &execFailure{next: stderr, argv0: j.argv[0]}
		cmd.Stderr = failed
	}
	if j.stdinR != nil {
		cmd.Stdin = j.stdinR
	}
	if j.stdoutW != nil {
		cmd.Stdout = j.stdoutW
	}
	cmd.ExtraFiles = files // fd 3: options; fd 4: seccomp filter
	cmd.SysProcAttr = sandboxProcAttr(j.uid)
	cmd.WaitDelay = waitDelay

	r := &run{done: make(chan struct{})}
	defer close(r.done) // after release: a Terminate waiting for it then finds the namespace unused
	var ns *os.File
	var rooted bool
	if o, ok := p.stageOptions(j); ok {
		nsRef := j.ref
		if p.rootTrees {
			rj := j
			if j.hostTools && j.rec.Image != nil {
				rj.rec.Image = nil
				nsRef = "" // not the workspace's namespace: one of its own, closed by release
			}
			o = p.rootOptions(rj, o)
			rooted = true
		}
		fd, release, err := p.ns.acquire(nsRef, o)
		if err != nil {
			go func() { (<-leaves).close() }() // never handed to bwrap
			return providers.ExecResult{}, fmt.Errorf("local: exec: %w", err)
		}
		defer release()
		ns = fd
	}
	// bwrap reads its options before it does anything else and forks
	// nothing before it has them: the launching thread writes them once
	// bwrap is in the exec's cgroups, on its CPUs and under its limits, so
	// everything of the sandbox is too.
	l := launch{cmd: cmd, r: r, ns: ns, leaves: leaves, argsR: argsR, argsW: argsW, opts: p.bwrapOptions(j, filter != nil, rooted), ctx: ctx, timeout: j.timeout}
	exited := p.launchBwrap(j, l)
	end := <-exited
	if end.oom != nil {
		defer end.oom.Close()
	}
	switch {
	case !end.started:
		return providers.ExecResult{}, end.startErr
	case end.startErr != nil:
		p.forget(j.ref, r)
		return providers.ExecResult{}, fmt.Errorf("local: exec: %w", end.startErr)
	}
	defer p.forget(j.ref, r)
	timedOut := end.timedOut
	if end.exitErr != nil {
		return providers.ExecResult{}, fmt.Errorf("local: exec: wait: %w", end.exitErr)
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
		} else if _, err := os.Stat(filepath.Join(j.layout.execs(), strconv.Itoa(r.pgid))); end.recorded && errors.Is(err, fs.ErrNotExist) {
			terminated = true
		}
	}
	if timedOut, err = p.cutShort(ctx, j, terminated, timedOut); err != nil {
		return providers.ExecResult{}, err
	}
	var ee *exec.ExitError
	if end.waitErr != nil && !errors.As(end.waitErr, &ee) && !errors.Is(end.waitErr, exec.ErrWaitDelay) {
		return providers.ExecResult{}, fmt.Errorf("local: exec: %w", end.waitErr)
	}
	code := exitCode(cmd.ProcessState)
	if failed != nil {
		code = failed.end(code, stdout.n == 0)
	}
	return p.execResult(j.ref, code, timedOut, stdout, stderr, end.oom)
}

// cutShort is the end of an exec that its workspace's end (terminated)
// or ctx cut short: an error, or timedOut, updated, for an exec that ran
// into the deadline that cut its timeout.
func (p *Provider) cutShort(ctx context.Context, j job, terminated, timedOut bool) (bool, error) {
	if terminated && !j.expiry.IsZero() && !p.clock.Now().Before(j.expiry) {
		// The supervisor (or a reaper's Terminate) ending the workspace
		// then raced its own timer, and the answer is the same either way.
		return true, nil
	}
	switch {
	case terminated:
		return timedOut, fmt.Errorf("local: exec: terminated while running: %w", providers.ErrSandboxGone)
	case ctx.Err() != nil:
		return timedOut, fmt.Errorf("local: exec: %w", context.Cause(ctx))
	}
	return timedOut, nil
}

// execResult is the result of an exec of ref that exited with code, from
// its output and its leaf's OOM kill count (oom; nil: none).
func (p *Provider) execResult(ref string, code int, timedOut bool, stdout, stderr *cappedBuffer, oom *os.File) (providers.ExecResult, error) {
	if err := cmp.Or(stdout.err, stderr.err); err != nil {
		return providers.ExecResult{}, fmt.Errorf("local: exec: output: %w", err)
	}
	res := providers.ExecResult{
		ExitCode:        code,
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
	if oom != nil && oomKills(oom) > 0 {
		// The workspace's memory ran out and the kernel killed a process
		// of this exec: report it as the kill it was (protocol notes:
		// 128+9), whatever the command made of it.
		res.ExitCode = 128 + int(syscall.SIGKILL)
		p.log.Info("exec oom killed", sandgate.WorkspaceAttr(ref))
	}
	return res, nil
}

// start starts cmd with no descriptor of the broker but its own, after
// the calling thread, which must be locked and never given back, joined
// ns (nil: none), and records r as a run of ref. The liveness check and
// the record are one step under p.mu, before the fork, so a concurrent
// Terminate either has made ref gone or finds r and kills it: marked
// before bwrap exists (run.kill), r is killed here as soon as it does,
// before it has its options. The fork itself runs without p.mu, which
// every take, exec and Terminate also needs: a bwrap's fork and exec,
// about a millisecond, would otherwise hold up all of them (the pool's
// refill starts one for every workspace it makes). The check runs before
// the thread joins ns, which holds little of the host's file systems
// (trimMounts).
func (p *Provider) start(ref string, ns *os.File, cmd *exec.Cmd, r *run) error {
	if ref != "" {
		p.mu.Lock()
		err := p.mayStartLocked(ref)
		if err == nil {
			if p.runs[ref] == nil {
				p.runs[ref] = make(map[*run]struct{})
			}
			p.runs[ref][r] = struct{}{}
		}
		p.mu.Unlock()
		if err != nil {
			return err
		}
	}
	err := func() error {
		if ns != nil {
			if err := step.JoinNS(ns); err != nil {
				return fmt.Errorf("local: exec: %w", err)
			}
		}
		if err := closeOnExec(); err != nil {
			return fmt.Errorf("local: exec: %w", scrub(err))
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("local: exec: start: %w", scrub(err))
		}
		return nil
	}()
	if err != nil {
		if ref != "" {
			p.mu.Lock()
			p.forgetLocked(p.refOfRun(ref, r), r)
			p.mu.Unlock()
		}
		return err
	}
	r.mu.Lock()
	r.pgid = cmd.Process.Pid
	if r.killEarly {
		killExec(r.pgid) // it has no options yet, and dies before it runs anything
	}
	r.mu.Unlock()
	return nil
}

// refOfRun is the ref r is a run of: ref, unless a take moved it meanwhile
// (adoptPooled); p.mu is held.
func (p *Provider) refOfRun(ref string, r *run) string {
	if _, ok := p.runs[ref][r]; ok {
		return ref
	}
	for other, runs := range p.runs {
		if _, ok := runs[r]; ok {
			return other
		}
	}
	return ref
}

// mayStartLocked reports why nothing may start in ref now (it is being
// terminated, or gone); p.mu is held.
func (p *Provider) mayStartLocked(ref string) error {
	if p.terminating[ref] > 0 {
		return fmt.Errorf("local: exec: %w", providers.ErrSandboxGone)
	}
	if _, err := os.Stat(p.readyFile(ref)); err != nil {
		return fmt.Errorf("local: exec: %w", providers.ErrSandboxGone)
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
	// Not MkdirAll: a record written after a Terminate moved the
	// workspace's directory away must not make the directory again.
	if err := os.Mkdir(l.execs(), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
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
		if killExec(pgid) == nil {
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

// forget drops r from the runs of ref, and its record (recordExec) off the
// exec's path: bwrap is reaped by now, and a record whose process is gone
// names no live exec (liveExecs).
func (p *Provider) forget(ref string, r *run) {
	if ref != "" {
		go os.Remove(filepath.Join(p.layout(ref).execs(), strconv.Itoa(r.pgid)))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.forgetLocked(ref, r)
}

// forgetLocked drops r from the runs of ref; p.mu is held.
func (p *Provider) forgetLocked(ref string, r *run) {
	delete(p.runs[ref], r)
	if len(p.runs[ref]) == 0 {
		delete(p.runs, ref)
	}
}

// stepArgs are a durable command's step's options for j, with nfds
// descriptors past stderr.
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
	if o, ok := p.stageOptions(j); ok {
		a = append(a, "--stage", o.Dir)
		for _, b := range o.Binds {
			a = append(a, "--bind", b[0], b[1])
		}
		if o.Disk != "" {
			a = append(a, "--disk", o.Disk, "--mount-bin", o.MountBin)
		}
	}
	return a
}

// nsStepArgs are the options of a durable command's step for j that joins
// the workspace's mount namespace, descriptor nsFD, with nfds descriptors
// for bwrap past stderr (below nsFD). Its cgroups the runner joined.
func (p *Provider) nsStepArgs(j job, nfds, nsFD int) []string {
	a := []string{"--fds", strconv.Itoa(nfds), "--ns-fd", strconv.Itoa(nsFD)}
	a = append(a, rlimitArgs(j)...)
	if j.uid > 0 {
		u := strconv.Itoa(j.uid)
		a = append(a, "--uid", u, "--gid", u)
	}
	return a
}

// stageOptions are what stage does for j: the directories bwrap, running
// as the workspace's uid, finds below the stage directory. ok is false when
// nothing is staged (a workspace from before uids and disk images, which
// bwrap reaches at its host paths as the broker's uid).
func (p *Provider) stageOptions(j job) (o stepOptions, ok bool) {
	if j.uid <= 0 && j.disk == "" {
		return stepOptions{}, false
	}
	o = stepOptions{Stage: step.Stage{Dir: p.stageDir, Binds: [][2]string{{p.etcDir, "e"}}}}
	if j.disk != "" {
		o.Disk, o.MountBin, o.DiskOwner = j.disk, "/usr/bin/mount", max(j.uid, 0)
		if p.disk != nil {
			o.MountBin = p.disk.mount
		}
	} else {
		o.Binds = append(o.Binds,
			[2]string{j.layout.workspace(), "w"},
			[2]string{j.layout.home(), "h"},
			[2]string{j.layout.tmp(), "t"})
	}
	if j.egress || j.stageEgress {
		o.Binds = append(o.Binds, [2]string{j.layout.egress(), "g"}, [2]string{p.exe, "x"})
	} else if j.stageExe {
		o.Binds = append(o.Binds, [2]string{p.exe, "x"})
	}
	return o, true
}

// launch is what launchBwrap needs to start an exec's bwrap.
type launch struct {
	cmd *exec.Cmd
	r   *run
	// ns is the workspace's mount namespace; nil: none, bwrap then stays
	// in the broker's.
	ns *os.File
	// leaves yields the exec's cgroups, opened (openLeaf).
	leaves <-chan leafFiles
	// argsR is bwrap's end of the options' pipe (its fd 3), argsW ours;
	// opts are the options to write once bwrap is confined.
	argsR, argsW *os.File
	opts         []byte
	// ctx and timeout end the exec early: bwrap is killed when ctx ends
	// or timeout (<= 0: none) passes (watch).
	ctx     context.Context
	timeout time.Duration
	// closeStarted are closed once bwrap has started (or failed to):
	// descriptors only bwrap keeps.
	closeStarted []*os.File
	// last are bwrap's last descriptors, past those of the sh that joins
	// the cgroups (joinAsStarted), which reads no descriptor above 9.
	last []*os.File
	// started, when set, is closed once bwrap has started, or failed to.
	started chan struct{}
}

// bwrapEnd is how an exec's bwrap ended, from launchBwrap.
type bwrapEnd struct {
	// started is false when bwrap could not be started; startErr is why,
	// or why it could not be confined (the launching thread killed it
	// before it had its options).
	started  bool
	startErr error
	timedOut bool     // the timeout killed it
	exitErr  error    // waitExited's: bwrap's exit could not be waited for
	waitErr  error    // exec.Cmd.Wait's
	recorded bool     // recordExec wrote the exec's record
	oom      *os.File // the exec's OOM kill count (leafFiles.oom); nil: none
}

// launchBwrap starts l.cmd (bwrap) for j from an OS thread of its own, which
// joins l.ns, the workspace's mount namespace, records l.r as a run of
// j.ref (and the exec in the workspace, recordExec), confines bwrap in the
// exec's leaf cgroups once l.leaves has them (confine), writes bwrap its
// options, watches the exec's context and timeout (watch), waits for bwrap
// to exit, and reaps it. The thread lives until bwrap has exited, since
// bwrap's parent-death signal follows the thread that forked it, and then
// ends with its goroutine: it is never unlocked, so no other goroutine
// ever runs in a namespace of a workspace. Doing all of it on the one
// thread spares the exec hand-offs between threads while it starts and
// ends. The channel yields how bwrap ended.
func (p *Provider) launchBwrap(j job, l launch) <-chan bwrapEnd {
	exited := make(chan bwrapEnd, 1)
	cmd, r := l.cmd, l.r
	onSpareThread(func() {
		// Where this thread runs on one of the exec's CPUs already, bwrap
		// is born on them, which spares it a move once it runs.
		unpin := pinHere(j.cpus)
		// The leaves before the start: on v1 bwrap joins them as it
		// starts (joinAsStarted).
		lf := <-l.leaves
		var joinStatus, joinStatusW *os.File
		err := lf.err
		if err == nil && lf.self {
			joinStatus, joinStatusW, err = joinAsStarted(cmd, lf.join)
		}
		// After the sh's descriptors, which must stay below 10 for it.
		cmd.ExtraFiles = append(cmd.ExtraFiles, l.last...)
		if err != nil {
			err = fmt.Errorf("local: exec: %w", err)
		} else {
			err = p.start(j.ref, l.ns, cmd, r)
		}
		if l.started != nil {
			close(l.started)
		}
		closeAll(l.closeStarted)
		if unpin != nil {
			unpin()
		}
		if err != nil {
			lf.close()
			if joinStatus != nil {
				joinStatus.Close()
				joinStatusW.Close()
			}
			exited <- bwrapEnd{startErr: err}
			return
		}
		l.argsR.Close()
		if joinStatusW != nil {
			joinStatusW.Close() // the child's is the only write end left
		}
		pid := cmd.Process.Pid
		// The record, for another broker process's Terminate and the
		// supervisor, is written beside the exec rather than before it:
		// both mark the workspace ended before they list the records, so
		// an exec recorded too late for them sees the mark and kills
		// itself. (bwrap is not reaped before this is done: its pid is
		// still its own.)
		recorded := make(chan bool, 1)
		go func() {
			ok := j.ref != "" && recordExec(j.layout, pid)
			if ok && ended(j.layout) {
				r.kill(false)
			}
			recorded <- ok
		}()
		var procs []*os.File // none when bwrap joins them itself
		if !lf.self {
			procs = lf.join
		}
		e := bwrapEnd{started: true, startErr: confine(pid, j, procs, unpin != nil)}
		closeAll(lf.join)
		stop := make(chan struct{})
		if e.startErr != nil {
			// bwrap has no options yet, and never gets any.
			r.kill(false)
			if lf.oom != nil {
				lf.oom.Close()
			}
		} else {
			e.oom = lf.oom
			// The timeout and ctx hold from here, the options' write
			// included. If bwrap dies first, the write fails at once and
			// the error shows in its exit status. Options that outgrow the
			// pipe's buffer block this thread until bwrap has read them.
			go watch(l.ctx, l.timeout, r, stop)
			l.argsW.Write(l.opts)
			l.argsW.Close()
		}
		e.exitErr = waitExited(pid)
		if joinStatus != nil {
			// Written only when a join failed, and then sh exited
			// instead of becoming bwrap; closed otherwise, at its exec.
			var b [1]byte
			if n, _ := joinStatus.Read(b[:]); n > 0 && e.startErr == nil {
				e.startErr = errors.New("cannot join the workspace's cgroup")
			}
			joinStatus.Close()
		}
		if e.exitErr != nil {
			// Not reaped yet, so bwrap is still ours to kill; without
			// this, nothing would enforce the timeout.
			killExec(pid)
		}
		// The record names bwrap's pid with its start time: it must be
		// read while that pid is still bwrap's, so before the reap below.
		e.recorded = <-recorded
		r.mu.Lock()
		r.exited = true // from here on its pid may be reaped, and reused
		e.timedOut = r.timedOut
		r.mu.Unlock()
		close(stop)
		if l.ns != nil {
			// Out of the workspace's namespace before the exec counts as
			// ended, so that closing the namespace's descriptor (Terminate)
			// ends it at once, rather than when this thread is gone.
			step.LeaveNS(p.hostNS)
		}
		e.waitErr = cmd.Wait()
		exited <- e
	})
	return exited
}

// watch kills r when ctx ends or timeout (<= 0: none) passes, until stop
// is closed (bwrap has exited), and marks r timed out when the timeout
// killed it.
func watch(ctx context.Context, timeout time.Duration, r *run, stop <-chan struct{}) {
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-stop:
	case <-timer:
		r.timeOut()
	case <-ctx.Done():
		r.kill(false)
	}
}

// onSpareThread runs f in a goroutine of its own, locked to an OS thread
// other than the main one, which is never given back: f may move it into
// other namespaces or change its ids, and it ends with the goroutine. Go
// never ends the main thread: a goroutine that exits locked to it parks it
// for good, with whatever namespace it joined (and /proc/self names the
// main thread's).
func onSpareThread(f func()) {
	go func() {
		runtime.LockOSThread()
		if !onMainThread() {
			f()
			return
		}
		// Hold the main thread until another goroutine has locked another.
		locked := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			close(locked)
			f()
		}()
		<-locked
		runtime.UnlockOSThread()
	}()
}

// blockingPipe is os.Pipe without the runtime's poller: both ends are
// blocking descriptors, handed to bwrap or written whole by one thread, so
// registering them (and unregistering them) would only cost every exec
// system calls.
func blockingPipe() (r, w *os.File, err error) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		return nil, nil, os.NewSyscallError("pipe2", err)
	}
	return os.NewFile(uintptr(p[0]), "|0"), os.NewFile(uintptr(p[1]), "|1"), nil
}

// joinAsStarted makes cmd, bwrap not yet started, start under sh, which
// joins the exec's v1 cgroups first by writing "0", itself, to each tasks
// file open in join (passed to it as descriptors after cmd's others),
// and then becomes bwrap with none of those descriptors. A process (or a
// thread) moving itself that way is the one cgroup migration the kernel
// makes without its global cgroup_threadgroup_rwsem, whose first writer
// on a host with default settings waits for an RCU grace period: 4 ms on
// average here, up to 26 ms, once per exec, when the broker wrote bwrap's
// pid into each cgroup.procs. sh costs an exec (about 1 ms here), and no
// thread of the broker ever enters a workspace's cgroups: a memory
// cgroup's OOM killer would weigh such a thread by the broker's memory.
//
// status yields a byte when a join failed (sh then exits 121 and bwrap
// never runs). statusW is its write end, handed to cmd: the caller closes
// it once cmd has started (or failed to).
func joinAsStarted(cmd *exec.Cmd, join []*os.File) (status, statusW *os.File, err error) {
	status, statusW, err = blockingPipe()
	if err != nil {
		return nil, nil, err
	}
	first := 3 + len(cmd.ExtraFiles)
	var script, closes strings.Builder
	for i := range join {
		fmt.Fprintf(&script, "echo 0 2>&- >&%d && ", first+i)
		fmt.Fprintf(&closes, "%d>&- ", first+i)
	}
	sfd := first + len(join)
	fmt.Fprintf(&script, `exec %s%d>&- "$@"; echo x >&%d; exit 121`, closes.String(), sfd, sfd)
	cmd.Args = append([]string{"sh", "-c", script.String(), "sh"}, cmd.Args...)
	cmd.Path = shPath
	cmd.ExtraFiles = append(append(cmd.ExtraFiles, join...), statusW)
	return status, statusW, nil
}

// shPath is the sh that joins an exec's cgroups (joinAsStarted).
const shPath = "/bin/sh"

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// confine puts bwrap (pid), which waits for its options before it does
// anything, into j's cgroups (their cgroup.procs files, opened), pins it
// to j's CPUs unless it was born pinned, and sets j's resource limits on
// it, soft and hard, so that every process of the sandbox inherits all
// three. Setting the CPUs on
// bwrap rather than on the thread that forks it spares that thread a
// migration to them. It runs on the launching thread (locked, never
// reused): step.PrlimitOn changes its real uid.
func confine(pid int, j job, cgroups []*os.File, pinned bool) error {
	self := []byte(strconv.Itoa(pid))
	for _, f := range cgroups {
		if _, err := f.Write(self); err != nil {
			return fmt.Errorf("cannot join the workspace's cgroup: %w", scrub(err))
		}
	}
	if !pinned { // else born on j's CPUs (pinHere)
		if err := setAffinity(pid, j.cpus); err != nil {
			return fmt.Errorf("cpu affinity: %w", err)
		}
	}
	uid := -1 // the broker's own
	if j.uid > 0 {
		uid = j.uid
	}
	if err := step.PrlimitOn(pid, uid, uid, jobLimits(j)); err != nil {
		return fmt.Errorf("rlimit: %w", err)
	}
	return nil
}

// stepOptions are what stage does: a durable command's step stages the
// same (its --stage, --bind and --disk options).
type stepOptions struct {
	step.Stage
	// root, when set, is the sandbox's root tree, which stage builds below
	// stage/r (stageRoot) and an exec's bwrap binds as its / (see
	// bwrapOptions). A durable command's step never builds one: on an
	// image workspace it joins the workspace's namespace (--ns-fd) instead.
	root *rootTree
}

// rootName is the directory below the stage that holds the sandbox's root
// tree.
const rootName = "r"

// rootTree is what stageRoot builds: the parts of a sandbox's root that are
// the same for every exec of a workspace.
type rootTree struct {
	owner    int // the host uid (and gid) of the sandbox's root
	usrLinks []usrLink
	binds    []rootBind
	egress   bool // mount points for the forwarder and the egress directory
	// keepPaths and keepTrees are what the namespace needs of the host's
	// mounts: the mounts on the way to each of keepPaths, and those on
	// the way to and below each of keepTrees (trimMounts).
	keepPaths, keepTrees []string
	// image, when set, makes the root an OCI image's overlay (image.go),
	// writable, with files bound on it too.
	image *imageRoot
	files []rootBind
}

// rootBind is a directory bound into the root tree.
type rootBind struct {
	src, dst string // src below the stage (or a host path), dst in the root
	ro       bool
}

// rootOptions turns o, what stage does for j (stageOptions), into a
// namespace that holds j's root tree (stageRoot) and little else: the
// stage binds only the egress socket's directory and the forwarder, which
// bwrap binds for an exec with egress, and the rest of the root tree's
// directories are bound from their host paths (or the disk image's mount)
// by the namespace's maker, which may reach them.
func (p *Provider) rootOptions(j job, o stepOptions) stepOptions {
	o.Binds = slices.DeleteFunc(slices.Clone(o.Binds), func(b [2]string) bool { return b[1] != "g" && b[1] != "x" })
	dirs := [3]string{j.layout.workspace(), j.layout.home(), j.layout.tmp()}
	if j.disk != "" {
		d := p.stageDir + "/d/"
		dirs = [3]string{d + "workspace", d + "home", d + "tmp"}
	}
	t := &rootTree{owner: max(j.uid, 0), usrLinks: p.usrLinks, egress: j.egress || j.stageEgress}
	t.binds = append(t.binds, rootBind{src: "/usr", dst: "/usr", ro: true})
	for _, l := range p.usrLinks {
		if l.target == "" {
			t.binds = append(t.binds, rootBind{src: l.name, dst: l.name, ro: true})
		}
	}
	t.binds = append(t.binds,
		rootBind{src: p.etcDir, dst: "/etc", ro: true},
		rootBind{src: dirs[0], dst: defaultDir},
		rootBind{src: dirs[1], dst: "/root"},
		rootBind{src: dirs[2], dst: "/tmp"},
	)
	// What the namespace keeps of the host's mounts (see trimMounts).
	t.keepPaths = []string{p.bwrap, p.bwrapReal, "/proc", "/dev", "/tmp", p.stageDir}
	t.keepTrees = []string{p.etcDir, j.layout.workspace(), j.layout.home(), j.layout.tmp(), j.layout.egress(), p.exe}
	for _, b := range t.binds {
		t.keepTrees = append(t.keepTrees, b.src)
	}
	if j.disk != "" {
		t.keepTrees = append(t.keepTrees, j.disk)
	}
	p.imageRootTree(j, t)
	o.root = t
	return o
}

// sameRoot reports whether a and b are the same root tree.
func sameRoot(a, b *rootTree) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.owner == b.owner && a.egress == b.egress && slices.Equal(a.usrLinks, b.usrLinks) && slices.Equal(a.binds, b.binds) &&
		slices.Equal(a.keepPaths, b.keepPaths) && slices.Equal(a.keepTrees, b.keepTrees) &&
		sameImageRoot(a.image, b.image) && slices.Equal(a.files, b.files)
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

// srcOf is where bwrap finds the host directory host, which stage binds
// as name: below the stage when they are staged (see stageOptions).
func (p *Provider) srcOf(j job, name, host string) string {
	switch {
	case j.disk != "" && (name == "w" || name == "h" || name == "t"):
		return p.stageDir + "/d/" + map[string]string{"w": "workspace", "h": "home", "t": "tmp"}[name]
	case j.uid > 0 || j.disk != "":
		return p.stageDir + "/" + name
	}
	return host
}

// bwrapOptions returns bwrap's options, each NUL-terminated, for --args.
// With rooted, the workspace's namespace holds j's root tree (stageRoot),
// which bwrap binds as its / in place of /usr, /etc and the workspace's
// directories one by one; it is read-only already.
func (p *Provider) bwrapOptions(j job, seccomp, rooted bool) []byte {
	src := func(name, host string) string { return p.srcOf(j, name, host) }
	o := []string{
		"--unshare-all", // mount, pid, ipc, uts, net, cgroup
		"--unshare-user", "--uid", "0", "--gid", "0",
	}
	guest := p.cfg.GuestVM
	if guest {
		// A VM's root: the host's network, every capability in its own
		// user namespace, nested namespaces allowed.
		o = append(o, "--share-net", "--cap-add", "ALL")
	} else {
		o = append(o, "--cap-drop", "ALL")
	}
	if !seccomp && !guest {
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
	)
	if rooted {
		// /usr, the links into it, /etc, /workspace, /root and /tmp, and
		// the mount points of the rest.
		o = append(o, "--bind", p.stageDir+"/"+rootName, "/")
	} else {
		o = append(o, "--ro-bind", "/usr", "/usr")
		for _, l := range p.usrLinks {
			if l.target != "" {
				o = append(o, "--symlink", l.target, l.name)
			} else {
				o = append(o, "--ro-bind", l.name, l.name)
			}
		}
	}
	o = append(o,
		"--proc", "/proc",
		"--dev", "/dev",
		// /dev/shm is memory: bound it like the rest of memory.
		"--size", strconv.FormatInt(j.memory, 10), "--tmpfs", "/dev/shm",
	)
	if !rooted {
		o = append(o,
			"--ro-bind", src("e", p.etcDir), "/etc",
			"--bind", src("w", j.layout.workspace()), defaultDir,
			"--bind", src("h", j.layout.home()), "/root",
			"--bind", src("t", j.layout.tmp()), "/tmp",
		)
	}
	if j.egress {
		// Before / is read-only: bwrap makes the mount points there (the
		// root tree has them).
		o = append(o,
			"--ro-bind", src("x", p.exe), forwardBin,
			"--ro-bind", src("g", j.layout.egress()), egressMount)
	}
	if j.bindExe {
		// On bwrap's own /dev, before it is read-only: nothing of it
		// shows in the root tree.
		o = append(o, "--ro-bind", src("x", p.exe), residentBin)
	}
	// /dev is tmpfs, that is memory: make it read-only. So is the root
	// without a root tree; the root tree is read-only already.
	o = append(o, "--remount-ro", "/dev")
	if !rooted && !guest {
		o = append(o, "--remount-ro", "/")
	}
	o = append(o,
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

// execFailure passes a command's stderr on to next, except a first line
// that may be bwrap's own "bwrap: execvp ARGV0: why", which it holds back
// until the command's end (end): bwrap's failure to execute the command
// becomes the answer a shell gives (docs/protocol-notes.md).
type execFailure struct {
	next    io.Writer
	argv0   string
	held    []byte
	passing bool // the stream is not bwrap's line: pass everything on
}

// maxExecFailure bounds the held line past its prefix: the reason is one
// of strerror's short messages.
const maxExecFailure = 128

func (f *execFailure) Write(b []byte) (int, error) {
	if f.passing {
		return f.next.Write(b)
	}
	f.held = append(f.held, b...)
	prefix := f.prefix()
	n := min(len(f.held), len(prefix))
	nl := bytes.IndexByte(f.held, '\n')
	if string(f.held[:n]) != prefix[:n] || len(f.held) > len(prefix)+maxExecFailure || (nl >= 0 && nl != len(f.held)-1) {
		f.passing = true
		held := f.held
		f.held = nil
		_, _ = f.next.Write(held) // cappedBuffer never fails a write
	}
	return len(b), nil
}

func (f *execFailure) prefix() string { return "bwrap: execvp " + f.argv0 + ": " }

// end returns the exit code to answer for a command that exited with
// code, having written nothing to stdout when quiet, and hands on what
// it held: for bwrap's line after exit code 1, a shell's answer instead,
// 127 for a program that does not exist and 126 for one that cannot be
// executed, with a line naming the program and why. A command printing
// bwrap's line itself and exiting 1 reads the same; it only misleads
// itself.
func (f *execFailure) end(code int, quiet bool) int {
	if f.passing || len(f.held) == 0 {
		return code
	}
	why, ok := strings.CutPrefix(string(f.held), f.prefix())
	why, nl := strings.CutSuffix(why, "\n")
	if code != 1 || !quiet || !ok || !nl || why == "" {
		_, _ = f.next.Write(f.held)
		return code
	}
	code = 126
	if why == "No such file or directory" { // strerror(ENOENT), as bwrap prints it
		code = 127
		if !strings.Contains(f.argv0, "/") {
			why = "command not found" // looked up in PATH, as a shell says
		}
	}
	_, _ = f.next.Write([]byte(f.argv0 + ": " + why + "\n"))
	return code
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
