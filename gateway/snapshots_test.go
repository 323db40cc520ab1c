package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/internal/fakeprovider"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// snapLocal returns a local provider (real bwrap) over a fresh directory.
func snapLocal(t *testing.T) *local.Provider {
	t.Helper()
	p, err := local.New(t.Context(), local.Config{DataDir: t.TempDir()}, providers.Env{BrokerID: "gateway-test"})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(p) }) // before its data directory goes
	return p
}

// snapTree builds a tree that shows what a warm start must bring back:
// contents, modes, symlinks, empty directories.
const snapTree = `set -e
mkdir -p "$1" && cd "$1"
printf 'hello\n' >file
printf '#!/bin/sh\n' >tool && chmod 0755 tool
printf s >secret && chmod 0600 secret
printf r >ro && chmod 0444 ro
printf g >sg && chmod 2711 sg
mkdir -p empty nested/empty sub && chmod 0700 nested
printf deep >sub/deep
ln -s file rel && ln -s /etc/hosts abs && ln -s nowhere dangling && ln -s sub dirlink
mkdir locked && printf in >locked/f && chmod 0555 locked
`

// snapListing prints every entry under $1 with its type, mode, and the
// checksum of its content or its link's target.
const snapListing = `cd "$1" || exit 1
find . | LC_ALL=C sort | while IFS= read -r f; do
	if [ -L "$f" ]; then echo "$f L $(readlink "$f")"
	elif [ -d "$f" ]; then echo "$f D $(stat -c %a "$f")"
	else echo "$f F $(stat -c %a "$f") $(cksum <"$f")"
	fi
done
`

const snapProject = "/workspace/projects/app"

func (e *snapEnv) exec(ws string, argv ...string) *protocol.ExecResponse {
	e.t.Helper()
	res, err := e.cl.Exec(context.Background(), ws, protocol.ExecRequest{Argv: argv})
	if err != nil || res.ExitCode != 0 {
		e.t.Fatalf("Exec(%q) = %+v, %v", argv[:min(len(argv), 3)], res, err)
	}
	return res
}

func (e *snapEnv) snapshot(ws, key, dir string) (*protocol.Snapshot, bool, error) {
	return e.cl.Snapshot(context.Background(), ws, key, dir)
}

