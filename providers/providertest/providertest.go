// Package providertest is the behaviour suite every [providers.Provider]
// must pass: each provider's tests call [Run] with a constructor, against the
// real thing or a fake of its vendor, the way net/http runs one test body in
// every mode.
package providertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
)

// EnvVar and EnvValue are set in the Env of every sandbox [Spec] makes. The
// value holds characters a shell would expand, to show none does.
const (
	EnvVar   = "SANDGATE_SUITE_VAR"
	EnvValue = "a b $HOME `x` 'q' \"d\" ;|*"
)

// Spec returns a CreateSpec with a fresh workspace id, the "small" size, the
// provider's default image, no network and EnvVar set.
func Spec(t testing.TB) providers.CreateSpec {
	t.Helper()
	size, ok := sandgate.LookupSize("small")
	if !ok {
		t.Fatal(`no standard size "small"`)
	}
	var b [10]byte
	rand.Read(b[:])
	return providers.CreateSpec{
		WorkspaceID: "ws_pt" + hex.EncodeToString(b[:]),
		InstanceID:  "inst_pt",
		Size:        size,
		Env:         map[string]string{EnvVar: EnvValue},
		Egress:      sandgate.EgressPolicy{AllowedDomains: []string{}},
		ExpiresAt:   time.Now().Add(time.Hour),
		IdleTimeout: 15 * time.Minute,
	}
}

// Create creates a sandbox and terminates it when the test ends.
func Create(t testing.TB, p providers.Provider, spec providers.CreateSpec) providers.Sandbox {
	t.Helper()
	sb, err := p.Create(t.Context(), spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		// t.Context is already canceled when cleanups run.
		if err := p.Terminate(context.Background(), sb); err != nil {
			t.Errorf("Terminate in cleanup: %v", err)
		}
	})
	return sb
}

// Discard terminates every sandbox p lists and closes p, for a test's
// cleanup: a local provider's Close keeps its workspaces, which outlive
// a broker, and with them their cgroups, left on the host once the test
// has removed the data directory.
func Discard(p interface {
	providers.Provider
	Close() error
}) {
	ctx := context.Background()
	if sbs, err := p.List(ctx); err == nil {
		for _, sb := range sbs {
			_ = p.Terminate(ctx, sb)
		}
	}
	_ = p.Close()
}

// ListRefs returns the refs of the sandboxes p lists, in List's order. It
// fails the test on a List error, and marks it failed for each sandbox
// without broker's label: List must not report another broker's.
func ListRefs(t testing.TB, p providers.Provider, broker string) []string {
	t.Helper()
	all, err := p.List(t.Context())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var refs []string
	for _, sb := range all {
		refs = append(refs, sb.Ref)
		if sb.Labels[providers.LabelBroker] != broker {
			t.Errorf("List returned %s with labels %v; want broker %s's only", sb.Ref, sb.Labels, broker)
		}
	}
	return refs
}

// Exec runs argv in sb with a 30s timeout and 1 MiB of output per stream,
// and fails the test on an error.
func Exec(t testing.TB, p providers.Provider, sb providers.Sandbox, argv ...string) providers.ExecResult {
	t.Helper()
	return ExecWith(t, p, sb, providers.ExecSpec{Argv: argv})
}

// ExecWith runs spec in sb and fails the test on an error. A zero Timeout
// becomes 30s and a zero MaxOutputBytes 1 MiB.
func ExecWith(t testing.TB, p providers.Provider, sb providers.Sandbox, spec providers.ExecSpec) providers.ExecResult {
	t.Helper()
	if spec.Timeout == 0 {
		spec.Timeout = 30 * time.Second
	}
	if spec.MaxOutputBytes == 0 {
		spec.MaxOutputBytes = 1 << 20
	}
	res, err := p.Exec(t.Context(), sb, spec)
	if err != nil {
		t.Fatalf("Exec(%q): %v", spec.Argv, err)
	}
	return res
}

// suiteCase is one test of the suite, run in the suite's shared sandbox.
type suiteCase struct {
	name string
	f    func(t *testing.T, p providers.Provider, sb providers.Sandbox)
}

