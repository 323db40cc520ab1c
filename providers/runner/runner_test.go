package runner_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/providertest"
	"github.com/sandgate/sandgate/providers/runner"
)

// hostExec runs commands directly on this host, in their own process
// group: a stand-in for a vendor sandbox that keeps background processes
// between execs. The runner's directory is a test temporary directory.
type hostExec struct{}

func (hostExec) Exec(ctx context.Context, _ providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	ctx, cancel := context.WithTimeout(ctx, spec.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, spec.Argv[0], spec.Argv[1:]...)
	cmd.Dir = spec.Dir
	cmd.Stdin = bytes.NewReader(spec.Stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return providers.ExecResult{}, err
	}
	res := providers.ExecResult{ExitCode: cmd.ProcessState.ExitCode(), Stdout: out.Bytes(), Stderr: errb.Bytes(),
		StdoutBytes: int64(out.Len()), StderrBytes: int64(errb.Len())}
	if int64(out.Len()) > spec.MaxOutputBytes {
		res.Stdout, res.StdoutTruncated = res.Stdout[:spec.MaxOutputBytes], true
	}
	return res, nil
}

type env struct {
	r   *runner.Runner
	dir string // the runner's directory
	tmp string // a scratch directory for the commands
	sb  providers.Sandbox
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{dir: t.TempDir(), tmp: t.TempDir(), sb: providers.Sandbox{Ref: "sb-" + t.Name()}}
	e.r = runner.New(hostExec{}, e.dir)
	t.Cleanup(func() {
		// Leave nothing running: cancel every command the test started.
		entries, _ := os.ReadDir(filepath.Dir(runner.CommandDir(e.dir, e.sb, "x")))
		for _, d := range entries {
			e.r.CancelCommand(context.Background(), e.sb, d.Name())
		}
	})
	return e
}

// wait polls ReadCommand until the command is finished.
func (e *env) wait(t *testing.T, id string, maxOut int64) providers.CommandStatus {
	t.Helper()
	return providertest.WaitCommand(t, e.r, e.sb, id, maxOut)
}

// waitFile polls until name exists.
func waitFile(t *testing.T, name string) {
	t.Helper()
	for i := 0; ; i++ {
		if _, err := os.Stat(name); err == nil {
			return
		}
		if i == 1500 {
			t.Fatalf("%s did not appear", filepath.Base(name))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCompleted(t *testing.T) {
	e := newEnv(t)
	err := e.r.StartCommand(t.Context(), e.sb, "c1", providers.ExecSpec{
		Argv:  []string{"sh", "-c", `printf 'out:%s:' "$1"; cat; pwd; printf err >&2; exit 3`, "sh", "a b"},
		Dir:   e.tmp,
		Stdin: []byte("in\x00put"), Timeout: time.Minute, MaxOutputBytes: 1 << 20,
	})
	if err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
	st := e.wait(t, "c1", 1<<20)
	wantOut := "out:a b:in\x00put" + e.tmp + "\n"
	if st.State != providers.CommandCompleted || st.ExitCode != 3 || string(st.Stdout) != wantOut || string(st.Stderr) != "err" {
		t.Errorf("status = %q exit %d out %q err %q; want completed, 3, %q, %q", st.State, st.ExitCode, st.Stdout, st.Stderr, wantOut, "err")
	}
	if st.StdoutBytes != int64(len(wantOut)) || st.StderrBytes != 3 || st.StdoutTruncated || st.StderrTruncated || st.TimedOut {
		t.Errorf("counts = %d, %d, truncated %v %v, timed out %v; want %d, 3, false", st.StdoutBytes, st.StderrBytes,
			st.StdoutTruncated, st.StderrTruncated, st.TimedOut, len(wantOut))
	}
	// Reading again gives the same; a cancel after completion changes nothing.
	if err := e.r.CancelCommand(t.Context(), e.sb, "c1"); err != nil {
		t.Fatalf("CancelCommand after completion: %v", err)
	}
	if st2 := e.wait(t, "c1", 1<<20); st2.State != providers.CommandCompleted || st2.ExitCode != 3 {
		t.Errorf("after cancel = %q exit %d; want completed 3", st2.State, st2.ExitCode)
	}
}

func TestTruncation(t *testing.T) {
	e := newEnv(t)
	err := e.r.StartCommand(t.Context(), e.sb, "big", providers.ExecSpec{
		Argv:    []string{"sh", "-c", "seq 200000; head -c 70000 /dev/zero >&2"},
		Timeout: time.Minute, MaxOutputBytes: 1000,
	})
	if err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
	seq, _ := exec.Command("seq", "200000").Output()
	st := e.wait(t, "big", 1000)
	if st.StdoutBytes != int64(len(seq)) || st.StderrBytes != 70000 || !st.StdoutTruncated || !st.StderrTruncated {
		t.Errorf("counts %d, %d, truncated %v %v; want %d, 70000, true, true", st.StdoutBytes, st.StderrBytes, st.StdoutTruncated, st.StderrTruncated, len(seq))
	}
	if !bytes.Equal(st.Stdout, seq[:1000]) || len(st.Stderr) != 1000 {
		t.Errorf("kept %d and %d bytes (stdout the first bytes: %v); want 1000 each", len(st.Stdout), len(st.Stderr), bytes.Equal(st.Stdout, seq[:1000]))
	}
	// A reader may ask for less than was kept.
	st = e.wait(t, "big", 10)
	if string(st.Stdout) != string(seq[:10]) || st.StdoutBytes != int64(len(seq)) {
		t.Errorf("read with max 10 = %q, %d bytes; want %q, %d", st.Stdout, st.StdoutBytes, seq[:10], len(seq))
	}
}

func TestStartOnce(t *testing.T) {
	e := newEnv(t)
	log := filepath.Join(e.tmp, "log")
	spec := providers.ExecSpec{Argv: []string{"sh", "-c", `echo ran >>"$1"`, "sh", log}, Timeout: time.Minute}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if err := e.r.StartCommand(context.Background(), e.sb, "once", spec); err != nil {
				t.Errorf("StartCommand: %v", err)
			}
		})
	}
	wg.Wait()
	e.wait(t, "once", 100)
	if b, _ := os.ReadFile(log); string(b) != "ran\n" {
		t.Errorf("log after 8 concurrent starts = %q; want one line", b)
	}
}

