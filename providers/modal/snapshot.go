package modal

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/internal/uuid"
	"github.com/sandgate/sandgate/providers/modal/proto/clientpb"
	"github.com/sandgate/sandgate/providers/modal/proto/routerpb"
)

// Snapshot timings and TTLs.
const (
	// snapshotBudget is the SDK's overall budget for one snapshot.
	snapshotBudget = 55 * time.Second
	// defaultSnapshotTTL is what the SDK sends when the caller gives none.
	defaultSnapshotTTL = 30 * 24 * time.Hour
)

// Exit codes of dirScript.
const (
	exitNoDir  = 21 // nothing at the path
	exitNotDir = 20 // something that is not a directory
)

// dirScript checks $1, a clean absolute path, before a snapshot: a
// directory reached without a symlink exits 0. Through a symlink, du
// (which does not follow it) would charge max_snapshot_bytes for a link
// while Modal, whose handling of symlinks is not documented, might store
// the directory behind it: such a path is refused as not a directory.
const dirScript = `if [ -d "$1" ]; then [ "$(cd -P -- "$1" && pwd -P)" = "$1" ] && exit 0; exit 20; elif [ -e "$1" ] || [ -L "$1" ]; then exit 20; else exit 21; fi`

// checkDir refuses a path Modal cannot snapshot or mount: relative, NUL,
// or the root.
func checkDir(dir string) error {
	if !path.IsAbs(dir) || strings.IndexByte(dir, 0) >= 0 {
		return errors.New("modal: snapshot: dir must be absolute and free of NUL")
	}
	if path.Clean(dir) == "/" {
		return fmt.Errorf("modal: snapshot: Modal cannot snapshot or mount /: %w", providers.ErrNotAFile)
	}
	return nil
}

// snapshotUUID derives TaskSnapshotDirectory's idempotency UUID from the
// broker's snapshot id, so a retried call stores one image.
func snapshotUUID(id string) string {
	sum := sha256.Sum256([]byte("sandgate-snapshot\x00" + id))
	var b [16]byte
	copy(b[:], sum[:16])
	b[6] = b[6]&0x0f | 0x50 // version 5 layout (name-based)
	b[8] = b[8]&0x3f | 0x80
	return uuid.Format(b)
}

// Snapshot stores spec.Dir with the router's TaskSnapshotDirectory, with
// ttl_seconds always set: Modal deletes the image at the snapshot's expiry
// by itself. The directory is checked first, through Exec, since Modal's
// own refusals do not say why.
func (p *Provider) Snapshot(ctx context.Context, sb providers.Sandbox, spec providers.SnapshotSpec) (providers.SnapshotRef, error) {
	if err := checkDir(spec.Dir); err != nil {
		return providers.SnapshotRef{}, err
	}
	r, err := p.router(ctx, sb.Ref)
	if err != nil {
		return providers.SnapshotRef{}, err
	}
	switch code, err := p.run(ctx, r, []string{"sh", "-c", dirScript, "sh", path.Clean(spec.Dir)}); {
	case err != nil:
		return providers.SnapshotRef{}, fmt.Errorf("modal: snapshot: %w", err)
	case code == exitNoDir:
		return providers.SnapshotRef{}, fmt.Errorf("modal: snapshot: %w", providers.ErrFileNotFound)
	case code == exitNotDir:
		return providers.SnapshotRef{}, fmt.Errorf("modal: snapshot: %w", providers.ErrNotAFile)
	case code != 0:
		return providers.SnapshotRef{}, fmt.Errorf("modal: snapshot: the directory check failed with exit code %d", code)
	}
	// Modal does not report an image's size: the directory's, as the guest
	// counts it, is what the instance's max_snapshot_bytes is charged.
	size, err := p.dirBytes(ctx, sb, spec.Dir)
	if err != nil {
		return providers.SnapshotRef{}, fmt.Errorf("modal: snapshot: size: %w", err)
	}
	if spec.MaxBytes > 0 && size > spec.MaxBytes {
		return providers.SnapshotRef{}, fmt.Errorf("modal: snapshot: %w", providers.ErrSnapshotTooLarge)
	}
	ttl := int64(defaultSnapshotTTL / time.Second)
	if !spec.ExpiresAt.IsZero() {
		left := spec.ExpiresAt.Sub(p.clock.Now())
		ttl = max(int64((left+time.Second-1)/time.Second), 1) // whole seconds, at least 1
	}
	sctx, cancel := context.WithTimeout(ctx, snapshotBudget)
	defer cancel()
	start := time.Now()
	var resp *routerpb.TaskSnapshotDirectoryResponse
	err = p.call(sctx, r, snapshotRetry, func(ctx context.Context) error {
		var err error
		resp, err = r.rc.TaskSnapshotDirectory(ctx, &routerpb.TaskSnapshotDirectoryRequest{
			TaskId: r.taskID, Path: []byte(spec.Dir), SnapshotId: snapshotUUID(spec.ID), TtlSeconds: &ttl,
		})
		return err
	})
	if err != nil {
		// An image stored anyway is deleted by Modal at its TTL.
		return providers.SnapshotRef{}, p.routerError(ctx, r, "snapshot", err)
	}
	p.log.Info("snapshot stored", sandgate.SnapshotAttr(spec.ID),
		"ttl_seconds", ttl, "duration", time.Since(start))
	return providers.SnapshotRef{ID: spec.ID, Ref: resp.GetImageId(), Bytes: size}, nil
}

