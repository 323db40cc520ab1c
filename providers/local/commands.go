package local

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local/internal/step"
	"github.com/sandgate/sandgate/providers/runner"
)

// Durable commands run natively: a broker process starts the runner of
// package runner on the host, as the leader of a new session and without a
// parent-death signal, and the runner starts the step and bwrap like Exec
// does. So the command outlives the broker process that launched it, while
// bwrap's --die-with-parent still ties the sandbox to the runner: killing
// the runner's process group (a cancel, the timeout, Terminate) ends the
// sandbox and every process in it. The runner's files live in the
// workspace's commands/<id>/ on the host, outside every mount, so the
// command cannot forge its own status. See README.md.

// lockPoll is how often a blocked workspace lock is retried.
const lockPoll = 5 * time.Millisecond

// lock takes the workspace's flock (lockShared or lockExclusive), waiting
// until ctx ends, and returns the function that releases it. Returns
// [providers.ErrSandboxGone] when the workspace does not exist or is not
// ready once the lock is held.
func (p *Provider) lock(ctx context.Context, ref string, how int) (func(), error) {
	l := p.layout(ref)
	f, err := os.OpenFile(l.lock(), os.O_RDWR|os.O_CREATE, 0o600)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("local: %w", providers.ErrSandboxGone)
	}
	if err != nil {
		return nil, fmt.Errorf("local: lock: %w", scrub(err))
	}
	if err := flockWait(ctx, f, how); err != nil {
		f.Close()
		return nil, fmt.Errorf("local: lock: %w", err)
	}
	unlock := func() {
		flock(int(f.Fd()), lockUnlock)
		f.Close()
	}
	// A Terminate renames the directory while it holds the lock: once we
	// hold it, the path tells whether the workspace still exists.
	if _, err := os.Stat(l.sandbox()); err != nil {
		unlock()
		return nil, fmt.Errorf("local: %w", providers.ErrSandboxGone)
	}
	return unlock, nil
}

// flockWait takes f's flock (lockShared or lockExclusive), waiting until
// ctx ends.
func flockWait(ctx context.Context, f *os.File, how int) error {
	for {
		err := flock(int(f.Fd()), how|lockNonBlock)
		if err == nil {
			return nil
		}
		if !errors.Is(err, errWouldBlock) {
			return err
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(lockPoll):
		}
	}
}

// checkCommandID refuses an id that is not a safe directory name.
func checkCommandID(id string) error {
	if checkRef(id) != nil {
		return fmt.Errorf("local: command id is not a safe directory name: %w", providers.ErrCommandNotStarted)
	}
	return nil
}

// StartCommand launches spec as the durable command id; see
// [providers.Commander]. It holds the workspace's lock shared from the
// fence check until the runner's pid is recorded, so a cancel or a
// Terminate in any broker process either comes before (and fences it) or
// finds the runner to kill.
func (p *Provider) StartCommand(ctx context.Context, sb providers.Sandbox, id string, spec providers.ExecSpec) error {
	defer p.quiet.enter()()
	if err := checkCommandID(id); err != nil {
		return err
	}
	if err := checkSpec(spec); err != nil {
		return fmt.Errorf("%w: %w", err, providers.ErrCommandNotStarted)
	}
	w, err := p.open(sb.Ref)
	if err != nil {
		return err
	}
	timeout, err := p.clampToExpiry(w, spec.Timeout)
	if err != nil {
		return err
	}
	if timeout <= 0 && !w.rec.ExpiresAt.IsZero() {
		timeout = w.rec.ExpiresAt.Sub(p.clock.Now())
	}
	unlock, err := p.lock(ctx, sb.Ref, lockShared)
	if err != nil {
		return err
	}
	defer unlock()
	p.mu.Lock()
	terminating := p.terminating[sb.Ref] > 0
	p.mu.Unlock()
	if terminating {
		return fmt.Errorf("local: start command: %w", providers.ErrSandboxGone)
	}

	d := w.layout.command(id)
	if err := os.MkdirAll(w.layout.commands(), 0o700); err != nil {
		return fmt.Errorf("local: start command: %w: %w", scrub(err), providers.ErrCommandNotStarted)
	}
	if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("local: start command: %w: %w", scrub(err), providers.ErrCommandNotStarted)
	}
	if _, err := os.Stat(filepath.Join(d, runner.FileCancel)); err == nil {
		return fmt.Errorf("local: start command: %w", providers.ErrCommandFenced)
	}
	if _, err := os.Lstat(filepath.Join(d, runner.FileClaim)); err == nil {
		return nil // launched before: never twice
	}
	admitted, err := p.admitCommand(ctx, w, spec.MaxOutputBytes)
	if err != nil {
		return err
	}
	defer admitted() // once the runner is recorded: the next admission counts it
	if err := os.WriteFile(filepath.Join(d, maxOutFile), []byte(strconv.FormatInt(max(spec.MaxOutputBytes, 0), 10)), 0o600); err != nil {
		return fmt.Errorf("local: start command: %w: %w", scrub(err), providers.ErrCommandNotStarted)
	}
	claim, err := os.OpenFile(filepath.Join(d, runner.FileClaim), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return nil // launched before: never twice
	}
	if err != nil {
		return fmt.Errorf("local: start command: %w: %w", scrub(err), providers.ErrCommandNotStarted)
	}
	claim.Close()
	launched := false
	defer func() {
		if !launched { // nothing runs: the id may be started again, and stdin is not kept
			os.Remove(filepath.Join(d, runner.FileStdin))
			os.Remove(filepath.Join(d, runner.FileClaim))
		}
	}()
	if err := os.WriteFile(filepath.Join(d, runner.FileStdin), spec.Stdin, 0o600); err != nil {
		return fmt.Errorf("local: start command: %w: %w", scrub(err), providers.ErrCommandNotStarted)
	}

	j := p.jobIn(sb.Ref, w)
	j.env = imageEnv(w)
	j.dir = cmp.Or(spec.Dir, imageDir(w))
	j.argv = spec.Argv
	j.egress = len(w.rec.AllowedDomains) > 0
	if j.egress {
		p.ensureEgress(sb.Ref, w)
	}
	pid, err := p.launch(j, d, max(spec.MaxOutputBytes, 0), runner.TimeoutSeconds(timeout))
	if err != nil {
		return fmt.Errorf("local: start command: %w: %w", err, providers.ErrCommandNotStarted)
	}
	launched = true
	p.log.Info("durable command launched", sandgate.WorkspaceAttr(sb.Ref), "argc", len(spec.Argv),
		"stdin_bytes", len(spec.Stdin), "runner_pid", pid)
	return nil
}

