package local_test

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/providertest"
	"golang.org/x/sys/unix"
)

// runnerPID returns the host pid of a durable command's runner.
func runnerPID(t *testing.T, dataDir string, sb providers.Sandbox, id string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "workspaces", sb.Ref, "commands", id, "host.pid"))
	if err != nil {
		t.Fatalf("host.pid: %v", err)
	}
	pid, _ := strconv.Atoi(strings.Fields(string(b))[0])
	return pid
}

// procField returns field n (1-based) of /proc/pid/stat, or "" when the
// process is gone.
func procField(pid, n int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return f[n-3]
}

func gone(pid int) bool {
	st := procField(pid, 3)
	return st == "" || st == "Z"
}

// TestCommandOutlivesProvider starts a command with one Provider and
// reads it with another on the same data directory, as a restarted broker
// would: the runner leads its own session, so the broker's death does not
// reach it.
func TestCommandOutlivesProvider(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	p1 := newProvider(t, dataDir, broker)
	sb := providertest.Create(t, p1, providertest.Spec(t))
	err := p1.StartCommand(t.Context(), sb, "survivor", providers.ExecSpec{
		Argv: []string{"sh", "-c", "sleep 1; echo done; exit 4"}, Timeout: time.Minute, MaxOutputBytes: 100,
	})
	if err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
	pid := runnerPID(t, dataDir, sb, "survivor")
	if sid := procField(pid, 6); sid != strconv.Itoa(pid) {
		t.Errorf("runner session = %s; want its own (%d)", sid, pid)
	}
	p2 := newProvider(t, dataDir, broker)
	st := providertest.WaitCommand(t, p2, sb, "survivor", 100)
	if st.State != providers.CommandCompleted || st.ExitCode != 4 || string(st.Stdout) != "done\n" {
		t.Errorf("command read by another provider = %q exit %d %q; want completed 4 %q", st.State, st.ExitCode, st.Stdout, "done\n")
	}
}

