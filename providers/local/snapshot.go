package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
)

// Snapshots are gzip-compressed tar archives, one file per snapshot,
// <DataDir>/snapshots/<snapshot id>.tar.gz (mode 0600), written by GNU tar
// running inside the workspace's own sandbox and read back by tar inside
// the new one: the directory is resolved in the sandbox, never on the host,
// so a symlink cannot lead tar to a host file. tar keeps file modes,
// symlinks (as links), hard links, empty directories and mtimes.

// snapshotTimeout bounds one snapshot or restore, and is cut at the
// workspace's ExpiresAt.
const snapshotTimeout = 10 * time.Minute

// Exit codes of the snapshot scripts; they avoid those of sh and tar.
const (
	exitDirMissing = 81 // the directory does not exist
	exitNotDir     = 82 // it is not a directory, or cannot be entered
	exitNotStored  = 83 // it is outside the workspace's persistent directories
)

// snapshotScript gets $1 = the directory. It refuses a directory that is
// missing, not a directory, or (once symlinks are resolved) outside the
// directories that persist, then writes the archive to stdout. tar stays on
// the directory's file system (--one-file-system), so /proc and the like
// are never read.
var snapshotScript = `d=$1
[ -e "$d" ] || exit ` + strconv.Itoa(exitDirMissing) + `
[ -d "$d" ] || exit ` + strconv.Itoa(exitNotDir) + `
cd "$d" 2>/dev/null || exit ` + strconv.Itoa(exitNotDir) + `
case $(pwd -P) in
` + defaultDir + `|` + defaultDir + `/*|/root|/root/*|/tmp|/tmp/*) ;;
*) exit ` + strconv.Itoa(exitNotStored) + ` ;;
esac
exec tar --create --gzip --one-file-system --numeric-owner --file=- .
`

// restoreScript gets $1 = the directory and the archive on stdin. It
// creates the directory and its parents and extracts into it with the
// archive's modes.
var restoreScript = `d=$1
mkdir -p -- "$d" 2>/dev/null && cd "$d" 2>/dev/null || exit ` + strconv.Itoa(exitNotDir) + `
exec tar --extract --gzip --numeric-owner --no-same-owner --same-permissions --file=-
`

// snapshotPath returns the archive of snapshot id; id must be checked.
func (p *Provider) snapshotPath(id string) string {
	return filepath.Join(p.dataDir, snapshotsDir, id+".tar.gz")
}

