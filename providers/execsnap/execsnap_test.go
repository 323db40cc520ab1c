//go:build linux

package execsnap_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/blobstore"
	"github.com/sandgate/sandgate/providers/execsnap"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// The snapshots run through real bwrap sandboxes of the local provider:
// the same Exec a vendor provider offers.
func setup(t *testing.T, cfg execsnap.Config) (*local.Provider, *execsnap.Snapshotter, *blobstore.Dir) {
	t.Helper()
	p, err := local.New(t.Context(), local.Config{DataDir: t.TempDir()}, providers.Env{BrokerID: "execsnap-test"})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { p.Close() }) // before its data directory goes

	store, err := blobstore.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return p, execsnap.New(p, store, cfg), store
}

// tree lists a directory the way a snapshot must keep it: types, modes,
// symlink targets and contents' hashes.
const tree = `cd "$1" && find . | LC_ALL=C sort | while read -r f; do
  if [ -L "$f" ]; then echo "$f link $(readlink "$f")";
  elif [ -d "$f" ]; then echo "$f dir $(stat -c %a "$f")";
  else echo "$f file $(stat -c %a "$f") $(sha256sum <"$f" | cut -c1-16)"; fi; done`

func TestSnapshotRestore(t *testing.T) {
	t.Parallel()
	// Chunks of 1000 bytes: the archive crosses many of them.
	p, s, store := setup(t, execsnap.Config{ChunkBytes: 1000})
	ctx := context.Background()
	src := providertest.Create(t, p, providertest.Spec(t))
	providertest.Exec(t, p, src, "sh", "-c", `set -e; d=/workspace/proj; mkdir -p $d/sub/empty
head -c 20000 /dev/urandom >$d/bin; printf 'x\0y\377' >$d/sub/nul; echo hi >$d/run.sh; chmod 755 $d/run.sh
ln -s run.sh $d/link; chmod 700 $d/sub`)
	want := providertest.Exec(t, p, src, "sh", "-c", tree, "sh", "/workspace/proj")
	ref, err := s.Snapshot(ctx, src, providers.SnapshotSpec{ID: "snap_t1", Dir: "/workspace/proj"})
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	rc, size, err := store.Open(ctx, "snap_t1")
	if err != nil || size != ref.Bytes || size < 20000 {
		t.Errorf("stored %d bytes (%v); want the ref's %d, at least the 20000 random ones", size, err, ref.Bytes)
	}
	if rc != nil {
		rc.Close()
	}
	if left := providertest.Exec(t, p, src, "sh", "-c", "ls /tmp | grep -c sandgate-snap || true"); strings.TrimSpace(string(left.Stdout)) != "0" {
		t.Errorf("archive left in the sandbox: %s", left.Stdout)
	}
	dst := providertest.Create(t, p, providertest.Spec(t))
	if err := s.Restore(ctx, dst, ref, "/workspace/proj"); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	got := providertest.Exec(t, p, dst, "sh", "-c", tree, "sh", "/workspace/proj")
	if string(got.Stdout) != string(want.Stdout) || len(want.Stdout) == 0 {
		t.Errorf("restored tree:\n%s\nwant:\n%s", got.Stdout, want.Stdout)
	}
	if err := s.Delete(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if err := s.Restore(ctx, dst, ref, "/workspace/again"); !errors.Is(err, providers.ErrSnapshotGone) {
		t.Errorf("Restore after Delete = %v; want ErrSnapshotGone", err)
	}
	if err := s.Delete(ctx, ref); err != nil {
		t.Errorf("second Delete = %v; want nil", err)
	}
}

func TestSnapshotErrors(t *testing.T) {
	t.Parallel()
	p, s, store := setup(t, execsnap.Config{MaxBytes: 4096})
	ctx := context.Background()
	sb := providertest.Create(t, p, providertest.Spec(t))
	providertest.Exec(t, p, sb, "sh", "-c", "mkdir -p /workspace/big && head -c 100000 /dev/urandom >/workspace/big/r && echo x >/workspace/f")
	for _, tt := range []struct {
		dir   string
		quota int64
		want  error
	}{
		{"/workspace/missing", 0, providers.ErrFileNotFound},
		{"/workspace/f", 0, providers.ErrNotAFile},
		{"/workspace/big", 0, providers.ErrFileTooLarge},
		{"/workspace/big", 1000, providers.ErrSnapshotTooLarge}, // the instance's quota is nearer
	} {
		_, err := s.Snapshot(ctx, sb, providers.SnapshotSpec{ID: "snap_err", Dir: tt.dir, MaxBytes: tt.quota})
		if !errors.Is(err, tt.want) {
			t.Errorf("Snapshot(%s) = %v; want %v", tt.dir, err, tt.want)
		}
		if _, _, err := store.Open(ctx, "snap_err"); !errors.Is(err, blobstore.ErrNotFound) {
			t.Errorf("after Snapshot(%s) failed the store has the blob (%v)", tt.dir, err)
		}
	}
}

// printer is an Execer whose sandbox answers every command with exit 0
// and out: a tenant who replaced the tools the scripts call.
type printer struct{ out string }

func (pr printer) Exec(context.Context, providers.Sandbox, providers.ExecSpec) (providers.ExecResult, error) {
	return providers.ExecResult{Stdout: []byte(pr.out)}, nil
}

// TestSnapshotErrorQuotesNoOutput: what the sandbox printed in place of
// the archive's size never reaches the error, which the broker logs.
func TestSnapshotErrorQuotesNoOutput(t *testing.T) {
	t.Parallel()
	store, err := blobstore.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const secret = "tenant-output-s3cret"
	s := execsnap.New(printer{secret}, store, execsnap.Config{})
	_, err = s.Snapshot(t.Context(), providers.Sandbox{Ref: "sb"}, providers.SnapshotSpec{ID: "snap_q", Dir: "/workspace"})
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("Snapshot = %v; want an error that does not quote the sandbox's output", err)
	}
}