// fileCases are the suite's cases of ReadFile and WriteFile.
func fileCases() []suiteCase {
	return []suiteCase{
		{"FileRoundTrip", testFileRoundTrip},
		{"FileErrors", testFileErrors},
		{"FileVisibleToExec", testFileVisibleToExec},
	}
}

// Run runs the suite against the provider newProvider returns. The
// subtests run in parallel, most of them in one shared sandbox.
func Run(t *testing.T, newProvider func(t *testing.T) providers.Provider) {
	cases := []suiteCase{
		{"Capabilities", testCapabilities},
		{"ExitCode", testExitCode},
		{"ArgvWithoutShell", testArgvWithoutShell},
		{"Dir", testDir},
		{"Env", testEnv},
		{"Stdin", testStdin},
		{"StdoutStderr", testStdoutStderr},
		{"Truncation", testTruncation},
		{"OutputWriters", testOutputWriters},
		{"Timeout", testTimeout},
		{"Signal", testSignal},
	}
	cases = append(cases, fileCases()...)
	cases = append(cases, []suiteCase{
		{"StatePersists", testStatePersists},
		{"Terminate", testTerminate},
		{"TerminateRunning", testTerminateRunning},
		{"ContextCancel", testContextCancel},
		{"SnapshotRestore", testSnapshotRestore},
		{"SnapshotErrors", testSnapshotErrors},
		{"SnapshotDelete", testSnapshotDelete},
		{"CommandCompleted", testCommandCompleted},
		{"CommandTruncation", testCommandTruncation},
		{"CommandOnce", testCommandOnce},
		{"CommandCancelBeforeLaunch", testCommandCancelBeforeLaunch},
		{"CommandCancelRunning", testCommandCancelRunning},
		{"CommandTimeout", testCommandTimeout},
		{"CommandTerminate", testCommandTerminate},
	}...)
	run(t, newProvider, cases)
}

// RunFiles runs the suite's file cases alone: for a second reading of a
// vendor's answer that its sheet leaves uncertain.
func RunFiles(t *testing.T, newProvider func(t *testing.T) providers.Provider) {
	run(t, newProvider, fileCases())
}

func run(t *testing.T, newProvider func(t *testing.T) providers.Provider, cases []suiteCase) {
	p := newProvider(t)
	// Registered first, so it runs last: after every sandbox's Terminate.
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	sb := Create(t, p, Spec(t))
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.f(t, p, sb)
		})
	}
}

// testCapabilities checks that what the provider reports is usable: the
// sizes it runs (Spec's among them) with real CPU and memory, and a default
// image it runs itself.
func testCapabilities(t *testing.T, p providers.Provider, _ providers.Sandbox) {
	caps := p.Capabilities()
	if _, ok := caps.Size(Spec(t).Size.Name); !ok {
		t.Errorf("Capabilities().Sizes = %v; want the suite's size %q among them", caps.Sizes, Spec(t).Size.Name)
	}
	for _, s := range caps.Sizes {
		if s.CPUCores < 1 || s.MemoryMiB < 1 {
			t.Errorf("size %q: %d cores, %d MiB; want both positive", s.Name, s.CPUCores, s.MemoryMiB)
		}
	}
	if caps.DefaultImage == "" || !caps.RunsImage(caps.DefaultImage) {
		t.Errorf("default image %q: want one the provider runs", caps.DefaultImage)
	}
	if err := caps.CheckScope("suite", sandgate.Scope{EgressCeiling: []string{}}); err != nil {
		t.Errorf("the provider cannot enforce the narrowest scope (no network, defaults): %v", err)
	}
}

func testExitCode(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	for _, tt := range []struct {
		argv []string
		want int
	}{
		{[]string{"true"}, 0},
		{[]string{"false"}, 1},
		{[]string{"sh", "-c", "exit 3"}, 3},
	} {
		res := Exec(t, p, sb, tt.argv...)
		if res.ExitCode != tt.want || res.TimedOut {
			t.Errorf("Exec(%q) = exit %d, timed out %v; want exit %d", tt.argv, res.ExitCode, res.TimedOut, tt.want)
		}
	}
}