// joinScript joins each cgroup file before "--" (selfFile), then executes
// the rest: a process joins its cgroups before it can fork. It writes its
// pid into a cgroup.procs, and "0", itself, into a v1 tasks, which moves
// its one thread (sh has no other) without the kernel's global lock (see
// joinAsStarted). Exit code 121, as the exec step's, when a cgroup cannot
// be joined.
const joinScript = `for f; do [ "$f" = -- ] && break; case $f in */tasks) v=0;; *) v=$$;; esac; echo $v > "$f" || exit 121; shift; done; shift; exec "$@"`

// launch starts the runner over the step and bwrap for j, detached, records
// its pid and start time in the command's host.pid, and returns the pid.
func (p *Provider) launch(j job, d string, maxOut, timeoutSecs int64) (int, error) {
	filter := p.seccomp
	// A workspace on an image runs its commands on the image's root: the
	// step joins the workspace's mount namespace, which holds the overlay,
	// instead of staging one of its own, so the workspace's upper layer is
	// mounted once, not once more for each command. The runner (and the
	// step) keep the namespace as long as the command runs.
	ns, release, err := p.commandNS(j)
	if err != nil {
		return 0, err
	}
	defer release()
	opts, err := memfd("sandgate-bwrap-args", p.bwrapOptions(j, filter != nil, ns != nil))
	if err != nil {
		return 0, err
	}
	defer opts.Close()
	files := []*os.File{opts}
	if filter != nil {
		sec, err := memfd("sandgate-seccomp", filter)
		if err != nil {
			return 0, err
		}
		defer sec.Close()
		files = append(files, sec)
	}
	// The runner joins the cgroups (joinScript), not the step.
	sj := j
	sj.cgroups = nil
	stepArgs := p.stepArgs(sj, len(files))
	if ns != nil {
		stepArgs = p.nsStepArgs(j, len(files), 3+len(files))
		files = append(files, ns)
	}
	// The runner is sh on the host; bwrap, as in Exec, gets an empty
	// environment (env -i) and its options from fd 3.
	// First of all, the runner's sh joins the command's leaf of the
	// workspace's cgroups (joinScript), so that the runner and everything
	// it starts stay in them, long after this broker process.
	procs, err := p.leaf(j.ref, j.rec, "c-"+filepath.Base(d), p.cg.selfFile())
	if err != nil {
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	args := append([]string{"-c", joinScript, "sh"}, procs...)
	// The step (the broker's binary, named by its path: sh cannot set
	// argv[0]) stages the workspace's directories and runs bwrap as the
	// workspace's uid, as for an exec; the runner above already joined
	// the cgroups.
	args = append(args, "--", "/bin/sh", "-c", runner.Script, "sh", d, strconv.FormatInt(maxOut, 10), strconv.FormatInt(timeoutSecs, 10),
		"env", "-i", p.exe, "--"+step.Name)
	args = append(args, stepArgs...)
	args = append(args, "--", p.bwrap, "--args", "3", "--")
	args = append(args, sandboxArgv(j)...)
	cmd := exec.Command("/bin/sh", args...)
	cmd.Env = []string{"PATH=" + defaultPath}
	cmd.Dir = d
	cmd.ExtraFiles = files
	cmd.SysProcAttr = durableProcAttr()
	if err := closeOnExec(); err != nil {
		return 0, scrub(err)
	}
	if err := startPinned(cmd, j.cpus); err != nil {
		return 0, scrub(err)
	}
	pid := cmd.Process.Pid
	// Not reaped yet, so the pid is still the runner's.
	start, err := procStart(pid)
	if err != nil {
		start = 0 // it exited already: nothing is left to kill
	}
	// Reap it while this process lives; after that, init does.
	go cmd.Wait()
	rec := strconv.Itoa(pid) + " " + strconv.FormatUint(start, 10) + "\n"
	if err := os.WriteFile(filepath.Join(d, hostPIDFile), []byte(rec), 0o600); err != nil {
		killGroup(pid)
		return 0, scrub(err)
	}
	return pid, nil
}

// commandNS returns the mount namespace a durable command of j joins, and
// its release: the workspace's own, with its root tree, when j's
// workspace runs on an image; nil (and a no-op release) otherwise, where
// the step stages its own.
func (p *Provider) commandNS(j job) (*os.File, func(), error) {
	o, ok := p.stageOptions(j)
	if j.rec.Image == nil || !ok || !p.rootTrees {
		return nil, func() {}, nil
	}
	ns, release, err := p.ns.acquire(j.ref, p.rootOptions(j, o))
	if err != nil {
		return nil, nil, fmt.Errorf("namespace: %w", err)
	}
	return ns, release, nil
}

// runnerOf returns the runner recorded in a command's host.pid, or 0.
func runnerOf(d string) (pid int, start uint64) {
	b, err := os.ReadFile(filepath.Join(d, hostPIDFile))
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0
	}
	pid, _ = strconv.Atoi(f[0])
	start, _ = strconv.ParseUint(f[1], 10, 64)
	return pid, start
}

