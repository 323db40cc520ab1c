package local

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The supervisor ends every workspace of a data directory at its
// expires_at, whether or not any broker process runs. It is one process per
// data directory, not one per workspace: the broker's own binary run again
// (/proc/self/exe with argv[0] = SupervisorName, recognised in this
// package's init like the exec step), detached (its own session, no
// parent-death signal), holding every deadline in memory and sleeping until
// the next one. Nothing polls: it wakes when a deadline is due, when a
// deadline is added or removed (inotify on deadlines/), and, while it holds
// any deadline, at least every supervisorRecheck to read the wall clock
// again (a clock stepped forward must not make it late); with no deadline
// at all it leaves. So idle workspaces cost the host nothing.
//
//	<DataDir>/deadlines/<ref>  the workspace's deadline, unix milliseconds;
//	                           written (by a rename) at Create, removed by
//	                           Terminate and by the supervisor once it ended it
//	<DataDir>/supervisor.lock  flock'ed exclusively by the running supervisor
//	<DataDir>/supervisor.pid   "<pid> <start time>" of the running supervisor
//
// Create writes the deadline before it makes sure a supervisor runs (New
// does too), and a supervisor watches deadlines/ before it reads it, so no
// deadline is ever missed. Two supervisors started at once agree: the one
// that gets the lock runs, the other exits. The supervisor leaves when it
// holds no deadline (it unlocks, reads deadlines/ once more, and stays if a
// Create added one meanwhile), and when the data directory is removed.
//
// At a deadline it writes the workspace's `ended` (from then on open
// answers ErrSandboxGone, so no exec, file call or command starts), sends
// SIGTERM to every recorded exec's step (execs/<pid>; the step kills its
// sandbox) and SIGKILLs the process group of every durable runner
// (commands/*/host.pid) whose process still has its recorded start time.

// SupervisorName is the supervisor's argv[0], in its command line.
const SupervisorName = "sandgate-supervisor"

// supervisorRecheck is how long the supervisor sleeps at most while it
// holds a deadline: the wall clock is read again at least this often.
const supervisorRecheck = 10 * time.Second

// Files of the supervisor.
const (
	deadlinesDir   = "deadlines"       // in DataDir
	supervisorLock = "supervisor.lock" // in DataDir; holds the supervisor's pid and start time
	supervisorFile = "supervisor.pid"  // in a workspace: its own sh supervisor, from before the one per data directory
	endedFile      = "ended"           // in a workspace: written at expires_at, the sandbox is gone
)

// writeDeadline records the workspace's deadline for the supervisor: the
// first whole second after it, so that an exec whose timeout the provider
// cut at the deadline ends by its own timeout (TimedOut) rather than by
// the supervisor, as before with the sh supervisor's whole seconds.
func (p *Provider) writeDeadline(ref string, deadline time.Time) error {
	deadline = deadline.Truncate(time.Second).Add(time.Second)
	dir := filepath.Join(p.dataDir, deadlinesDir)
	data := []byte(strconv.FormatInt(deadline.UnixMilli(), 10))
	if err := p.spare.write(filepath.Join(dir, ref), data, 0o600, false); !errors.Is(err, errNoSpare) {
		return err
	}
	// A leading dot: never a ref, so the supervisor ignores it until the
	// rename.
	tmp, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	if err := errors.Join(werr, tmp.Close()); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, ref)); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}

// supervisorLinger is how long the supervisor stays once it holds no
// deadline, for the next create.
const supervisorLinger = time.Minute

// supervise records the new workspace's deadline and makes sure the
// supervisor runs, which ends it then even when no broker process runs.
func (p *Provider) supervise(ref string, deadline time.Time) error {
	if deadline.IsZero() {
		return nil
	}
	if err := p.writeDeadline(ref, deadline); err != nil {
		return err
	}
	return p.ensureSupervisor()
}

// superviseAll gives every live workspace with a deadline but no deadline
// file one (a workspace from before the one supervisor per data
// directory), drops the deadlines of workspaces that are gone (a broker
// that died between a Terminate and its teardown), and starts the
// supervisor unless it runs (it was killed, or the host rebooted).
func (p *Provider) superviseAll() error {
	// A workspace's directory exists before its deadline is written (at
	// create, and at a pool take after the rename), so none in the making
	// is dropped.
	deadlines, _ := os.ReadDir(filepath.Join(p.dataDir, deadlinesDir))
	for _, e := range deadlines {
		if p.workspaceGone(e.Name()) {
			p.removeDeadline(e.Name())
		}
	}
	entries, _ := os.ReadDir(filepath.Join(p.dataDir, workspacesDir))
	for _, e := range entries {
		ref := e.Name()
		if !e.IsDir() || checkRef(ref) != nil {
			continue
		}
		if _, err := os.Lstat(filepath.Join(p.dataDir, deadlinesDir, ref)); err == nil {
			continue
		}
		l := p.layout(ref)
		var rec record
		if readJSON(l.sandbox(), &rec) != nil || rec.ExpiresAt.IsZero() || ended(l) {
			continue
		}
		if err := p.writeDeadline(ref, rec.ExpiresAt); err != nil {
			return err
		}
	}
	if names, _ := os.ReadDir(filepath.Join(p.dataDir, deadlinesDir)); len(names) == 0 {
		return nil // nothing to end: the first Create starts it
	}
	return p.ensureSupervisor()
}

// removeDeadline drops the workspace's deadline; the supervisor forgets it.
func (p *Provider) removeDeadline(ref string) {
	_ = os.Remove(filepath.Join(p.dataDir, deadlinesDir, ref))
}