func testArgvWithoutShell(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	args := []string{"a b", "$HOME", "*", "'q'", `"d"`, "; true", ""}
	res := Exec(t, p, sb, append([]string{"printf", "[%s]"}, args...)...)
	want := "[a b][$HOME][*]['q'][\"d\"][; true][]"
	if got := string(res.Stdout); got != want || res.ExitCode != 0 {
		t.Errorf("printf of literal args = %q, exit %d; want %q, exit 0", got, res.ExitCode, want)
	}
}

func testDir(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	for _, dir := range []string{"/", "/tmp"} {
		res := ExecWith(t, p, sb, providers.ExecSpec{Argv: []string{"pwd"}, Dir: dir})
		if got := strings.TrimSpace(string(res.Stdout)); got != dir {
			t.Errorf("pwd in Dir %q = %q; want %q", dir, got, dir)
		}
	}
}

func testEnv(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	res := Exec(t, p, sb, "sh", "-c", `printf %s "$`+EnvVar+`"`)
	if got := string(res.Stdout); got != EnvValue {
		t.Errorf("$%s in the sandbox = %q; want %q", EnvVar, got, EnvValue)
	}
}

// allBytes returns every byte value n times over.
func allBytes(n int) []byte {
	b := make([]byte, 256*n)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

func testStdin(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	in := allBytes(4)
	res := ExecWith(t, p, sb, providers.ExecSpec{Argv: []string{"cat"}, Stdin: in})
	if !bytes.Equal(res.Stdout, in) || res.StdoutBytes != int64(len(in)) {
		t.Errorf("cat of all byte values = %d bytes (%d counted); want the %d bytes back", len(res.Stdout), res.StdoutBytes, len(in))
	}
	// No stdin reads as empty, not as a blocked read.
	res = Exec(t, p, sb, "cat")
	if len(res.Stdout) != 0 || res.ExitCode != 0 {
		t.Errorf("cat without stdin = %q, exit %d; want empty, exit 0", res.Stdout, res.ExitCode)
	}
}

func testStdoutStderr(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	res := Exec(t, p, sb, "sh", "-c", "printf out; printf error >&2")
	if string(res.Stdout) != "out" || string(res.Stderr) != "error" {
		t.Errorf("streams = %q, %q; want %q, %q", res.Stdout, res.Stderr, "out", "error")
	}
	if res.StdoutBytes != 3 || res.StderrBytes != 5 || res.StdoutTruncated || res.StderrTruncated {
		t.Errorf("counts = %d, %d, truncated %v, %v; want 3, 5, false, false",
			res.StdoutBytes, res.StderrBytes, res.StdoutTruncated, res.StderrTruncated)
	}
}

// testOutputWriters checks ExecSpec.Stdout and Stderr: the kept bytes of
// each stream (capped as without them) reach the writers, or, for a
// provider that ignores them, the result; never both, never neither.
func testOutputWriters(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	const max = 3 << 20 // more than one pipe buffer, less than the output
	var out, errOut bytes.Buffer
	res, err := p.Exec(t.Context(), sb, providers.ExecSpec{
		Argv:           []string{"sh", "-c", "seq 1000000; printf oops >&2"},
		MaxOutputBytes: max, Timeout: 30 * time.Second, Stdout: &out, Stderr: &errOut,
	})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	var seq bytes.Buffer
	for i := 1; i <= 1_000_000; i++ {
		fmt.Fprintln(&seq, i)
	}
	stdout, stderr := out.Bytes(), errOut.Bytes()
	if res.Stdout != nil || res.Stderr != nil {
		if out.Len() > 0 || errOut.Len() > 0 {
			t.Fatalf("output both in the writers (%d, %d bytes) and in the result (%d, %d bytes)",
				out.Len(), errOut.Len(), len(res.Stdout), len(res.Stderr))
		}
		stdout, stderr = res.Stdout, res.Stderr
	}
	if !bytes.Equal(stdout, seq.Bytes()[:max]) || !res.StdoutTruncated || res.StdoutBytes != int64(seq.Len()) {
		t.Errorf("stdout: kept %d bytes (the first ones: %v), truncated %v, counted %d; want %d, true, true, %d",
			len(stdout), bytes.Equal(stdout, seq.Bytes()[:min(len(stdout), seq.Len())]), res.StdoutTruncated, res.StdoutBytes, max, seq.Len())
	}
	if string(stderr) != "oops" || res.StderrTruncated || res.StderrBytes != 4 {
		t.Errorf("stderr: %q, truncated %v, counted %d; want \"oops\", false, 4", stderr, res.StderrTruncated, res.StderrBytes)
	}
}

func testTruncation(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	const total, max = 5 << 20, 1 << 10
	// seq's output shows that the kept bytes are the first ones.
	var seq bytes.Buffer
	for i := 1; i <= 1_000_000; i++ {
		fmt.Fprintln(&seq, i)
	}
	for _, tt := range []struct {
		name  string
		argv  []string
		max   int64
		total int64
	}{
		{"stdout", []string{"seq", "1000000"}, max, int64(seq.Len())},
		{"stderr", []string{"sh", "-c", "head -c 5242880 /dev/zero >&2"}, max, total},
		{"exact", []string{"head", "-c", "1024", "/dev/zero"}, max, max},
		{"zero", []string{"printf", "x"}, 0, 1}, // MaxOutputBytes 0 keeps nothing
	} {
		spec := providers.ExecSpec{Argv: tt.argv, MaxOutputBytes: tt.max, Timeout: 30 * time.Second}
		res, err := p.Exec(t.Context(), sb, spec)
		if err != nil {
			t.Fatalf("%s: Exec: %v", tt.name, err)
		}
		kept, n, trunc := res.Stdout, res.StdoutBytes, res.StdoutTruncated
		if tt.name == "stderr" {
			kept, n, trunc = res.Stderr, res.StderrBytes, res.StderrTruncated
		}
		wantKept := min(tt.total, tt.max)
		if int64(len(kept)) != wantKept || n != tt.total || trunc != (tt.total > tt.max) {
			t.Errorf("%s: kept %d, counted %d, truncated %v; want %d, %d, %v",
				tt.name, len(kept), n, trunc, wantKept, tt.total, tt.total > tt.max)
		}
		if tt.name == "stdout" && !bytes.Equal(kept, seq.Bytes()[:len(kept)]) {
			t.Errorf("%s: kept %q…; want the first bytes of the output", tt.name, kept[:min(len(kept), 20)])
		}
		if res.ExitCode != 0 {
			t.Errorf("%s: exit %d; want 0", tt.name, res.ExitCode)
		}
	}
}

// sleepMarker makes the timeout test's processes recognizable.
const sleepMarker = "sleep 317"

func testTimeout(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	res := ExecWith(t, p, sb, providers.ExecSpec{
		Argv:    []string{"sh", "-c", sleepMarker + " & " + sleepMarker},
		Timeout: time.Second,
	})
	if !res.TimedOut || res.ExitCode != 137 {
		t.Errorf("timed-out exec = exit %d, timed out %v; want 137, true", res.ExitCode, res.TimedOut)
	}
	// Neither the command nor its background child survived.
	ps := Exec(t, p, sb, "sh", "-c", `for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' <"$f"; echo; done 2>/dev/null`)
	if strings.Contains(string(ps.Stdout), sleepMarker) {
		t.Errorf("processes left after the timeout:\n%s", ps.Stdout)
	}
}

func testSignal(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	for _, tt := range []struct {
		sig  string
		want int
	}{{"TERM", 143}, {"KILL", 137}} {
		res := Exec(t, p, sb, "sh", "-c", "kill -"+tt.sig+" $$")
		if res.ExitCode != tt.want || res.TimedOut {
			t.Errorf("kill -%s = exit %d, timed out %v; want %d, false", tt.sig, res.ExitCode, res.TimedOut, tt.want)
		}
	}
}

func testFileRoundTrip(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	ctx := t.Context()
	name := "/tmp/pt-roundtrip/a/b/c/file"
	data := allBytes(3)
	if err := providers.WriteFileBytes(ctx, p, sb, name, data); err != nil {
		t.Fatalf("WriteFile creating parents: %v", err)
	}
	got, err := providers.ReadFileBytes(ctx, p, sb, name, int64(len(data)))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadFile = %d bytes, %v; want the %d bytes written", len(got), err, len(data))
	}
	if err := providers.WriteFileBytes(ctx, p, sb, name, []byte("short")); err != nil {
		t.Fatalf("WriteFile replacing: %v", err)
	}
	if got, err := providers.ReadFileBytes(ctx, p, sb, name, 100); err != nil || string(got) != "short" {
		t.Errorf("ReadFile after replace = %q, %v; want %q", got, err, "short")
	}
	if err := providers.WriteFileBytes(ctx, p, sb, name, nil); err != nil {
		t.Fatalf("WriteFile empty: %v", err)
	}
	if got, err := providers.ReadFileBytes(ctx, p, sb, name, 0); err != nil || len(got) != 0 {
		t.Errorf("ReadFile of an empty file with max 0 = %q, %v; want empty", got, err)
	}

	// The content is streamed: ReadFile counts what it wrote, and a
	// WriteFile whose reader fails part way leaves the old file whole.
	if err := providers.WriteFileBytes(ctx, p, sb, name, data); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	var buf bytes.Buffer
	if n, err := p.ReadFile(ctx, sb, name, int64(len(data)), &buf); err != nil || n != int64(len(data)) || !bytes.Equal(buf.Bytes(), data) {
		t.Errorf("ReadFile = %d bytes counted, %d written, %v; want %d of the file", n, buf.Len(), err, len(data))
	}
	errCut := errors.New("providertest: reader cut short")
	cut := io.MultiReader(bytes.NewReader([]byte("partial")), iotest.ErrReader(errCut))
	if err := p.WriteFile(ctx, sb, name, cut); !errors.Is(err, errCut) {
		t.Errorf("WriteFile with a failing reader error = %v; want it to wrap the reader's", err)
	}
	if got, err := providers.ReadFileBytes(ctx, p, sb, name, int64(len(data))); err != nil || !bytes.Equal(got, data) {
		t.Errorf("file after a WriteFile whose reader failed = %d bytes, %v; want the %d bytes before", len(got), err, len(data))
	}
	if err := p.WriteFile(ctx, sb, "/tmp/pt-roundtrip/never", io.MultiReader(bytes.NewReader([]byte("x")), iotest.ErrReader(errCut))); !errors.Is(err, errCut) {
		t.Errorf("WriteFile of a new file with a failing reader error = %v; want it to wrap the reader's", err)
	}
	if _, err := providers.ReadFileBytes(ctx, p, sb, "/tmp/pt-roundtrip/never", 10); !errors.Is(err, providers.ErrFileNotFound) {
		t.Errorf("ReadFile of a file whose only write failed = %v; want ErrFileNotFound", err)
	}
}