// TestSnapshotWarmStart: snapshot → acquire from it → identical files at
// the same path (real bwrap, real redis), then the delete semantics.
func TestSnapshotWarmStart(t *testing.T) {
	t.Parallel()
	p := snapLocal(t)
	e := snapStart(t, p, func(l *sandgate.Limits) { l.SnapshotTTL = 2 * time.Hour })
	src := e.acquire("")
	e.exec(src.WorkspaceID, "sh", "-c", snapTree, "sh", snapProject)
	want := e.exec(src.WorkspaceID, "sh", "-c", snapListing, "sh", snapProject).StdoutB64

	snap, created, err := e.snapshot(src.WorkspaceID, "snap-key-1", snapProject)
	if err != nil || !created {
		t.Fatalf("Snapshot = %v, created %v; want 201", err, created)
	}
	ca, _ := time.Parse(time.RFC3339, snap.CreatedAt)
	ea, _ := time.Parse(time.RFC3339, snap.ExpiresAt)
	if ea.Sub(ca) != 2*time.Hour || !strings.HasPrefix(snap.SnapshotID, "snap_") {
		t.Errorf("Snapshot = %+v; want expires_at = created_at + snapshot_ttl_seconds", snap)
	}
	// Replay: 200 with the same id; the same key for another dir conflicts.
	again, created, err := e.snapshot(src.WorkspaceID, "snap-key-1", snapProject)
	if err != nil || created || again.SnapshotID != snap.SnapshotID || again.ExpiresAt != snap.ExpiresAt {
		t.Errorf("replayed Snapshot = %+v, created %v, %v; want 200 with %s", again, created, err, snap.SnapshotID)
	}
	if _, _, err := e.snapshot(src.WorkspaceID, "snap-key-1", "/tmp"); snapErrCode(err) != protocol.IdempotencyConflict {
		t.Errorf("Snapshot with a reused key = %v; want idempotency_conflict", err)
	}
	// Changes after the snapshot are not in it.
	e.exec(src.WorkspaceID, "sh", "-c", `printf changed >"$1/file"; rm -r "$1/empty"`, "sh", snapProject)

	dst := e.acquire(snap.SnapshotID)
	if got := e.exec(dst.WorkspaceID, "sh", "-c", snapListing, "sh", snapProject).StdoutB64; got != want {
		t.Errorf("warm-started tree differs:\n%s\nwant:\n%s", snapB64d(got), snapB64d(want))
	}
	if !strings.Contains(snapB64d(want), "./sg F 2711") || !strings.Contains(snapB64d(want), "./dangling L nowhere") {
		t.Errorf("the tree lacks what it should show:\n%s", snapB64d(want))
	}

	// Another instance cannot see it: 404, for acquire and delete alike.
	otherTok, other := e.otherInstance()
	if _, _, err := other.Acquire(context.Background(), "k-other", snapAcquireReq(snap.SnapshotID)); snapErrCode(err) != protocol.NotFound {
		t.Errorf("Acquire from another instance's snapshot = %v; want not_found", err)
	}
	if st, body := e.doWith(otherTok, http.MethodDelete, "/v1/snapshots/"+snap.SnapshotID, nil, nil); st != http.StatusNotFound || snapCode(body) != protocol.NotFound {
		t.Errorf("DELETE of another instance's snapshot = %d %s; want 404 not_found", st, body)
	}
	if _, _, err := e.cl.Acquire(context.Background(), "k-unknown", snapAcquireReq("snap_unknown")); snapErrCode(err) != protocol.NotFound {
		t.Errorf("Acquire from an unknown snapshot = %v; want not_found", err)
	}

	// Delete: 204, again 204; the contents leave the disk; acquire is 410.
	for i := range 2 {
		if st, body := e.do(http.MethodDelete, "/v1/snapshots/"+snap.SnapshotID, nil, nil); st != http.StatusNoContent {
			t.Errorf("DELETE #%d = %d %s; want 204", i+1, st, body)
		}
	}
	if p.HasSnapshot(snap.SnapshotID) {
		t.Errorf("the snapshot's archive is still on disk after DELETE")
	}
	if _, _, err := e.cl.Acquire(context.Background(), "k-deleted", snapAcquireReq(snap.SnapshotID)); snapErrCode(err) != protocol.SnapshotGone {
		t.Errorf("Acquire from a deleted snapshot = %v; want snapshot_gone", err)
	}
	if st, _ := e.do(http.MethodDelete, "/v1/snapshots/snap_never", nil, nil); st != http.StatusNotFound {
		t.Errorf("DELETE of an id never owned = %d; want 404", st)
	}
	// The directory is never returned or logged.
	if strings.Contains(e.logs.String(), "projects/app") {
		t.Errorf("logs carry the snapshot's directory")
	}
}

func snapB64d(s string) string {
	var b []byte
	json.Unmarshal([]byte(`"`+s+`"`), &b)
	return string(b)
}

// TestSnapshotTTL: the reaper deletes an expired snapshot's contents by
// itself, retrying until the provider confirms (real bwrap).
func TestSnapshotTTL(t *testing.T) {
	t.Parallel()
	p := snapLocal(t)
	e := snapStart(t, p, func(l *sandgate.Limits) { l.SnapshotTTL = time.Hour })
	ws := e.acquire("")
	e.exec(ws.WorkspaceID, "sh", "-c", "mkdir -p /tmp/ttl && echo x >/tmp/ttl/f")
	snap, _, err := e.snapshot(ws.WorkspaceID, "k", "/tmp/ttl")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := e.reaper.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if !p.HasSnapshot(snap.SnapshotID) {
		t.Fatalf("a live snapshot was deleted")
	}
	e.clock.Advance(time.Hour + time.Second)
	if err := e.reaper.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if p.HasSnapshot(snap.SnapshotID) {
		t.Errorf("the archive of an expired snapshot is still on disk after a reaper pass")
	}
	rec, err := e.db.Snapshot(ctx, e.acct, snap.SnapshotID)
	if err != nil || rec.State != sandgate.SnapshotDeleted || rec.Dir != "" {
		t.Errorf("expired snapshot record = %+v, %v; want a deleted tombstone without dir", rec, err)
	}
	if _, _, err := e.cl.Acquire(ctx, "k2", snapAcquireReq(snap.SnapshotID)); snapErrCode(err) != protocol.SnapshotGone {
		t.Errorf("Acquire from an expired snapshot = %v; want snapshot_gone", err)
	}
	if st, _ := e.do(http.MethodDelete, "/v1/snapshots/"+snap.SnapshotID, nil, nil); st != http.StatusNoContent {
		t.Errorf("DELETE of an expired snapshot = %d; want 204", st)
	}
}