// supervising reports whether a supervisor holds the data directory's lock.
func supervising(dataDir string) bool {
	f, err := os.OpenFile(filepath.Join(dataDir, supervisorLock), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return false
	}
	defer f.Close()
	if flock(int(f.Fd()), lockShared|lockNonBlock) != nil {
		return true // held exclusively: the supervisor runs
	}
	flock(int(f.Fd()), lockUnlock)
	return false
}

// ensureSupervisor starts the data directory's supervisor unless one runs,
// without waiting for it to take its lock: the deadline is written first,
// and a supervisor reads deadlines/ once it holds its lock, so none is
// missed. While one started earlier is still on its way to its lock,
// another is started all the same (it may be leaving, having found no
// deadline): two agree, the one that gets the lock runs. When the one
// started last had failed, the new one is waited for, so that a
// supervisor that cannot run fails the create.
func (p *Provider) ensureSupervisor() error {
	p.supMu.Lock()
	defer p.supMu.Unlock()
	if supervising(p.dataDir) {
		return nil
	}
	failed := false
	select {
	case err := <-p.supStarted: // a nil channel: none started yet
		failed = err != nil && !supervising(p.dataDir)
	default:
	}
	cmd := exec.Command(selfExe, p.dataDir)
	cmd.Args[0] = SupervisorName
	cmd.Env = []string{"PATH=" + defaultPath}
	cmd.Dir = "/"
	cmd.SysProcAttr = durableProcAttr()
	if err := closeOnExec(); err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // reap it while this process lives; after that, init does
	p.supStarted = exited
	if failed {
		return p.waitSupervisor()
	}
	return nil
}

// errSupervisorFailed: the supervisor ended with an error before it took
// its lock.
var errSupervisorFailed = errors.New("the supervisor exited at once")

// waitSupervisor waits, a few seconds at most, until the supervisor
// ensureSupervisor started last holds its lock or exits; p.supStarted is
// nil after an exit. Under supMu.
func (p *Provider) waitSupervisor() error {
	for range 300 {
		if supervising(p.dataDir) {
			return nil
		}
		select {
		case err := <-p.supStarted:
			p.supStarted = nil
			// Status 0: another one holds the lock, or there was no
			// deadline left to hold (a Terminate came first).
			if err != nil && !supervising(p.dataDir) {
				return errSupervisorFailed
			}
			return nil
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// ended reports whether the workspace's supervisor ended it.
func ended(l layout) bool {
	_, err := os.Stat(filepath.Join(string(l), endedFile))
	return !errors.Is(err, fs.ErrNotExist)
}

// markEnded marks the workspace ended, as the supervisor does at the
// deadline. Best effort: a workspace already removed needs no mark.
func markEnded(l layout) {
	_ = os.WriteFile(filepath.Join(string(l), endedFile), nil, 0o644)
}

// endWorkspace ends the workspace at l at its deadline: it marks it
// ended, then signals its execs and durable commands (the supervisor does
// not wait: a Terminate, by the broker's reaper, removes the rest).
func endWorkspace(l layout) {
	if _, err := os.Stat(string(l)); err != nil {
		return // terminated
	}
	markEnded(l)
	for _, pid := range liveExecs(l) {
		killExec(pid)
	}
	commands, _ := os.ReadDir(l.commands())
	for _, e := range commands {
		killRunner(filepath.Join(l.commands(), e.Name()))
	}
	// An sh supervisor of this workspace from before has nothing left to do.
	stopSupervisor(l)
}

// stopSupervisor kills a workspace's own sh supervisor, started by a
// broker from before the one supervisor per data directory, if it still
// runs.
func stopSupervisor(l layout) {
	b, err := os.ReadFile(filepath.Join(string(l), supervisorFile))
	if err != nil {
		return
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return
	}
	pid, _ := strconv.Atoi(f[0])
	want, _ := strconv.ParseUint(f[1], 10, 64)
	if got, err := procStart(pid); pid > 0 && err == nil && got == want {
		killGroup(pid)
	}
}

// readDeadline reads one deadline file.
func readDeadline(name string) (time.Time, bool) {
	b, err := os.ReadFile(name)
	if err != nil {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}

// supervisor is the running supervisor's state.
type supervisor struct {
	dataDir   string
	deadlines map[string]time.Time // ref → deadline
}

// scan reads every deadline.
func (s *supervisor) scan() {
	dir := filepath.Join(s.dataDir, deadlinesDir)
	entries, _ := os.ReadDir(dir)
	s.deadlines = make(map[string]time.Time, len(entries))
	for _, e := range entries {
		s.update(e.Name())
	}
}

// update reads the deadline of ref again: added, changed or removed.
func (s *supervisor) update(ref string) {
	if checkRef(ref) != nil {
		return
	}
	if d, ok := readDeadline(filepath.Join(s.dataDir, deadlinesDir, ref)); ok {
		s.deadlines[ref] = d
	} else {
		delete(s.deadlines, ref)
	}
}

// due ends every workspace whose deadline is not after now and returns
// how long to sleep: until the next deadline, supervisorRecheck at most,
// or -1 (until an event) when it holds none.
func (s *supervisor) due(now time.Time) time.Duration {
	next := time.Duration(-1)
	for ref, d := range s.deadlines {
		if !d.After(now) {
			endWorkspace(layout(filepath.Join(s.dataDir, workspacesDir, ref)))
			os.Remove(filepath.Join(s.dataDir, deadlinesDir, ref))
			delete(s.deadlines, ref)
			continue
		}
		if left := d.Sub(now); next < 0 || left < next {
			next = left
		}
	}
	if next > supervisorRecheck {
		next = supervisorRecheck
	}
	return next
}