func testFileErrors(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	ctx := t.Context()
	const file = "/tmp/pt-errors/file"
	if err := providers.WriteFileBytes(ctx, p, sb, file, make([]byte, 100)); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	for _, tt := range []struct {
		path string
		max  int64
		want error
	}{
		{"/tmp/pt-errors/missing", 100, providers.ErrFileNotFound},
		{"/tmp/pt-errors/no/such/dir/file", 100, providers.ErrFileNotFound},
		{"/tmp/pt-errors", 100, providers.ErrNotAFile},
		{"/tmp", 100, providers.ErrNotAFile},
		{file, 99, providers.ErrFileTooLarge},
		{file, 100, nil},
	} {
		got, err := providers.ReadFileBytes(ctx, p, sb, tt.path, tt.max)
		if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
			t.Errorf("ReadFile(%q, %d) error = %v; want %v", tt.path, tt.max, err, tt.want)
		}
		if tt.want != nil && got != nil {
			t.Errorf("ReadFile(%q, %d) returned %d bytes with an error", tt.path, tt.max, len(got))
		}
	}
	// An empty directory is not a file either (a vendor's listing of it
	// may look like that of nothing at all).
	const empty = "/tmp/pt-errors/empty"
	Exec(t, p, sb, "mkdir", "-p", empty)
	if _, err := providers.ReadFileBytes(ctx, p, sb, empty, 100); !errors.Is(err, providers.ErrNotAFile) {
		t.Errorf("ReadFile(%q) of an empty directory error = %v; want ErrNotAFile", empty, err)
	}
	for _, path := range []string{"/tmp/pt-errors", "/tmp", file + "/below", empty} {
		if err := providers.WriteFileBytes(ctx, p, sb, path, []byte("x")); !errors.Is(err, providers.ErrNotAFile) {
			t.Errorf("WriteFile(%q) error = %v; want ErrNotAFile", path, err)
		}
	}
	if got, err := providers.ReadFileBytes(ctx, p, sb, file, 100); err != nil || len(got) != 100 {
		t.Errorf("file after refused writes = %d bytes, %v; want 100 bytes", len(got), err)
	}
}