// TestStdinNotKept checks that a command's stdin leaves the disk as soon as
// the command has it: while the command still runs, before it has read a
// byte, no file in the command's directory holds it, and the command reads
// all of it all the same.
func TestStdinNotKept(t *testing.T) {
	tests := []struct {
		name  string
		stdin []byte
	}{
		{"short", []byte("secret-stdin-marker")},
		{"over a pipe buffer", bytes.Repeat([]byte("0123456789abcdef"), 1<<16)}, // 1 MiB
		{"empty", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			started, goOn := filepath.Join(e.tmp, "started"), filepath.Join(e.tmp, "go")
			err := e.r.StartCommand(t.Context(), e.sb, "in", providers.ExecSpec{
				Argv:    []string{"sh", "-c", `: >"$1"; while [ ! -e "$2" ]; do sleep 0.02; done; cat`, "sh", started, goOn},
				Timeout: time.Minute, MaxOutputBytes: 2 << 20, Stdin: tt.stdin,
			})
			if err != nil {
				t.Fatalf("StartCommand: %v", err)
			}
			waitFile(t, started)
			dir := runner.CommandDir(e.dir, e.sb, "in")
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range entries {
				if strings.HasPrefix(d.Name(), runner.FileStdin) {
					t.Errorf("%s is still in the command's directory while the command runs", d.Name())
				}
			}
			if err := os.WriteFile(goOn, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			st := e.wait(t, "in", 2<<20)
			if st.State != providers.CommandCompleted || st.ExitCode != 0 || !bytes.Equal(st.Stdout, tt.stdin) {
				t.Errorf("status = %q exit %d, %d bytes of stdout; want completed 0 with the %d bytes of stdin",
					st.State, st.ExitCode, len(st.Stdout), len(tt.stdin))
			}
		})
	}
}

func TestCancelBeforeLaunch(t *testing.T) {
	e := newEnv(t)
	if st, err := e.r.ReadCommand(t.Context(), e.sb, "fenced", 10); err != nil || st.State != providers.CommandAbsent {
		t.Fatalf("ReadCommand of an unknown id = %q, %v; want absent", st.State, err)
	}
	if err := e.r.CancelCommand(t.Context(), e.sb, "fenced"); err != nil {
		t.Fatalf("CancelCommand: %v", err)
	}
	marker := filepath.Join(e.tmp, "ran")
	err := e.r.StartCommand(t.Context(), e.sb, "fenced", providers.ExecSpec{Argv: []string{"touch", marker}, Timeout: time.Minute})
	if !errors.Is(err, providers.ErrCommandFenced) {
		t.Errorf("StartCommand after cancel = %v; want ErrCommandFenced", err)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("a fenced command ran")
	}
}