// TestTerminateKillsCommands checks that Terminate by another Provider
// (another broker process) kills a durable command's runner and sandbox.
func TestTerminateKillsCommands(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	p1 := newProvider(t, dataDir, broker)
	sb, err := p1.Create(t.Context(), providertest.Spec(t))
	if err != nil {
		t.Fatal(err)
	}
	const marker = "sleep 331"
	if err := p1.StartCommand(t.Context(), sb, "long", providers.ExecSpec{Argv: []string{"sh", "-c", marker + " & " + marker}, Timeout: time.Hour}); err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
	pid := runnerPID(t, dataDir, sb, "long")
	// Bounds of a minute: a backstop, not a timing assertion (a command's
	// start and a namespace's teardown take seconds on a loaded machine).
	for i := 0; len(hostProcesses(t, marker)) < 2; i++ {
		if i == 6000 {
			t.Fatalf("the command's processes did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	p2 := newProvider(t, dataDir, broker)
	if err := p2.Terminate(t.Context(), sb); err != nil {
		t.Fatalf("Terminate: %v", err)
	}
	for i := 0; !gone(pid) || len(hostProcesses(t, marker)) > 0; i++ {
		if i == 6000 {
			t.Fatalf("runner gone %v, processes left: %v", gone(pid), hostProcesses(t, marker))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSnapshotRefusesOutsideWorkspace(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	sb := providertest.Create(t, p, providertest.Spec(t))
	providertest.Exec(t, p, sb, "sh", "-c", "ln -s /usr /workspace/to-usr && mkdir -p /tmp/ok")
	for _, dir := range []string{"/usr", "/", "/etc", "/proc", "/workspace/to-usr", "/tmp/../usr"} {
		_, err := p.Snapshot(t.Context(), sb, providers.SnapshotSpec{ID: sandgate.NewID(sandgate.PrefixSnapshot), Dir: dir})
		if !errors.Is(err, providers.ErrNotAFile) {
			t.Errorf("Snapshot(%q) = %v; want ErrNotAFile", dir, err)
		}
	}
	for _, dir := range []string{"/workspace", "/root", "/tmp", "/tmp/ok/"} {
		ref, err := p.Snapshot(t.Context(), sb, providers.SnapshotSpec{ID: sandgate.NewID(sandgate.PrefixSnapshot), Dir: dir})
		if err != nil {
			t.Errorf("Snapshot(%q) = %v; want nil", dir, err)
			continue
		}
		p.DeleteSnapshot(t.Context(), ref)
	}
}

func TestSnapshotStorage(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	dataDir := t.TempDir()
	p := newProviderLog(t, dataDir, broker, log)
	const marker = "planted-marker-5c1d"
	sb := providertest.Create(t, p, providertest.Spec(t))
	dir := "/workspace/" + marker
	providertest.Exec(t, p, sb, "sh", "-c", `mkdir -p "$1" && echo "$2" >"$1/$2"`, "sh", dir, marker)
	id := sandgate.NewID(sandgate.PrefixSnapshot)
	ref, err := p.Snapshot(t.Context(), sb, providers.SnapshotSpec{ID: id, Dir: dir})
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	archive := filepath.Join(dataDir, "snapshots", id+".tar.gz")
	fi, err := os.Stat(archive)
	if err != nil || fi.Mode().Perm() != 0o600 || !p.HasSnapshot(id) {
		t.Fatalf("archive = %v, %v; want a 0600 file", fi, err)
	}
	if b, _ := os.ReadFile(archive); len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Errorf("archive is not gzip")
	}
	dst := providertest.Create(t, p, providertest.Spec(t))
	if err := p.Restore(t.Context(), dst, ref, dir); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if err := p.DeleteSnapshot(t.Context(), ref); err != nil {
		t.Fatalf("DeleteSnapshot: %v", err)
	}
	if _, err := os.Stat(archive); !errors.Is(err, os.ErrNotExist) || p.HasSnapshot(id) {
		t.Errorf("archive after DeleteSnapshot: %v; want it removed", err)
	}
	// A temporary archive left by a broker that died mid-snapshot goes too.
	tmp := filepath.Join(dataDir, "snapshots", ".tmp-"+id+"-x")
	os.WriteFile(tmp, nil, 0o600)
	if err := p.DeleteSnapshot(t.Context(), providers.SnapshotRef{ID: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary archive after DeleteSnapshot by id: %v; want it removed", err)
	}
	if strings.Contains(buf.String(), marker) {
		t.Errorf("logs carry a path or content:\n%s", buf.String())
	}
}

// TestCommandStdinNotKept checks, with a real sandbox, that a durable
// command's stdin is no longer on the host's disk once the command runs,
// though the command has not read it yet, and that it still reads it all.
func TestCommandStdinNotKept(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	p := newProvider(t, dataDir, broker)
	sb := providertest.Create(t, p, providertest.Spec(t))
	stdin := bytes.Repeat([]byte("stdin-marker-71c4 "), 1<<15) // over a pipe buffer
	if err := p.StartCommand(t.Context(), sb, "in", providers.ExecSpec{
		Argv:    []string{"sh", "-c", ": >/tmp/started; while [ ! -e /tmp/go ]; do sleep 0.02; done; cat"},
		Timeout: 10 * time.Minute, MaxOutputBytes: 1 << 20, Stdin: stdin,
	}); err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
	for i := 0; providertest.Exec(t, p, sb, "test", "-e", "/tmp/started").ExitCode != 0; i++ {
		if i == 500 {
			t.Fatal("the command did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	dir := filepath.Join(dataDir, "workspaces", sb.Ref, "commands", "in")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range entries {
		if strings.HasPrefix(d.Name(), "stdin") {
			t.Errorf("%s is still in the command's host directory while the command runs", d.Name())
		}
	}
	// Nowhere else under the data directory either, the disk images
	// included.
	err = filepath.WalkDir(dataDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil // the sandbox's own files may come and go
		}
		if ok, err := holds(path, []byte("stdin-marker-71c4")); err == nil && ok {
			t.Errorf("%s holds the command's stdin", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := providers.WriteFileBytes(t.Context(), p, sb, "/tmp/go", nil); err != nil {
		t.Fatal(err)
	}
	st := providertest.WaitCommand(t, p, sb, "in", 1<<20)
	if st.State != providers.CommandCompleted || st.ExitCode != 0 || !bytes.Equal(st.Stdout, stdin) {
		t.Errorf("status = %q exit %d, %d bytes of stdout; want completed 0 with the %d bytes of stdin",
			st.State, st.ExitCode, len(st.Stdout), len(stdin))
	}
}

// holds reports whether the file at path holds marker. It reads only the
// file's data (SEEK_DATA to SEEK_HOLE): a workspace's disk image and its
// template are a gigabyte each, nearly all of it holes, which a whole read
// would spend seconds of zeros on.
func holds(path string, marker []byte) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	fd := int(f.Fd())
	buf := make([]byte, 1<<20)
	for off := int64(0); ; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return false, nil // no data past off
		}
		if err != nil {
			return false, err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return false, err
		}
		// The segment in chunks, each after the last len(marker)-1
		// bytes of the one before, so that a marker across two is seen.
		kept := 0
		for pos := data; pos < hole; {
			n, err := f.ReadAt(buf[kept:kept+int(min(int64(len(buf)-kept), hole-pos))], pos)
			if bytes.Contains(buf[:kept+n], marker) {
				return true, nil
			}
			if n == 0 {
				if err == nil || err == io.EOF {
					break // shrunk meanwhile
				}
				return false, err
			}
			pos += int64(n)
			next := min(len(marker)-1, kept+n)
			copy(buf, buf[kept+n-next:kept+n])
			kept = next
		}
		off = hole
	}
}

// TestHolds checks the scan TestCommandStdinNotKept relies on: a marker
// after a hole and across two of its chunks is found, and an absent one
// is not.
func TestHolds(t *testing.T) {
	t.Parallel()
	marker := []byte("stdin-marker-71c4")
	path := filepath.Join(t.TempDir(), "sparse")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{'x'}, 3<<20)
	copy(data[1<<20-5:], marker) // across the first chunk's end
	if _, err := f.WriteAt(data, 64<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if ok, err := holds(path, marker); err != nil || !ok {
		t.Errorf("holds = %v, %v; want the marker found", ok, err)
	}
	if ok, err := holds(path, []byte("absent-marker")); err != nil || ok {
		t.Errorf("holds(absent) = %v, %v; want false", ok, err)
	}
}

// TestCommandLogsCarryNoContent plants a marker in every part of a durable
// command and checks the logs.
func TestCommandLogsCarryNoContent(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p := newProviderLog(t, t.TempDir(), broker, log)
	const marker = "planted-marker-9e2b"
	sb := providertest.Create(t, p, providertest.Spec(t))
	if err := p.StartCommand(t.Context(), sb, "c", providers.ExecSpec{
		Argv: []string{"sh", "-c", "cat; echo " + marker + " >&2"}, Stdin: []byte(marker), Dir: "/tmp", Timeout: time.Minute, MaxOutputBytes: 100,
	}); err != nil {
		t.Fatal(err)
	}
	if st := providertest.WaitCommand(t, p, sb, "c", 100); string(st.Stdout) != marker {
		t.Errorf("stdout = %q; want %q", st.Stdout, marker)
	}
	p.CancelCommand(t.Context(), sb, "c")
	if strings.Contains(buf.String(), marker) {
		t.Errorf("logs carry argv, stdin or output:\n%s", buf.String())
	}
}