func testFileVisibleToExec(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	ctx := t.Context()
	if err := providers.WriteFileBytes(ctx, p, sb, "/tmp/pt-visible/from-write", []byte("written")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if res := Exec(t, p, sb, "cat", "/tmp/pt-visible/from-write"); string(res.Stdout) != "written" {
		t.Errorf("cat of a written file = %q, exit %d; want %q", res.Stdout, res.ExitCode, "written")
	}
	Exec(t, p, sb, "sh", "-c", "printf executed > /tmp/pt-visible/from-exec")
	if got, err := providers.ReadFileBytes(ctx, p, sb, "/tmp/pt-visible/from-exec", 100); err != nil || string(got) != "executed" {
		t.Errorf("ReadFile of a file an exec wrote = %q, %v; want %q", got, err, "executed")
	}
}

func testStatePersists(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	res := Exec(t, p, sb, "sh", "-c", `mkdir -p /workspace &&
		printf 1 >/tmp/pt-persist && printf 2 >"$HOME/pt-persist" && printf 3 >/workspace/pt-persist`)
	if res.ExitCode != 0 {
		t.Fatalf("writing state: exit %d: %s", res.ExitCode, res.Stderr)
	}
	res = Exec(t, p, sb, "sh", "-c", `cat /tmp/pt-persist "$HOME/pt-persist" /workspace/pt-persist`)
	if got := string(res.Stdout); got != "123" {
		t.Errorf("state read by the next exec = %q (%s); want %q", got, res.Stderr, "123")
	}
}

func testTerminate(t *testing.T, p providers.Provider, _ providers.Sandbox) {
	ctx := t.Context()
	spec := Spec(t)
	sb := Create(t, p, spec)
	Exec(t, p, sb, "true")
	if got, ok := find(t, p, sb); !ok {
		t.Errorf("List does not contain a created sandbox")
	} else if got.Labels[providers.LabelWorkspace] != spec.WorkspaceID || got.Labels[providers.LabelInstance] != spec.InstanceID || got.Labels[providers.LabelBroker] == "" {
		// The orphan sweep finds a sandbox's record by these labels.
		t.Errorf("List labels = %v; want workspace %q, instance %q and the broker's id", got.Labels, spec.WorkspaceID, spec.InstanceID)
	}

	if err := p.Terminate(ctx, sb); err != nil {
		t.Fatalf("Terminate: %v", err)
	}
	if err := p.Terminate(ctx, sb); err != nil {
		t.Errorf("second Terminate: %v; want nil", err)
	}
	if _, ok := find(t, p, sb); ok {
		t.Errorf("List contains a terminated sandbox")
	}
	if _, err := p.Exec(ctx, sb, providers.ExecSpec{Argv: []string{"true"}, Timeout: time.Minute}); !errors.Is(err, providers.ErrSandboxGone) {
		t.Errorf("Exec after Terminate error = %v; want ErrSandboxGone", err)
	}
	if _, err := providers.ReadFileBytes(ctx, p, sb, "/tmp/x", 10); !errors.Is(err, providers.ErrSandboxGone) {
		t.Errorf("ReadFile after Terminate error = %v; want ErrSandboxGone", err)
	}
	if err := providers.WriteFileBytes(ctx, p, sb, "/tmp/x", nil); !errors.Is(err, providers.ErrSandboxGone) {
		t.Errorf("WriteFile after Terminate error = %v; want ErrSandboxGone", err)
	}
}

// testTerminateRunning checks that Terminate ends a command in flight: the
// command would otherwise run into its timeout.
func testTerminateRunning(t *testing.T, p providers.Provider, _ providers.Sandbox) {
	sb := Create(t, p, Spec(t))
	done := startRunning(t, t.Context(), p, sb, "/tmp/pt-terminate-started")
	if err := p.Terminate(t.Context(), sb); err != nil {
		t.Fatalf("Terminate: %v", err)
	}
	r := <-done
	if r.err == nil && (r.res.TimedOut || r.res.ExitCode == 0) {
		t.Errorf("Exec across Terminate = exit %d, timed out %v; want ErrSandboxGone or killed", r.res.ExitCode, r.res.TimedOut)
	}
	if r.err != nil && !errors.Is(r.err, providers.ErrSandboxGone) {
		t.Errorf("Exec across Terminate error = %v; want ErrSandboxGone", r.err)
	}
}

// testContextCancel checks that canceling Exec's context ends the command
// and every process it started.
func testContextCancel(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := startRunning(t, ctx, p, sb, "/tmp/pt-cancel-started")
	cancel()
	if r := <-done; !errors.Is(r.err, context.Canceled) {
		t.Errorf("Exec with a canceled context = %+v, %v; want context.Canceled", r.res, r.err)
	}
	ps := Exec(t, p, sb, "sh", "-c", `for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' <"$f"; echo; done 2>/dev/null`)
	if strings.Contains(string(ps.Stdout), cancelMarker) {
		t.Errorf("processes left after the cancel:\n%s", ps.Stdout)
	}
}

// RunContextCancel runs the suite's context-cancel case alone, on a new
// sandbox of the provider newProvider returns: for a fake set up to make
// the cancel harder than the plain suite does.
func RunContextCancel(t *testing.T, newProvider func(t *testing.T) providers.Provider) {
	p := newProvider(t)
	testContextCancel(t, p, Create(t, p, Spec(t)))
}

// cancelMarker makes startRunning's processes recognizable.
const cancelMarker = "sleep 319"

type execResult struct {
	res providers.ExecResult
	err error
}

// startRunning starts a command with a child in sb that runs for minutes,
// and returns once it runs; the channel gets Exec's outcome.
func startRunning(t *testing.T, ctx context.Context, p providers.Provider, sb providers.Sandbox, started string) <-chan execResult {
	t.Helper()
	done := make(chan execResult, 1)
	go func() {
		res, err := p.Exec(ctx, sb, providers.ExecSpec{
			Argv:    []string{"sh", "-c", `touch "$0"; ` + cancelMarker + " & " + cancelMarker, started},
			Timeout: 60 * time.Second,
		})
		done <- execResult{res, err}
	}()
	for {
		_, err := providers.ReadFileBytes(t.Context(), p, sb, started, 0)
		if err == nil {
			return done
		}
		if !errors.Is(err, providers.ErrFileNotFound) {
			t.Fatalf("ReadFile while waiting for the command: %v", err)
		}
		select {
		case r := <-done:
			t.Fatalf("command ended early: %+v, %v", r.res, r.err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// find returns sb as List reports it.
func find(t *testing.T, p providers.Provider, sb providers.Sandbox) (providers.Sandbox, bool) {
	t.Helper()
	all, err := p.List(t.Context())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, s := range all {
		if s.Ref == sb.Ref {
			return s, true
		}
	}
	return providers.Sandbox{}, false
}
