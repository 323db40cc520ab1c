package execfile_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"testing/iotest"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/execfile"
)

// hostExecer runs commands directly on the host, so these tests exercise the
// scripts themselves; providertest runs them again inside real sandboxes.
type hostExecer struct {
	last providers.ExecResult // the result of the latest Exec
}

func (h *hostExecer) Exec(ctx context.Context, _ providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	cmd := exec.CommandContext(ctx, spec.Argv[0], spec.Argv[1:]...)
	cmd.Stdin = bytes.NewReader(spec.Stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var res providers.ExecResult
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.ExitCode = ee.ExitCode()
	case err != nil:
		return res, err
	}
	res.StdoutBytes = int64(stdout.Len())
	res.StderrBytes = int64(stderr.Len())
	res.Stdout = stdout.Bytes()
	if res.StdoutBytes > spec.MaxOutputBytes {
		res.Stdout = res.Stdout[:spec.MaxOutputBytes]
		res.StdoutTruncated = true
	}
	h.last = res
	return res, nil
}

// fixedExecer returns one canned result.
type fixedExecer providers.ExecResult

func (f fixedExecer) Exec(context.Context, providers.Sandbox, providers.ExecSpec) (providers.ExecResult, error) {
	return providers.ExecResult(f), nil
}

var sb = providers.Sandbox{Ref: "test"}

func allBytes() []byte {
	b := make([]byte, 256*3)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "bin"), allBytes(), 0o644)
	mustWrite(t, filepath.Join(dir, "empty"), nil, 0o644)
	mustWrite(t, filepath.Join(dir, "ten"), []byte("0123456789"), 0o644)
	mustWrite(t, filepath.Join(dir, "-dash $HOME `x` 'q' \"d\"\n"), []byte("odd"), 0o644)
	if err := os.Symlink("bin", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("nowhere", filepath.Join(dir, "dangling")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dir, filepath.Join(dir, "dirlink")); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		max     int64
		want    []byte
		wantErr error
	}{
		{"bin", 1 << 20, allBytes(), nil},
		{"empty", 10, []byte{}, nil},
		{"ten", 10, []byte("0123456789"), nil},
		{"ten", 9, nil, providers.ErrFileTooLarge},
		{"ten", -1, nil, providers.ErrFileTooLarge},
		{"-dash $HOME `x` 'q' \"d\"\n", 10, []byte("odd"), nil},
		{"link", 1 << 20, allBytes(), nil},
		{"missing", 10, nil, providers.ErrFileNotFound},
		{"dangling", 10, nil, providers.ErrFileNotFound},
		{"ten/below", 10, nil, providers.ErrFileNotFound},
		{".", 10, nil, providers.ErrNotAFile},
		{"dirlink", 10, nil, providers.ErrNotAFile},
	}
	for _, tt := range tests {
		ex := &hostExecer{}
		got, err := readFile(t, ex, filepath.Join(dir, tt.name), tt.max)
		if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
			t.Errorf("ReadFile(%q, %d) error = %v; want %v", tt.name, tt.max, err, tt.wantErr)
			continue
		}
		if !bytes.Equal(got, tt.want) || (got == nil) != (tt.want == nil) {
			t.Errorf("ReadFile(%q, %d) = %q; want %q", tt.name, tt.max, got, tt.want)
		}
		if errors.Is(err, providers.ErrFileTooLarge) && ex.last.StdoutBytes != 0 {
			t.Errorf("ReadFile(%q, %d) transferred %d bytes of a file over max; want 0", tt.name, tt.max, ex.last.StdoutBytes)
		}
	}
}

func TestReadFileGrew(t *testing.T) {
	// The sandbox reported more bytes than max: the file grew after the size
	// check, and the read must fail rather than return a cut file.
	ex := fixedExecer{Stdout: []byte("0123"), StdoutBytes: 5, StdoutTruncated: true}
	if _, err := readFile(t, ex, "/f", 3); !errors.Is(err, providers.ErrFileTooLarge) {
		t.Errorf("ReadFile of a grown file error = %v; want ErrFileTooLarge", err)
	}
}