// Snapshot archives spec.Dir of the workspace into the broker's data
// directory. Only directories under /workspace, /root and /tmp (after
// symlinks) can be stored; anything else is [providers.ErrNotAFile].
func (p *Provider) Snapshot(ctx context.Context, sb providers.Sandbox, spec providers.SnapshotSpec) (providers.SnapshotRef, error) {
	if err := checkRef(spec.ID); err != nil {
		return providers.SnapshotRef{}, errors.New("local: snapshot: id is not a safe file name")
	}
	if !path.IsAbs(spec.Dir) || strings.IndexByte(spec.Dir, 0) >= 0 {
		return providers.SnapshotRef{}, errors.New("local: snapshot: dir must be absolute and free of NUL")
	}
	w, err := p.open(sb.Ref)
	if err != nil {
		return providers.SnapshotRef{}, err
	}
	timeout, err := p.clampToExpiry(w, snapshotTimeout)
	if err != nil {
		return providers.SnapshotRef{}, err
	}
	tmp, err := os.CreateTemp(filepath.Join(p.dataDir, snapshotsDir), ".tmp-"+spec.ID+"-")
	if err != nil {
		return providers.SnapshotRef{}, fmt.Errorf("local: snapshot: %w", scrub(err))
	}
	keep := false
	defer func() {
		if !keep {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	start := time.Now()
	// Not the workspace's env: tar is the broker's, and the env could
	// load code into it (LD_PRELOAD) while it holds a capability.
	j := p.jobIn(sb.Ref, w)
	j.dir = "/"
	j.argv = []string{"sh", "-c", snapshotScript, "sh", spec.Dir}
	j.timeout = timeout
	j.maxOut = 4 << 10
	j.stdoutW = tmp
	// The archive is the only file this sandbox writes: past what is
	// left of the quota the kernel stops tar (SIGXFSZ).
	j.fsize = spec.MaxBytes
	// Read what the workspace's root cannot without it (mode 0 files):
	// only files the sandbox's uid 0 owns, that is the workspace's own.
	j.capAdd = []string{"CAP_DAC_READ_SEARCH"}
	j.hostTools = true
	res, err := p.run(ctx, j)
	if err != nil {
		return providers.SnapshotRef{}, fmt.Errorf("local: snapshot: %w", err)
	}
	if spec.MaxBytes > 0 && res.ExitCode != 0 && !res.TimedOut {
		// Killed by SIGXFSZ, or tar saw EFBIG: either way the archive
		// reached the limit and is cut short.
		if fi, err := tmp.Stat(); res.ExitCode == 128+int(syscall.SIGXFSZ) || (err == nil && fi.Size() >= spec.MaxBytes) {
			return providers.SnapshotRef{}, fmt.Errorf("local: snapshot: archive past %d bytes: %w", spec.MaxBytes, providers.ErrSnapshotTooLarge)
		}
	}
	switch {
	case res.TimedOut:
		return providers.SnapshotRef{}, errors.New("local: snapshot: timed out")
	case res.ExitCode == exitDirMissing:
		return providers.SnapshotRef{}, fmt.Errorf("local: snapshot: %w", providers.ErrFileNotFound)
	case res.ExitCode == exitNotDir || res.ExitCode == exitNotStored:
		return providers.SnapshotRef{}, fmt.Errorf("local: snapshot: %w", providers.ErrNotAFile)
	case res.ExitCode != 0 && res.ExitCode != 1:
		// tar's 1 is "a file changed as we read it": the archive is whole.
		// Its messages name paths: only the code is kept.
		return providers.SnapshotRef{}, fmt.Errorf("local: snapshot: tar failed with exit code %d", res.ExitCode)
	}
	if err := tmp.Sync(); err != nil {
		return providers.SnapshotRef{}, fmt.Errorf("local: snapshot: %w", scrub(err))
	}
	// The archive's size is what counts against max_snapshot_bytes.
	fi, err := tmp.Stat()
	if err != nil {
		return providers.SnapshotRef{}, fmt.Errorf("local: snapshot: %w", scrub(err))
	}
	size := fi.Size()
	if err := tmp.Close(); err != nil {
		return providers.SnapshotRef{}, fmt.Errorf("local: snapshot: %w", scrub(err))
	}
	if err := p.writeSnapshotImage(spec.ID, w); err != nil {
		return providers.SnapshotRef{}, fmt.Errorf("local: snapshot: image: %w", scrub(err))
	}
	if err := os.Rename(tmp.Name(), p.snapshotPath(spec.ID)); err != nil {
		return providers.SnapshotRef{}, fmt.Errorf("local: snapshot: %w", scrub(err))
	}
	keep = true
	p.log.Info("snapshot stored", sandgate.WorkspaceAttr(sb.Ref), sandgate.SnapshotAttr(spec.ID),
		"archive_bytes", size, "duration", time.Since(start))
	return providers.SnapshotRef{ID: spec.ID, Ref: spec.ID, Bytes: size}, nil
}

// clampToExpiry cuts d at the workspace's ExpiresAt; past it the workspace
// is gone.
func (p *Provider) clampToExpiry(w opened, d time.Duration) (time.Duration, error) {
	if w.rec.ExpiresAt.IsZero() {
		return d, nil
	}
	left := w.rec.ExpiresAt.Sub(p.clock.Now())
	if left <= 0 {
		return 0, fmt.Errorf("local: workspace expired: %w", providers.ErrSandboxGone)
	}
	return min(d, left), nil
}

// Restore extracts the snapshot's archive into dir of the workspace.
func (p *Provider) Restore(ctx context.Context, sb providers.Sandbox, ref providers.SnapshotRef, dir string) error {
	if checkRef(ref.ID) != nil {
		return fmt.Errorf("local: restore: %w", providers.ErrSnapshotGone)
	}
	if !path.IsAbs(dir) || strings.IndexByte(dir, 0) >= 0 {
		return errors.New("local: restore: dir must be absolute and free of NUL")
	}
	w, err := p.open(sb.Ref)
	if err != nil {
		return err
	}
	timeout, err := p.clampToExpiry(w, snapshotTimeout)
	if err != nil {
		return err
	}
	f, err := os.Open(p.snapshotPath(ref.ID))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("local: restore: %w", providers.ErrSnapshotGone)
	}
	if err != nil {
		return fmt.Errorf("local: restore: %w", scrub(err))
	}
	defer f.Close()
	if err := p.restoreImage(ctx, sb.Ref, w, ref.ID); err != nil {
		return fmt.Errorf("local: restore: %w", err)
	}
	if w, err = p.open(sb.Ref); err != nil {
		return err
	}
	j := p.jobIn(sb.Ref, w)
	j.dir = "/"
	j.argv = []string{"sh", "-c", restoreScript, "sh", dir}
	j.timeout = timeout
	j.maxOut = 4 << 10
	j.stdinR = f
	// GNU tar running as uid 0 trusts that it may write into the
	// read-only directories it extracts, and sets their modes only at
	// the end: it needs the override the sandbox's root lacks. As for
	// Snapshot, no env reaches this tar.
	j.capAdd = []string{"CAP_DAC_OVERRIDE", "CAP_FOWNER"}
	j.hostTools = true
	res, err := p.run(ctx, j)
	if err != nil {
		return fmt.Errorf("local: restore: %w", err)
	}
	switch {
	case res.TimedOut:
		return errors.New("local: restore: timed out")
	case res.ExitCode == exitNotDir:
		return fmt.Errorf("local: restore: the directory cannot be created: %w", providers.ErrNotAFile)
	case res.ExitCode != 0:
		return fmt.Errorf("local: restore: tar failed with exit code %d", res.ExitCode)
	}
	p.log.Info("snapshot restored", sandgate.WorkspaceAttr(sb.Ref), sandgate.SnapshotAttr(ref.ID))
	return nil
}

// DeleteSnapshot removes the snapshot's archive and any temporary file a
// Snapshot of the same id left when it was cut short.
func (p *Provider) DeleteSnapshot(ctx context.Context, ref providers.SnapshotRef) error {
	if checkRef(ref.ID) != nil {
		return nil // no snapshot can have this name
	}
	// The image record first: it is only read with the archive.
	if err := os.Remove(p.snapshotImagePath(ref.ID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("local: delete snapshot: %w", scrub(err))
	}
	err := os.Remove(p.snapshotPath(ref.ID))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("local: delete snapshot: %w", scrub(err))
	}
	tmps, _ := filepath.Glob(filepath.Join(p.dataDir, snapshotsDir, ".tmp-"+ref.ID+"-*"))
	for _, t := range tmps {
		if err := os.Remove(t); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("local: delete snapshot: %w", scrub(err))
		}
	}
	if err == nil {
		p.log.Info("snapshot deleted", sandgate.SnapshotAttr(ref.ID))
	}
	return nil
}

// HasSnapshot reports whether the archive of snapshot id exists, for tests
// and operators checking that a deletion reached the disk.
func (p *Provider) HasSnapshot(id string) bool {
	if checkRef(id) != nil {
		return false
	}
	_, err := os.Stat(p.snapshotPath(id))
	return err == nil
}

// sweepSnapshotTemps removes temporary archives older than an hour: what a
// broker that died in the middle of a Snapshot left. A younger one may be
// another broker process's Snapshot in flight.
func (p *Provider) sweepSnapshotTemps() {
	tmps, _ := filepath.Glob(filepath.Join(p.dataDir, snapshotsDir, ".tmp-*"))
	for _, t := range tmps {
		if fi, err := os.Stat(t); err == nil && time.Since(fi.ModTime()) > time.Hour {
			os.Remove(t)
		}
	}
}