// runnerAlive reports whether the runner recorded in d still runs: the pid
// exists and started when it was recorded, so a reused pid never counts.
func runnerAlive(d string) bool {
	pid, start := runnerOf(d)
	if pid <= 0 || start == 0 {
		return false
	}
	now, err := procStart(pid)
	return err == nil && now == start
}

// killRunner kills the process group of the runner recorded in d, if it
// still runs, and reports whether it sent the signal.
func killRunner(d string) bool {
	if !runnerAlive(d) {
		return false
	}
	pid, _ := runnerOf(d)
	return killGroup(pid) == nil
}

// ReadCommand reads the durable command id; see [providers.Commander].
func (p *Provider) ReadCommand(ctx context.Context, sb providers.Sandbox, id string, maxOut int64) (providers.CommandStatus, error) {
	if checkRef(id) != nil {
		return providers.CommandStatus{}, nil // no command can have this name
	}
	w, err := p.open(sb.Ref)
	if err != nil {
		return providers.CommandStatus{}, err
	}
	// Shared, so a launch in flight is seen whole: claimed and recorded.
	unlock, err := p.lock(ctx, sb.Ref, lockShared)
	if err != nil {
		return providers.CommandStatus{}, err
	}
	defer unlock()
	d := w.layout.command(id)
	st, err := runner.ReadDir(d, maxOut, func() bool { return runnerAlive(d) })
	if err != nil {
		return providers.CommandStatus{}, fmt.Errorf("local: %w", err)
	}
	return st, nil
}

// CancelCommand fences or kills the durable command id; see
// [providers.Commander].
func (p *Provider) CancelCommand(ctx context.Context, sb providers.Sandbox, id string) error {
	if checkRef(id) != nil {
		return nil
	}
	w, err := p.open(sb.Ref)
	if err != nil {
		return err
	}
	unlock, err := p.lock(ctx, sb.Ref, lockExclusive)
	if err != nil {
		return err
	}
	defer unlock()
	d := w.layout.command(id)
	if _, err := os.Stat(filepath.Join(d, runner.FileExit)); err == nil {
		return nil // finished: the result stays
	}
	if err := os.MkdirAll(d, 0o700); err != nil {
		return fmt.Errorf("local: cancel command: %w", scrub(err))
	}
	if err := os.WriteFile(filepath.Join(d, runner.FileCancel), nil, 0o600); err != nil {
		return fmt.Errorf("local: cancel command: %w", scrub(err))
	}
	if killRunner(d) {
		p.log.Info("durable command canceled", sandgate.WorkspaceAttr(sb.Ref))
	}
	return nil
}

// killCommands kills every durable command of the workspace at l and
// waits a little for them to die. The caller holds the lock exclusively.
func killCommands(l layout) int {
	entries, _ := os.ReadDir(l.commands())
	var killed []string
	for _, e := range entries {
		d := filepath.Join(l.commands(), e.Name())
		if killRunner(d) {
			killed = append(killed, d)
		}
	}
	for i := 0; i < 200 && anyAlive(killed); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	return len(killed)
}

func anyAlive(dirs []string) bool {
	for _, d := range dirs {
		if runnerAlive(d) {
			return true
		}
	}
	return false
}

// Interface guards
var _ providers.Commander = (*Provider)(nil)