// TestSnapshotTTLRetries: a provider that fails to delete is retried until
// it confirms.
func TestSnapshotTTLRetries(t *testing.T) {
	t.Parallel()
	fake, e, ws := snapStartFake(t, func(l *sandgate.Limits) { l.SnapshotTTL = time.Hour })
	snap, _, err := e.snapshot(ws.WorkspaceID, "k", "/workspace")
	if err != nil {
		t.Fatal(err)
	}
	fake.Set(func(p *fakeprovider.Provider) { p.DeleteSnapshotErr = fakeprovider.ErrInjected })
	e.clock.Advance(time.Hour)
	ctx := context.Background()
	e.reaper.Pass(ctx)
	if !fake.HasSnapshot(snap.SnapshotID) {
		t.Fatalf("the failing provider deleted it")
	}
	// Expired at once: not restorable, not counted, even before the provider confirms.
	if _, _, err := e.cl.Acquire(ctx, "k2", snapAcquireReq(snap.SnapshotID)); snapErrCode(err) != protocol.SnapshotGone {
		t.Errorf("Acquire from an expired snapshot = %v; want snapshot_gone", err)
	}
	fake.Set(func(p *fakeprovider.Provider) { p.DeleteSnapshotErr = nil })
	e.reaper.Pass(ctx) // not due yet: the retry waits
	e.clock.Advance(time.Minute)
	e.reaper.Pass(ctx)
	if fake.HasSnapshot(snap.SnapshotID) {
		t.Errorf("the snapshot's contents survived the retried deletion")
	}
}

func TestSnapshotQuota(t *testing.T) {
	t.Parallel()
	_, e, ws := snapStartFake(t, func(l *sandgate.Limits) { l.MaxSnapshots = 2 })
	var ids []string
	for i := range 2 {
		s, _, err := e.snapshot(ws.WorkspaceID, "k"+string(rune('a'+i)), "/workspace")
		if err != nil {
			t.Fatalf("Snapshot %d: %v", i, err)
		}
		ids = append(ids, s.SnapshotID)
	}
	if _, _, err := e.snapshot(ws.WorkspaceID, "k-third", "/workspace"); snapErrCode(err) != protocol.SnapshotQuotaExceeded {
		t.Fatalf("third Snapshot = %v; want snapshot_quota_exceeded", err)
	}
	if err := e.cl.DeleteSnapshot(context.Background(), ids[0]); err != nil {
		t.Fatal(err)
	}
	// The refusal consumed nothing: the same key now succeeds.
	if _, created, err := e.snapshot(ws.WorkspaceID, "k-third", "/workspace"); err != nil || !created {
		t.Errorf("Snapshot with the refused key after a delete = %v, created %v; want 201", err, created)
	}
}

func TestSnapshotRefusals(t *testing.T) {
	t.Parallel()
	fake, e, ws := snapStartFake(t, nil)
	path := "/v1/workspaces/" + ws.WorkspaceID + "/snapshots"
	key := map[string]string{protocol.HeaderIdempotencyKey: "k1"}
	for _, tt := range []struct {
		name string
		body any
		hdr  map[string]string
		want protocol.Code
	}{
		{"no key", protocol.SnapshotRequest{Dir: "/workspace"}, nil, protocol.InvalidRequest},
		{"relative dir", protocol.SnapshotRequest{Dir: "workspace"}, key, protocol.InvalidRequest},
		{"no dir", map[string]any{}, key, protocol.InvalidRequest},
		{"unknown field", map[string]any{"dir": "/workspace", "x": 1}, key, protocol.InvalidRequest},
	} {
		if st, body := e.do(http.MethodPost, path, tt.body, tt.hdr); snapCode(body) != tt.want {
			t.Errorf("%s: %d %s; want %s", tt.name, st, body, tt.want)
		}
	}
	for _, tt := range []struct {
		err  error
		want protocol.Code
	}{
		{providers.ErrFileNotFound, protocol.FileNotFound},
		{providers.ErrNotAFile, protocol.NotAFile},
		{fakeprovider.ErrInjected, protocol.UpstreamError},
	} {
		fake.Set(func(p *fakeprovider.Provider) { p.SnapshotErr = tt.err })
		if _, _, err := e.snapshot(ws.WorkspaceID, "k-err", "/workspace/x"); snapErrCode(err) != tt.want {
			t.Errorf("Snapshot failing with %v = %v; want %s", tt.err, err, tt.want)
		}
	}
	// None of the failures consumed the key or a slot.
	fake.Set(func(p *fakeprovider.Provider) { p.SnapshotErr = nil })
	if _, created, err := e.snapshot(ws.WorkspaceID, "k-err", "/workspace/x"); err != nil || !created {
		t.Errorf("Snapshot with the key of failed attempts = %v, created %v; want 201", err, created)
	}
	if n, _ := e.db.LiveSnapshots(context.Background(), e.acct, e.inst, e.clock.Now()); n != 1 {
		t.Errorf("live snapshots = %d; want 1", n)
	}
	// A released workspace is gone; its snapshot replays all the same.
	e.cl.Release(context.Background(), ws.WorkspaceID)
	if _, _, err := e.snapshot(ws.WorkspaceID, "k-new", "/workspace"); snapErrCode(err) != protocol.WorkspaceGone {
		t.Errorf("Snapshot of a released workspace = %v; want workspace_gone", err)
	}
	if _, created, err := e.snapshot(ws.WorkspaceID, "k-err", "/workspace/x"); err != nil || created {
		t.Errorf("replay after release = %v, created %v; want 200", err, created)
	}
}

