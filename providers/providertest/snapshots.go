package providertest

import (
	"context"
	"errors"
	"testing"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
)

// snapTree builds a tree in $1 that shows what a snapshot must keep: file
// contents of every byte value, exact modes (0000 and setgid included),
// relative, absolute and dangling symlinks, a hard link, empty and nested
// empty directories, a read-only directory with a file in it, and a name
// with spaces.
const snapTree = `set -e
mkdir -p "$1" && cd "$1"
printf 'plain\n' >plain
i=0; while [ $i -lt 256 ]; do printf "\\$(printf %o $i)"; i=$((i+1)); done >bytes
printf '#!/bin/sh\necho hi\n' >run.sh && chmod 0755 run.sh
printf secret >private && chmod 0600 private
printf ro >readonly && chmod 0444 readonly
printf none >nothing && chmod 0000 nothing
printf g >setgid && chmod 2750 setgid
printf 'with space' >'a name with spaces'
mkdir -p empty nested/empty/deeper sub/inner
chmod 0700 nested
printf inner >sub/inner/file
ln -s plain link-rel
ln -s /etc/hosts link-abs
ln -s does-not-exist link-dangling
ln -s sub link-dir
ln plain hardlink
mkdir locked && printf in >locked/file && chmod 0555 locked
chmod 0751 .
`

// snapList prints one line per entry of $1, sorted: path, type, mode,
// link count, and a checksum of the content or the link's target.
const snapList = `cd "$1" || exit 1
find . | LC_ALL=C sort | while IFS= read -r f; do
	if [ -L "$f" ]; then printf '%s L %s\n' "$f" "$(readlink "$f")"
	elif [ -d "$f" ]; then printf '%s D %s\n' "$f" "$(stat -c %a "$f")"
	else printf '%s F %s %s %s\n' "$f" "$(stat -c '%a %h' "$f")" "$( [ -r "$f" ] && cksum <"$f")" "$(stat -c %s "$f")"
	fi
done
`

// snapDir is where the snapshot cases build their trees.
const snapDir = "/workspace/pt-snap/project"

func testSnapshotRestore(t *testing.T, p providers.Provider, _ providers.Sandbox) {
	ctx := t.Context()
	src := Create(t, p, Spec(t))
	if res := Exec(t, p, src, "sh", "-c", snapTree, "sh", snapDir); res.ExitCode != 0 {
		t.Fatalf("building the tree: exit %d: %s", res.ExitCode, res.Stderr)
	}
	want := Exec(t, p, src, "sh", "-c", snapList, "sh", snapDir)
	if want.ExitCode != 0 || len(want.Stdout) == 0 {
		t.Fatalf("listing the tree: exit %d: %s", want.ExitCode, want.Stderr)
	}
	id := sandgate.NewID(sandgate.PrefixSnapshot)
	ref, err := p.Snapshot(ctx, src, providers.SnapshotSpec{ID: id, InstanceID: "inst_pt", Dir: snapDir})
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	t.Cleanup(func() { p.DeleteSnapshot(context.Background(), ref) })
	if ref.ID != id {
		t.Errorf("Snapshot ref ID = %q; want %q", ref.ID, id)
	}
	// The stored size counts against max_snapshot_bytes: never unknown.
	if ref.Bytes <= 0 {
		t.Errorf("Snapshot ref Bytes = %d; want the stored size", ref.Bytes)
	}
	// A change after the snapshot is not in it.
	Exec(t, p, src, "sh", "-c", `printf changed >"$1/plain"; rm -r "$1/empty"`, "sh", snapDir)

	dst := Create(t, p, Spec(t))
	if err := p.Restore(ctx, dst, ref, snapDir); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	got := Exec(t, p, dst, "sh", "-c", snapList, "sh", snapDir)
	if string(got.Stdout) != string(want.Stdout) {
		t.Errorf("restored tree:\n%s\nwant:\n%s", got.Stdout, want.Stdout)
	}
	// A snapshot restores as often as asked, also into a directory that exists.
	if err := p.Restore(ctx, dst, ref, snapDir); err != nil {
		t.Fatalf("second Restore: %v", err)
	}
}

func testSnapshotErrors(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	ctx := t.Context()
	Exec(t, p, sb, "sh", "-c", "mkdir -p /workspace/pt-snaperr && printf x >/workspace/pt-snaperr/file")
	for _, tt := range []struct {
		dir  string
		want error
	}{
		{"/workspace/pt-snaperr/missing", providers.ErrFileNotFound},
		{"/workspace/pt-snaperr/file", providers.ErrNotAFile},
	} {
		ref, err := p.Snapshot(ctx, sb, providers.SnapshotSpec{ID: sandgate.NewID(sandgate.PrefixSnapshot), InstanceID: "inst_pt", Dir: tt.dir})
		if !errors.Is(err, tt.want) {
			t.Errorf("Snapshot(%q) = %+v, %v; want %v", tt.dir, ref, err, tt.want)
		}
	}
	gone := Create(t, p, Spec(t))
	if err := p.Terminate(ctx, gone); err != nil {
		t.Fatalf("Terminate: %v", err)
	}
	_, err := p.Snapshot(ctx, gone, providers.SnapshotSpec{ID: sandgate.NewID(sandgate.PrefixSnapshot), Dir: "/workspace"})
	if !errors.Is(err, providers.ErrSandboxGone) {
		t.Errorf("Snapshot of a terminated sandbox = %v; want ErrSandboxGone", err)
	}
}

func testSnapshotDelete(t *testing.T, p providers.Provider, sb providers.Sandbox) {
	ctx := t.Context()
	Exec(t, p, sb, "sh", "-c", "mkdir -p /tmp/pt-snapdel && printf x >/tmp/pt-snapdel/f")
	ref, err := p.Snapshot(ctx, sb, providers.SnapshotSpec{ID: sandgate.NewID(sandgate.PrefixSnapshot), InstanceID: "inst_pt", Dir: "/tmp/pt-snapdel"})
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if err := p.DeleteSnapshot(ctx, ref); err != nil {
		t.Fatalf("DeleteSnapshot: %v", err)
	}
	if err := p.DeleteSnapshot(ctx, ref); err != nil {
		t.Errorf("second DeleteSnapshot = %v; want nil", err)
	}
	if err := p.DeleteSnapshot(ctx, providers.SnapshotRef{ID: sandgate.NewID(sandgate.PrefixSnapshot)}); err != nil {
		t.Errorf("DeleteSnapshot of an id never stored = %v; want nil", err)
	}
	dst := Create(t, p, Spec(t))
	if err := p.Restore(ctx, dst, ref, "/tmp/pt-snapdel"); !errors.Is(err, providers.ErrSnapshotGone) {
		t.Errorf("Restore of a deleted snapshot = %v; want ErrSnapshotGone", err)
	}
}