func TestReadFileLost(t *testing.T) {
	// The provider lost the rest of the output (a stream that failed): the
	// bytes are within max yet flagged cut. The read fails, and not as a
	// file too large, which it is not.
	ex := fixedExecer{Stdout: []byte("01"), StdoutBytes: 2, StdoutTruncated: true}
	_, err := readFile(t, ex, "/f", 10)
	if err == nil || errors.Is(err, providers.ErrFileTooLarge) {
		t.Errorf("ReadFile of a content cut short error = %v; want an error other than ErrFileTooLarge", err)
	}
}

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	ex := &hostExecer{}
	write := func(name string, data []byte) error {
		return execfile.WriteFile(t.Context(), ex, sb, dir+"/"+name, bytes.NewReader(data)) // not Join: keep a trailing slash
	}

	if err := write("a/b/c/bin", allBytes()); err != nil {
		t.Fatalf("WriteFile creating parents: %v", err)
	}
	checkFile(t, filepath.Join(dir, "a/b/c/bin"), allBytes(), 0o644)

	if err := write("a/b/c/bin", []byte("short")); err != nil {
		t.Fatalf("WriteFile replacing: %v", err)
	}
	checkFile(t, filepath.Join(dir, "a/b/c/bin"), []byte("short"), 0o644)

	if err := write("empty", nil); err != nil {
		t.Fatalf("WriteFile empty: %v", err)
	}
	checkFile(t, filepath.Join(dir, "empty"), []byte{}, 0o644)

	name := "-dash $HOME `x` 'q' \"d\"\n"
	if err := write(name, []byte("odd")); err != nil {
		t.Fatalf("WriteFile odd name: %v", err)
	}
	checkFile(t, filepath.Join(dir, name), []byte("odd"), 0o644)

	mustWrite(t, filepath.Join(dir, "tool"), []byte("old"), 0o700)
	if err := write("tool", []byte("#!/bin/sh\n")); err != nil {
		t.Fatalf("WriteFile over an executable: %v", err)
	}
	checkFile(t, filepath.Join(dir, "tool"), []byte("#!/bin/sh\n"), 0o755)

	// A final symlink is followed: its target is replaced, the link stays.
	if err := os.Symlink("target", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := write("link", []byte("via link")); err != nil {
		t.Fatalf("WriteFile through a symlink: %v", err)
	}
	checkFile(t, filepath.Join(dir, "target"), []byte("via link"), 0o644)
	if fi, err := os.Lstat(filepath.Join(dir, "link")); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("WriteFile through a symlink replaced the link itself (%v)", err)
	}

	// A parent that is a dangling symlink is not a directory either: the
	// write is refused as such (never an unexplained failure, which a
	// client would retry), and nothing is made where the link points.
	if err := os.Symlink(filepath.Join(dir, "nowhere"), filepath.Join(dir, "dangling")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a/b", "a/b/", "a/b/c/bin/", "a/b/c/bin/below", "a/b/c/bin/x/y", ".", "dangling/f", "dangling/sub/f"} {
		if err := write(name, []byte("x")); !errors.Is(err, providers.ErrNotAFile) {
			t.Errorf("WriteFile(%q) error = %v; want ErrNotAFile", name, err)
		}
	}
	checkFile(t, filepath.Join(dir, "a/b/c/bin"), []byte("short"), 0o644)
	if _, err := os.Lstat(filepath.Join(dir, "nowhere")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a write below a dangling symlink made its target (%v)", err)
	}

	// No temporary file is left behind, on success or on failure.
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && bytes.HasPrefix([]byte(d.Name()), []byte(".sandgate-write-")) {
			t.Errorf("temporary file left behind: %s", p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestBadPath(t *testing.T) {
	for _, p := range []string{"", "rel/path", "/nul\x00byte"} {
		if _, err := readFile(t, &hostExecer{}, p, 10); !errors.Is(err, fs.ErrInvalid) {
			t.Errorf("ReadFile(%q) error = %v; want fs.ErrInvalid", p, err)
		}
		if err := execfile.WriteFile(t.Context(), &hostExecer{}, sb, p, bytes.NewReader(nil)); !errors.Is(err, fs.ErrInvalid) {
			t.Errorf("WriteFile(%q) error = %v; want fs.ErrInvalid", p, err)
		}
	}
}

func TestExitMapping(t *testing.T) {
	tests := []struct {
		res     providers.ExecResult
		wantErr error // nil: any non-nil error that is none of the provider errors
	}{
		{providers.ExecResult{ExitCode: 137, TimedOut: true}, nil},
		{providers.ExecResult{ExitCode: 1}, nil},
		{providers.ExecResult{ExitCode: 127}, nil},
		{providers.ExecResult{ExitCode: 81}, providers.ErrFileNotFound},
		{providers.ExecResult{ExitCode: 82}, providers.ErrNotAFile},
		{providers.ExecResult{ExitCode: 83}, providers.ErrFileTooLarge},
		{providers.ExecResult{ExitCode: 84}, providers.ErrNotWritable},
	}
	for _, tt := range tests {
		_, err := readFile(t, fixedExecer(tt.res), "/f", 10)
		switch {
		case err == nil:
			t.Errorf("ReadFile with result %+v = nil error; want one", tt.res)
		case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
			t.Errorf("ReadFile with result %+v error = %v; want %v", tt.res, err, tt.wantErr)
		case tt.wantErr == nil && (errors.Is(err, providers.ErrFileNotFound) || errors.Is(err, providers.ErrNotAFile) ||
			errors.Is(err, providers.ErrFileTooLarge) || errors.Is(err, providers.ErrNotWritable)):
			t.Errorf("ReadFile with result %+v error = %v; want a plain error", tt.res, err)
		}
	}
}

// readFile reads through execfile.ReadFile into memory, nil on an error;
// it checks that the count returned is what reached the writer.
func readFile(t *testing.T, ex execfile.Execer, path string, max int64) ([]byte, error) {
	t.Helper()
	var b bytes.Buffer
	n, err := execfile.ReadFile(t.Context(), ex, sb, path, max, &b)
	if n != int64(b.Len()) {
		t.Errorf("ReadFile returned %d bytes written; the writer got %d", n, b.Len())
	}
	if err != nil {
		return nil, err
	}
	return append([]byte{}, b.Bytes()...), nil
}

// TestReadFileStreams checks that the content reaches the writer from a
// provider that writes to ExecSpec.Stdout, not only from one that returns
// it in the result.
func TestReadFileStreams(t *testing.T) {
	want := allBytes()
	ex := streamExecer{out: want}
	got, err := readFile(t, ex, "/f", int64(len(want)))
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("ReadFile through Stdout = %d bytes, %v; want the %d bytes", len(got), err, len(want))
	}
}

// streamExecer writes out to spec.Stdout, as the local provider does.
type streamExecer struct{ out []byte }

func (s streamExecer) Exec(_ context.Context, _ providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	if _, err := spec.Stdout.Write(s.out); err != nil {
		return providers.ExecResult{}, err
	}
	return providers.ExecResult{StdoutBytes: int64(len(s.out))}, nil
}

// TestWriteFileFailingReader checks that a reader that fails part way
// (a request cut short) leaves the file as it was, and nothing else.
func TestWriteFileFailingReader(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "f")
	mustWrite(t, name, []byte("old"), 0o644)
	boom := errors.New("body cut short")
	r := io.MultiReader(bytes.NewReader([]byte("new content")), iotest.ErrReader(boom))
	if err := execfile.WriteFile(t.Context(), &hostExecer{}, sb, name, r); !errors.Is(err, boom) {
		t.Errorf("WriteFile with a failing reader error = %v; want it to wrap the reader's", err)
	}
	checkFile(t, name, []byte("old"), 0o644)
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 {
		t.Errorf("directory after a failed write holds %d entries (%v); want only the file", len(entries), err)
	}
}

func mustWrite(t *testing.T, name string, data []byte, mode fs.FileMode) {
	t.Helper()
	if err := os.WriteFile(name, data, mode); err != nil {
		t.Fatal(err)
	}
}

func checkFile(t *testing.T, name string, want []byte, wantMode fs.FileMode) {
	t.Helper()
	got, err := os.ReadFile(name)
	if err != nil {
		t.Errorf("read back: %v", err)
		return
	}
	if !bytes.Equal(got, want) {
		t.Errorf("file content = %q; want %q", got, want)
	}
	fi, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != wantMode {
		t.Errorf("file mode = %v; want %v", fi.Mode().Perm(), wantMode)
	}
}
