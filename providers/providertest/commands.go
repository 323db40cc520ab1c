package providertest

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/runner"
)

// The command cases run through runner.For: the provider's own Commander,
// or the generic runner over its Exec.

// WaitCommand polls ReadCommand until the command is finished, for at most
// a minute.
func WaitCommand(t testing.TB, c providers.Commander, sb providers.Sandbox, id string, maxOut int64) providers.CommandStatus {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := c.ReadCommand(t.Context(), sb, id, maxOut)
		if err != nil {
			t.Fatalf("ReadCommand(%s): %v", id, err)
		}
		if st.State == providers.CommandCompleted || st.State == providers.CommandCanceled {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("ReadCommand(%s) = %q after a minute; want finished", id, st.State)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func testCommandCompleted(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	c := runner.For(p)
	err := c.StartCommand(t.Context(), sb, "pt-done", providers.ExecSpec{
		Argv:    []string{"sh", "-c", `printf '%s|' "$1" "$` + EnvVar + `"; pwd; cat; printf oops >&2; exit 7`, "sh", "a b $HOME"},
		Dir:     "/tmp",
		Stdin:   allBytes(2),
		Timeout: time.Minute, MaxOutputBytes: 1 << 20,
	})
	if err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
	st := WaitCommand(t, c, sb, "pt-done", 1<<20)
	want := append([]byte("a b $HOME|"+EnvValue+"|/tmp\n"), allBytes(2)...)
	if st.State != providers.CommandCompleted || st.ExitCode != 7 || !bytes.Equal(st.Stdout, want) || string(st.Stderr) != "oops" {
		t.Errorf("command = %q exit %d stdout %q stderr %q; want completed 7, %q, %q", st.State, st.ExitCode, st.Stdout, st.Stderr, want, "oops")
	}
	if st.StdoutBytes != int64(len(want)) || st.StderrBytes != 4 || st.StdoutTruncated || st.TimedOut {
		t.Errorf("counts %d, %d, truncated %v, timed out %v; want %d, 4, false, false", st.StdoutBytes, st.StderrBytes, st.StdoutTruncated, st.TimedOut, len(want))
	}
	if err := c.CancelCommand(t.Context(), sb, "pt-done"); err != nil {
		t.Fatalf("CancelCommand after completion: %v", err)
	}
	if st := WaitCommand(t, c, sb, "pt-done", 10); st.State != providers.CommandCompleted || st.ExitCode != 7 {
		t.Errorf("after a cancel = %q exit %d; want completed 7: a result survives", st.State, st.ExitCode)
	}
	if st, err := c.ReadCommand(t.Context(), sb, "pt-never", 10); err != nil || st.State != providers.CommandAbsent {
		t.Errorf("ReadCommand of an id never started = %q, %v; want absent", st.State, err)
	}
}

func testCommandTruncation(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	c := runner.For(p)
	if err := c.StartCommand(t.Context(), sb, "pt-trunc", providers.ExecSpec{
		Argv: []string{"sh", "-c", "head -c 3000000 /dev/zero; head -c 10 /dev/zero >&2"}, Timeout: time.Minute, MaxOutputBytes: 1000,
	}); err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
	st := WaitCommand(t, c, sb, "pt-trunc", 1000)
	if len(st.Stdout) != 1000 || st.StdoutBytes != 3000000 || !st.StdoutTruncated || st.StderrBytes != 10 || st.StderrTruncated {
		t.Errorf("kept %d of %d (truncated %v), stderr %d (truncated %v); want 1000 of 3000000, true, 10, false",
			len(st.Stdout), st.StdoutBytes, st.StdoutTruncated, st.StderrBytes, st.StderrTruncated)
	}
}

func testCommandOnce(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	c := runner.For(p)
	spec := providers.ExecSpec{Argv: []string{"sh", "-c", "echo ran >>/tmp/pt-once"}, Timeout: time.Minute}
	done := make(chan error, 6)
	for range cap(done) {
		go func() { done <- c.StartCommand(context.Background(), sb, "pt-once", spec) }()
	}
	for range cap(done) {
		if err := <-done; err != nil {
			t.Errorf("StartCommand: %v", err)
		}
	}
	WaitCommand(t, c, sb, "pt-once", 10)
	if got, err := providers.ReadFileBytes(t.Context(), p, sb, "/tmp/pt-once", 100); err != nil || string(got) != "ran\n" {
		t.Errorf("file after 6 concurrent starts = %q, %v; want exactly one line", got, err)
	}
}

func testCommandCancelBeforeLaunch(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	c := runner.For(p)
	if err := c.CancelCommand(t.Context(), sb, "pt-fenced"); err != nil {
		t.Fatalf("CancelCommand of an id never started: %v", err)
	}
	err := c.StartCommand(t.Context(), sb, "pt-fenced", providers.ExecSpec{Argv: []string{"touch", "/tmp/pt-fenced"}, Timeout: time.Minute})
	if !errors.Is(err, providers.ErrCommandFenced) {
		t.Errorf("StartCommand after a cancel = %v; want ErrCommandFenced", err)
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := providers.ReadFileBytes(t.Context(), p, sb, "/tmp/pt-fenced", 0); !errors.Is(err, providers.ErrFileNotFound) {
		t.Errorf("a fenced command ran (ReadFile = %v)", err)
	}
}

// heartbeat is a command whose background child writes a counter file
// every 50ms, and which sleeps until it is killed.
const heartbeat = `( i=0; while :; do i=$((i+1)); echo $i >"$1.tmp"; mv "$1.tmp" "$1"; sleep 0.05; done ) & sleep 300`

// startHeartbeat starts the durable command name, running heartbeat into
// the file hb, with timeout.
func startHeartbeat(t *testing.T, c providers.Commander, sb providers.Sandbox, name, hb string, timeout time.Duration) {
	t.Helper()
	if err := c.StartCommand(t.Context(), sb, name, providers.ExecSpec{
		Argv: []string{"sh", "-c", heartbeat, "sh", hb}, Timeout: timeout,
	}); err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
}

// beats reads a heartbeat file.
func beats(t *testing.T, p providers.Provider, sb providers.Sandbox, name string) int {
	t.Helper()
	// A heartbeat whose first beat never comes fails here, bounded, rather
	// than hanging until the package's timeout.
	give := time.Now().Add(2 * time.Minute)
	for {
		b, err := providers.ReadFileBytes(t.Context(), p, sb, name, 100)
		if err == nil {
			n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			return n
		}
		if !errors.Is(err, providers.ErrFileNotFound) {
			t.Fatalf("ReadFile(%s): %v", name, err)
		}
		if time.Now().After(give) {
			t.Fatalf("ReadFile(%s): no heartbeat written within 2 minutes", name)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// stillBeating reports whether the heartbeat advances within half a second.
func stillBeating(t *testing.T, p providers.Provider, sb providers.Sandbox, name string) bool {
	t.Helper()
	a := beats(t, p, sb, name)
	time.Sleep(500 * time.Millisecond)
	return beats(t, p, sb, name) != a
}

// beating reports whether the heartbeat advances within 20 windows of
// half a second: on a loaded host one window can pass without a beat,
// and a heartbeat that never runs still fails.
func beating(t *testing.T, p providers.Provider, sb providers.Sandbox, name string) bool {
	t.Helper()
	for range 20 {
		if stillBeating(t, p, sb, name) {
			return true
		}
	}
	return false
}

func testCommandCancelRunning(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	c := runner.For(p)
	const hb = "/tmp/pt-cancel-hb"
	startHeartbeat(t, c, sb, "pt-cancel", hb, 5*time.Minute)
	if !beating(t, p, sb, hb) {
		t.Fatalf("the command's background child does not run")
	}
	if st, err := c.ReadCommand(t.Context(), sb, "pt-cancel", 10); err != nil || st.State != providers.CommandRunning {
		t.Errorf("ReadCommand while running = %q, %v; want running", st.State, err)
	}
	if err := c.CancelCommand(t.Context(), sb, "pt-cancel"); err != nil {
		t.Fatalf("CancelCommand: %v", err)
	}
	st := WaitCommand(t, c, sb, "pt-cancel", 10)
	if st.State != providers.CommandCanceled || st.ExitCode != 137 {
		t.Errorf("after cancel = %q exit %d; want canceled 137", st.State, st.ExitCode)
	}
	if stillBeating(t, p, sb, hb) {
		t.Errorf("the command's background child survived the cancel")
	}
	if err := c.CancelCommand(t.Context(), sb, "pt-cancel"); err != nil {
		t.Errorf("second CancelCommand: %v", err)
	}
}

func testCommandTimeout(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	c := runner.For(p)
	const hb = "/tmp/pt-timeout-hb"
	startHeartbeat(t, c, sb, "pt-timeout", hb, 2*time.Second)
	st := WaitCommand(t, c, sb, "pt-timeout", 10)
	if st.State != providers.CommandCompleted || st.ExitCode != 137 || !st.TimedOut {
		t.Errorf("timed-out command = %q exit %d timed out %v; want completed 137 true", st.State, st.ExitCode, st.TimedOut)
	}
	if stillBeating(t, p, sb, hb) {
		t.Errorf("the command's background child survived the timeout")
	}
}

func testCommandTerminate(t *testing.T, p providers.Provider, _ providers.Sandbox) {
	c := runner.For(p)
	sb := Create(t, p, Spec(t))
	const hb = "/tmp/pt-term-hb"
	startHeartbeat(t, c, sb, "pt-term", hb, 5*time.Minute)
	beats(t, p, sb, hb)
	if err := p.Terminate(t.Context(), sb); err != nil {
		t.Fatalf("Terminate: %v", err)
	}
	if _, err := c.ReadCommand(t.Context(), sb, "pt-term", 10); !errors.Is(err, providers.ErrSandboxGone) {
		t.Errorf("ReadCommand after Terminate = %v; want ErrSandboxGone", err)
	}
	err := c.StartCommand(t.Context(), sb, "pt-term-2", providers.ExecSpec{Argv: []string{"true"}, Timeout: time.Minute})
	if !errors.Is(err, providers.ErrSandboxGone) {
		t.Errorf("StartCommand after Terminate = %v; want ErrSandboxGone", err)
	}
}
