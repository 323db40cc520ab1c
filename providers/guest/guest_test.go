//go:build linux && (amd64 || arm64)

package guest_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// agent is the sandgate-guest binary the tests run, built once by TestMain.
var agent string

// probeEnv makes the test binary, started as a jail's tenant, try the
// syscalls the jail refuses instead of running tests.
const probeEnv = "SANDGATE_GUEST_TEST_PROBE"

func TestMain(m *testing.M) {
	if os.Getenv(probeEnv) == "1" {
		os.Exit(probe())
	}
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "sandgate-guest-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// Readable by the jail's root, which keeps DAC_OVERRIDE anyway.
	os.Chmod(dir, 0o755)
	agent = filepath.Join(dir, "sandgate-guest")
	build := exec.Command("go", "build", "-o", agent, "github.com/sandgate/sandgate/cmd/sandgate-guest")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building sandgate-guest: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// result is a finished agent run.
type result struct {
	status         int
	stdout, stderr string
}

// run runs the agent with args to its end, with env added to the test's
// own environment (which the jail must not pass on): in the guest whose
// keeper serves the --agent-dir of args (guestFor), or on the host when
// args name none.
func run(t testing.TB, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(agent, args...)
	if i := slices.Index(args, "--agent-dir"); i >= 0 && i+1 < len(args) {
		cmd = guestFor(t, args[i+1]).command(args...)
	}
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("running the agent: %v", err)
	}
	return result{status: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errb.String()}
}

// agentDir makes a directory standing for /.sandgate, with a credential
// in it.
func agentDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "egress.cred"), []byte("not-for-the-tenant\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// jail runs argv in a jail with the agent directory dir and returns the
// result.
func jail(t testing.TB, dir string, env []string, argv ...string) result {
	t.Helper()
	return run(t, env, append([]string{"run", "--agent-dir", dir, "--"}, argv...)...)
}

// waitFor polls cond until it holds or a generous deadline passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// children returns the pids of pid's children.
func children(pid int) []int {
	// Every thread's: a Go program forks from whichever thread runs the
	// goroutine, and a child is listed under that thread only.
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	slices.Sort(out)
	return out
}

// waitChild returns pid's first child, once it has one; it fails at once
// when pid ends without one (a jail refused past its deadline).
func waitChild(t testing.TB, pid int) int {
	t.Helper()
	var c []int
	waitFor(t, "a child process", func() bool {
		if c = children(pid); len(c) > 0 {
			return true
		}
		if !alive(pid) {
			t.Fatalf("process %d ended without a child", pid)
		}
		return false
	})
	return c[0]
}

// procState is the state letter of /proc/pid/stat ("" once it is gone).
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	s := procState(pid)
	return s != "" && s != "Z"
}

// guests maps an agent directory to the test guest whose keeper serves
// it: every run of that directory runs there.
var guests sync.Map

// guestFor returns the guest of the agent directory dir, starting one
// with a keeper for an hour if there is none.
func guestFor(t testing.TB, dir string) *guestVM {
	t.Helper()
	if g, ok := guests.Load(dir); ok {
		return g.(*guestVM)
	}
	g := startGuest(t)
	g.keep(t, dir, time.Hour)
	return g
}

// keep starts a detached keeper in g for the agent directory dir, ending
// after d, with extra arguments.
func (g *guestVM) keep(t testing.TB, dir string, d time.Duration, extra ...string) {
	t.Helper()
	args := append([]string{"keeper", "--detach", "--agent-dir", dir, "--until", strconv.FormatInt(time.Now().Add(d).Unix(), 10)}, extra...)
	if out, err := g.command(args...).CombinedOutput(); err != nil {
		t.Fatalf("keeper --detach: %v: %s", err, out)
	}
	register(t, dir, g)
}

// register makes g the guest of the agent directory dir for the test.
func register(t testing.TB, dir string, g *guestVM) {
	guests.Store(dir, g)
	t.Cleanup(func() { guests.Delete(dir) })
}

// guestVM stands for a vendor guest: a pid and mount namespace of its own
// with its own /proc (the keeper kills every process in another pid
// namespace than its own, which on this host would include other tests'
// sandboxes), on the host's network and file system.
type guestVM struct {
	init int // the guest's pid 1, as the host sees it
}

func startGuest(t testing.TB) *guestVM {
	t.Helper()
	cmd := exec.Command("unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sleep", "infinity")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return &guestVM{init: waitChild(t, cmd.Process.Pid)}
}

// command is the agent with args, run in the guest as its exec would.
func (g *guestVM) command(args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"-t", strconv.Itoa(g.init), "-p", "-m", "--", agent}, args...)...)
}

// nsPid returns pid's pid in the innermost namespace it is in.
func nsPid(t testing.TB, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if f, ok := strings.CutPrefix(line, "NSpid:"); ok {
			fs := strings.Fields(f)
			n, _ := strconv.Atoi(fs[len(fs)-1])
			return n
		}
	}
	t.Fatal("no NSpid")
	return 0
}

// signalExitStatus is a shell's status for a process killed by sig.
func signalExitStatus(sig syscall.Signal) int { return 128 + int(sig) }