// TestWarmStartRestoreFails: a restore that fails after the create
// terminates the workspace, answers the error, and frees the key.
func TestWarmStartRestoreFails(t *testing.T) {
	t.Parallel()
	fake, e, ws := snapStartFake(t, nil)
	snap, _, err := e.snapshot(ws.WorkspaceID, "k", "/workspace")
	if err != nil {
		t.Fatal(err)
	}
	live := fake.Live()
	fake.Set(func(p *fakeprovider.Provider) { p.RestoreErr = fakeprovider.ErrInjected })
	ctx := context.Background()
	if _, _, err := e.cl.Acquire(ctx, "warm", snapAcquireReq(snap.SnapshotID)); snapErrCode(err) != protocol.UpstreamError {
		t.Fatalf("Acquire with a failing restore = %v; want upstream_error", err)
	}
	if fake.Live() != live {
		t.Errorf("sandboxes after a failed restore = %d; want %d: the new one terminated", fake.Live(), live)
	}
	list, err := e.cl.ListWorkspaces(ctx, "all", "", 100)
	if err != nil {
		t.Fatal(err)
	}
	failed := 0
	for _, w := range list.Workspaces {
		if w.State == "terminated" && w.TerminationReason != nil && *w.TerminationReason == "failed" {
			failed++
		}
	}
	if failed != 1 {
		t.Errorf("terminated, failed workspaces = %d; want 1", failed)
	}
	fake.Set(func(p *fakeprovider.Provider) { p.RestoreErr = providers.ErrSnapshotGone })
	if _, _, err := e.cl.Acquire(ctx, "warm", snapAcquireReq(snap.SnapshotID)); snapErrCode(err) != protocol.SnapshotGone {
		t.Errorf("Acquire whose snapshot vanished before the restore = %v; want snapshot_gone", err)
	}
	fake.Set(func(p *fakeprovider.Provider) { p.RestoreErr = nil })
	if _, created, err := e.cl.Acquire(ctx, "warm", snapAcquireReq(snap.SnapshotID)); err != nil || !created {
		t.Errorf("Acquire retried with the same key = %v, created %v; want 201", err, created)
	}
}

// wantSnapshotQuota checks a refusal by the snapshot quotas: exactly 422
// snapshot_quota_exceeded.
func wantSnapshotQuota(t *testing.T, label string, err error) {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != http.StatusUnprocessableEntity || ce.Code != protocol.SnapshotQuotaExceeded {
		t.Fatalf("%s = %v; want 422 snapshot_quota_exceeded", label, err)
	}
}