// alive reports whether process pid exists.
func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// startSleeper starts a command that records its pid and a background
// child's, then sleeps; it returns both pids once they are recorded.
func startSleeper(t *testing.T, e *env, id string, timeout time.Duration) (int, int) {
	t.Helper()
	pids := filepath.Join(e.tmp, id+".pids")
	err := e.r.StartCommand(t.Context(), e.sb, id, providers.ExecSpec{
		Argv:    []string{"sh", "-c", `sleep 300 & echo $$ $! >"$1.tmp"; mv "$1.tmp" "$1"; sleep 300`, "sh", pids},
		Timeout: timeout,
	})
	if err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
	waitFile(t, pids)
	b, _ := os.ReadFile(pids)
	f := strings.Fields(string(b))
	a, _ := strconv.Atoi(f[0])
	c, _ := strconv.Atoi(f[1])
	return a, c
}

func TestCancelRunning(t *testing.T) {
	e := newEnv(t)
	sh, child := startSleeper(t, e, "run", 5*time.Minute)
	if st, err := e.r.ReadCommand(t.Context(), e.sb, "run", 10); err != nil || st.State != providers.CommandRunning {
		t.Fatalf("ReadCommand while running = %q, %v; want running", st.State, err)
	}
	if err := e.r.CancelCommand(t.Context(), e.sb, "run"); err != nil {
		t.Fatalf("CancelCommand: %v", err)
	}
	st := e.wait(t, "run", 10)
	if st.State != providers.CommandCanceled || st.ExitCode != 137 {
		t.Errorf("after cancel = %q exit %d; want canceled 137", st.State, st.ExitCode)
	}
	for i := 0; alive(sh) || alive(child); i++ {
		if i == 1500 { // 30 s, as waitFile: a backstop for a loaded machine
			t.Fatalf("the command (%v) or its child (%v) survived the cancel", alive(sh), alive(child))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := e.r.CancelCommand(t.Context(), e.sb, "run"); err != nil {
		t.Errorf("second CancelCommand: %v", err)
	}
}

func TestTimeout(t *testing.T) {
	e := newEnv(t)
	// Long enough that the sleeper records its pids before it is killed,
	// on a loaded machine.
	sh, child := startSleeper(t, e, "slow", 3*time.Second)
	st := e.wait(t, "slow", 10)
	if st.State != providers.CommandCompleted || st.ExitCode != 137 || !st.TimedOut {
		t.Errorf("timed-out command = %q exit %d timed out %v; want completed 137 true", st.State, st.ExitCode, st.TimedOut)
	}
	for i := 0; alive(sh) || alive(child); i++ {
		if i == 1500 {
			t.Fatalf("processes survived the timeout")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRunnerLost(t *testing.T) {
	e := newEnv(t)
	startSleeper(t, e, "lost", 5*time.Minute)
	b, err := os.ReadFile(filepath.Join(runner.CommandDir(e.dir, e.sb, "lost"), runner.FilePID))
	if err != nil {
		t.Fatalf("pid file: %v", err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	syscall.Kill(-pid, syscall.SIGKILL) // killed from outside the broker
	st := e.wait(t, "lost", 10)
	if st.State != providers.CommandCompleted || st.ExitCode != 137 {
		t.Errorf("command of a lost runner = %q exit %d; want completed 137", st.State, st.ExitCode)
	}
}

func TestReadDirMatchesScript(t *testing.T) {
	e := newEnv(t)
	if err := e.r.StartCommand(t.Context(), e.sb, "same", providers.ExecSpec{
		Argv: []string{"sh", "-c", "seq 3000; echo oops >&2; exit 5"}, Timeout: time.Minute, MaxOutputBytes: 100,
	}); err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
	viaExec := e.wait(t, "same", 50)
	viaDir, err := runner.ReadDir(runner.CommandDir(e.dir, e.sb, "same"), 50, func() bool { return false })
	if err != nil {
		t.Fatalf("ReadDir: %v", err)
	}
	if viaExec.State != viaDir.State || viaExec.ExitCode != viaDir.ExitCode || !bytes.Equal(viaExec.Stdout, viaDir.Stdout) ||
		!bytes.Equal(viaExec.Stderr, viaDir.Stderr) || viaExec.StdoutBytes != viaDir.StdoutBytes || viaExec.StdoutTruncated != viaDir.StdoutTruncated {
		t.Errorf("ReadDir = %+v; want what the read script says, %+v", viaDir, viaExec)
	}
	if st, err := runner.ReadDir(runner.CommandDir(e.dir, e.sb, "none"), 50, func() bool { return true }); err != nil || st.State != providers.CommandAbsent {
		t.Errorf("ReadDir of a missing directory = %q, %v; want absent", st.State, err)
	}
}

// TestSandboxesApart: the same command id in two sandboxes names two
// commands, also when one sandbox's files were copied into the other.
func TestSandboxesApart(t *testing.T) {
	e := newEnv(t)
	if err := e.r.StartCommand(t.Context(), e.sb, "same-id", providers.ExecSpec{Argv: []string{"true"}, Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	e.wait(t, "same-id", 10)
	other := providers.Sandbox{Ref: "another-sandbox"}
	if st, err := e.r.ReadCommand(t.Context(), other, "same-id", 10); err != nil || st.State != providers.CommandAbsent {
		t.Errorf("ReadCommand in another sandbox = %q, %v; want absent", st.State, err)
	}
}

// endsMidRead runs every command with a cat of its own first on PATH:
// the first time the read script asks it for a runner's pid, it lets the
// command finish (it creates release) and waits until the runner is gone,
// then reads the file. So the runner ends exactly between two of the read
// script's looks, as it does now and then under load.
type endsMidRead struct {
	hostExec
	bin string
}

func newEndsMidRead(t *testing.T, release string) endsMidRead {
	t.Helper()
	cat, err := exec.LookPath("cat")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	fired := filepath.Join(bin, "fired")
	hook := `#!/bin/sh
case $1 in
*/` + runner.FilePID + `)
	if [ ! -e '` + fired + `' ]; then
		: >'` + fired + `'
		: >'` + release + `'
		p=$('` + cat + `' "$1")
		while kill -0 "$p" 2>/dev/null; do sleep 0.01; done
	fi
	;;
esac
exec '` + cat + `' "$@"
`
	if err := os.WriteFile(filepath.Join(bin, "cat"), []byte(hook), 0o755); err != nil {
		t.Fatal(err)
	}
	return endsMidRead{bin: bin}
}

func (h endsMidRead) Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	spec.Argv = append([]string{"env", "PATH=" + h.bin + ":" + os.Getenv("PATH")}, spec.Argv...)
	return h.hostExec.Exec(ctx, sb, spec)
}

// TestRunnerEndsMidRead: a runner that records its exit, or is killed by
// its watchdog, while a read is under way reads as what happened, never as
// a lost runner (exit 137, not timed out).
func TestRunnerEndsMidRead(t *testing.T) {
	tests := []struct {
		name     string
		script   string // $1: the file whose creation lets the command go on
		timeout  time.Duration
		code     int
		timedOut bool
	}{
		{"completed", `while [ ! -e "$1" ]; do sleep 0.01; done; echo done; exit 7`, time.Minute, 7, false},
		{"timed out", `sleep 300`, time.Second, 137, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			release := filepath.Join(e.tmp, "release")
			e.r = runner.New(newEndsMidRead(t, release), e.dir)
			if err := e.r.StartCommand(t.Context(), e.sb, "mid", providers.ExecSpec{
				Argv: []string{"sh", "-c", tt.script, "sh", release}, Timeout: tt.timeout, MaxOutputBytes: 100,
			}); err != nil {
				t.Fatalf("StartCommand: %v", err)
			}
			waitFile(t, filepath.Join(runner.CommandDir(e.dir, e.sb, "mid"), runner.FilePID))
			st, err := e.r.ReadCommand(t.Context(), e.sb, "mid", 100)
			if err != nil {
				t.Fatalf("ReadCommand: %v", err)
			}
			if st.State != providers.CommandCompleted || st.ExitCode != tt.code || st.TimedOut != tt.timedOut {
				t.Errorf("read as the runner ended = %q exit %d timed out %v; want completed %d timed out %v",
					st.State, st.ExitCode, st.TimedOut, tt.code, tt.timedOut)
			}
			if tt.code == 7 && string(st.Stdout) != "done\n" {
				t.Errorf("stdout = %q; want %q", st.Stdout, "done\n")
			}
		})
	}
}

// TestReadDirRunnerEndsMidRead: the same for ReadDir, whose alive is
// asked while the runner records its end.
func TestReadDirRunnerEndsMidRead(t *testing.T) {
	tests := []struct {
		name     string
		writes   map[string]string // what the runner (or its watchdog) leaves as it ends
		code     int
		timedOut bool
	}{
		{"completed", map[string]string{runner.FileExit: "7\n"}, 7, false},
		{"timed out", map[string]string{runner.FileTimedOut: ""}, 137, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, body := range map[string]string{runner.FileClaim: "", runner.FilePID: "12345\n", runner.FileStdout: "out"} {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			ends := func() bool {
				for name, body := range tt.writes {
					if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
						t.Error(err)
					}
				}
				return false
			}
			st, err := runner.ReadDir(dir, 100, ends)
			if err != nil {
				t.Fatalf("ReadDir: %v", err)
			}
			if st.State != providers.CommandCompleted || st.ExitCode != tt.code || st.TimedOut != tt.timedOut || string(st.Stdout) != "out" {
				t.Errorf("ReadDir as the runner ended = %q exit %d timed out %v stdout %q; want completed %d timed out %v %q",
					st.State, st.ExitCode, st.TimedOut, st.Stdout, tt.code, tt.timedOut, "out")
			}
		})
	}
}