// dirBytes is the disk space dir takes in the sandbox (du, in KiB blocks),
// at least 1.
func (p *Provider) dirBytes(ctx context.Context, sb providers.Sandbox, dir string) (int64, error) {
	res, err := p.Exec(ctx, sb, providers.ExecSpec{Argv: []string{"du", "-sk", "--", dir}, Timeout: time.Minute, MaxOutputBytes: 4096})
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(res.Stdout))
	if res.ExitCode != 0 || len(f) == 0 {
		return 0, fmt.Errorf("du exited %d", res.ExitCode)
	}
	kib, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		// Not err: it quotes what the sandbox printed.
		return 0, errors.New("du printed no size")
	}
	return max(kib*1024, 1), nil
}

// Restore mounts the snapshot's image at dir with TaskMountDirectory,
// after mkdir -p (the older SDK's way; newer servers create it too).
// Returns ErrSnapshotGone when Modal no longer has the image.
func (p *Provider) Restore(ctx context.Context, sb providers.Sandbox, ref providers.SnapshotRef, dir string) error {
	if err := checkDir(dir); err != nil {
		return err
	}
	if ref.Ref == "" {
		return fmt.Errorf("modal: restore: no image: %w", providers.ErrSnapshotGone)
	}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	_, err := p.client.ImageFromId(cctx, &clientpb.ImageFromIdRequest{ImageId: ref.Ref}, retryable)
	cancel()
	switch {
	case status.Code(err) == codes.NotFound:
		return fmt.Errorf("modal: restore: %w", providers.ErrSnapshotGone)
	case err != nil:
		return vendorError("restore: image", err)
	}
	r, err := p.router(ctx, sb.Ref)
	if err != nil {
		return err
	}
	if code, err := p.run(ctx, r, []string{"mkdir", "-p", "--", dir}); err != nil {
		return fmt.Errorf("modal: restore: %w", err)
	} else if code != 0 {
		return fmt.Errorf("modal: restore: mkdir failed with exit code %d: %w", code, providers.ErrNotAFile)
	}
	err = p.call(ctx, r, transient, func(ctx context.Context) error {
		_, err := r.rc.TaskMountDirectory(ctx, &routerpb.TaskMountDirectoryRequest{TaskId: r.taskID, Path: []byte(dir), ImageId: ref.Ref})
		return err
	})
	if status.Code(err) == codes.NotFound {
		if gone, derr := p.done(ctx, sb.Ref); derr == nil && !gone {
			return fmt.Errorf("modal: restore: %w", providers.ErrSnapshotGone)
		}
	}
	if err != nil {
		return p.routerError(ctx, r, "restore", err)
	}
	return nil
}

// DeleteSnapshot deletes the snapshot's image with ImageDelete; an image
// already gone succeeds. A snapshot cut short before it answered has no
// image id the broker knows, and Modal cannot list images: its image, if
// any, is deleted by Modal at the TTL it was stored with.
func (p *Provider) DeleteSnapshot(ctx context.Context, ref providers.SnapshotRef) error {
	if ref.Ref == "" {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	_, err := p.client.ImageDelete(cctx, &clientpb.ImageDeleteRequest{ImageId: ref.Ref}, retryable)
	if err != nil && status.Code(err) != codes.NotFound {
		return vendorError("snapshot delete", err)
	}
	return nil
}