// TestSnapshotByteQuota: the sizes of an instance's live snapshots add up
// against max_snapshot_bytes. A snapshot that would go past it is refused
// after the provider stored it, and its contents deleted; one at the quota
// is refused before the provider is asked; a refusal consumes no key.
func TestSnapshotByteQuota(t *testing.T) {
	t.Parallel()
	fake, e, ws := snapStartFake(t, func(l *sandgate.Limits) { l.MaxSnapshotBytes = 10 })
	sb := providers.Sandbox{Ref: ws.WorkspaceID}
	write := func(path, s string) {
		if err := providers.WriteFileBytes(context.Background(), fake, sb, path, []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	write("/workspace/six/a", "123456")
	write("/workspace/five/a", "12345")
	write("/workspace/four/a", "1234")
	first, _, err := e.snapshot(ws.WorkspaceID, "k-six", "/workspace/six")
	if err != nil {
		t.Fatalf("Snapshot of 6 bytes: %v", err)
	}
	_, _, err = e.snapshot(ws.WorkspaceID, "k-five", "/workspace/five")
	wantSnapshotQuota(t, "Snapshot of 5 bytes beside 6 of 10", err)
	if got := fake.Snapshots(); got != 1 {
		t.Errorf("provider holds %d snapshots after the refusal; want 1 (the refused one's contents deleted)", got)
	}
	if _, _, err := e.snapshot(ws.WorkspaceID, "k-four", "/workspace/four"); err != nil {
		t.Fatalf("Snapshot of 4 bytes up to exactly 10: %v", err)
	}
	n := fake.SnapshotCalls()
	_, _, err = e.snapshot(ws.WorkspaceID, "k-more", "/workspace/four")
	wantSnapshotQuota(t, "Snapshot at the byte quota", err)
	if got := fake.SnapshotCalls(); got != n {
		t.Errorf("provider snapshots after a refusal at the quota = %d; want %d (not asked)", got, n)
	}
	// Deleting gives the bytes back; the refused key was never consumed.
	if err := e.cl.DeleteSnapshot(context.Background(), first.SnapshotID); err != nil {
		t.Fatal(err)
	}
	if _, created, err := e.snapshot(ws.WorkspaceID, "k-five", "/workspace/five"); err != nil || !created {
		t.Errorf("Snapshot with the refused key after a delete = %v, created %v; want 201", err, created)
	}

	// 9 of 10 bytes live. A provider that cannot delete the refused
	// contents at once: the refusal stands, the key is free again, and the
	// reaper deletes the contents later.
	fake.Set(func(p *fakeprovider.Provider) { p.DeleteSnapshotErr = fakeprovider.ErrInjected })
	stored := fake.Snapshots()
	_, _, err = e.snapshot(ws.WorkspaceID, "k-fail", "/workspace/six")
	wantSnapshotQuota(t, "Snapshot past the byte quota, contents not deletable", err)
	if got := fake.Snapshots(); got != stored+1 {
		t.Fatalf("provider holds %d snapshots; want %d (the refused one, not yet deleted)", got, stored+1)
	}
	_, _, err = e.snapshot(ws.WorkspaceID, "k-fail", "/workspace/six")
	wantSnapshotQuota(t, "the same key again (not idempotency_in_progress)", err)
	fake.Set(func(p *fakeprovider.Provider) { p.DeleteSnapshotErr = nil })
	e.clock.Advance(time.Minute)
	e.reaper.Pass(context.Background())
	if got := fake.Snapshots(); got != stored {
		t.Errorf("provider holds %d snapshots after a reaper pass; want %d (the refused ones deleted)", got, stored)
	}
}

// TestSnapshotByteQuotaLocal: with the local provider (real bwrap) the
// quota counts archive bytes, and an archive past it leaves nothing on disk.
func TestSnapshotByteQuotaLocal(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	p, err := local.New(t.Context(), local.Config{DataDir: dataDir}, providers.Env{BrokerID: "gateway-test"})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(p) }) // before its data directory goes
	e := snapStart(t, p, func(l *sandgate.Limits) { l.MaxSnapshotBytes = 20000 })
	ws := e.acquire("")
	// Random bytes do not compress: 30 000 of them make an archive past the quota.
	e.exec(ws.WorkspaceID, "sh", "-c", "mkdir -p /workspace/small /workspace/big && printf x >/workspace/small/f && head -c 30000 /dev/urandom >/workspace/big/f")
	if _, _, err := e.snapshot(ws.WorkspaceID, "k-small", "/workspace/small"); err != nil {
		t.Fatalf("Snapshot of a small directory: %v", err)
	}
	_, _, err = e.snapshot(ws.WorkspaceID, "k-big", "/workspace/big")
	wantSnapshotQuota(t, "Snapshot of an archive past max_snapshot_bytes", err)
	entries, err := os.ReadDir(filepath.Join(dataDir, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("archives on disk after the refusal = %d; want 1 (the small one)", len(entries))
	}
}
