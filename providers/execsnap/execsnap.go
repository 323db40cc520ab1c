// Package execsnap snapshots a sandbox directory through the provider's own
// Exec into a [blobstore.Store], and restores it into another sandbox the
// same way: for vendors that cannot store a directory and bring it back in
// a new sandbox themselves. The directory is archived inside the sandbox
// (tar, gzip), moved out and in in bounded chunks, and never held whole in
// the broker's memory.
//
// Like package execfile, paths are passed to the scripts as arguments,
// never spliced into them, and resolved inside the sandbox.
package execsnap

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/blobstore"
)

// Execer runs one command in a sandbox; every [providers.Provider] is one.
type Execer interface {
	Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error)
}

// Config bounds a Snapshotter. A zero field means the default noted beside it.
type Config struct {
	// ChunkBytes is how much one Exec moves. 0 means 1 MiB; it must stay
	// within the vendor's limit on one exec's output or input.
	ChunkBytes int64
	// MaxBytes bounds one archive. 0 means 1 GiB.
	MaxBytes int64
	// OpTimeout bounds one Exec. 0 means 5 minutes.
	OpTimeout time.Duration
}

// Snapshotter moves snapshots between sandboxes and a Store.
type Snapshotter struct {
	ex    Execer
	store blobstore.Store
	cfg   Config
}

// New returns a Snapshotter over ex and store.
func New(ex Execer, store blobstore.Store, cfg Config) *Snapshotter {
	if cfg.ChunkBytes == 0 {
		cfg.ChunkBytes = 1 << 20
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = 1 << 30
	}
	if cfg.OpTimeout == 0 {
		cfg.OpTimeout = 5 * time.Minute
	}
	return &Snapshotter{ex: ex, store: store, cfg: cfg}
}

// Exit codes of the scripts, spliced into their sources; they avoid the
// codes sh and the tools use for their own failures.
const (
	exitNotFound = 81
	exitNotADir  = 82
	exitTooLarge = 83
)

// archiveScript gets $1 = dir, $2 = the archive's path, $3 = max bytes. It
// archives dir's contents (modes, symlinks, empty directories) and prints
// the archive's size.
var archiveScript = `d=$1 a=$2
[ -e "$d" ] || exit ` + strconv.Itoa(exitNotFound) + `
[ -d "$d" ] || exit ` + strconv.Itoa(exitNotADir) + `
umask 077
tar -czf "$a" -C "$d" . || { rm -f "$a"; exit 1; }
n=$(wc -c <"$a") || exit 1
[ "$n" -le "$3" ] || { rm -f "$a"; exit ` + strconv.Itoa(exitTooLarge) + `; }
echo $n
`

// chunkScript gets $1 = file, $2 = block size, $3 = block number and sends
// that block.
const chunkScript = `exec dd if="$1" bs="$2" skip="$3" count=1 2>/dev/null`

// appendScript gets $1 = file and appends stdin to it.
const appendScript = `umask 077; exec cat >>"$1"`

// extractScript gets $1 = dir, $2 = the archive; it creates dir and its
// parents, unpacks the archive into it and removes the archive.
const extractScript = `mkdir -p -- "$1" && tar -xzf "$2" -C "$1"; s=$?; rm -f "$2"; exit $s`

// removeScript gets $1 = file.
const removeScript = `exec rm -f -- "$1"`

// tempPath is a fresh archive path inside the sandbox.
func tempPath() string {
	var b [12]byte
	rand.Read(b[:])
	return "/tmp/.sandgate-snap-" + hex.EncodeToString(b[:]) + ".tgz"
}

func (s *Snapshotter) run(ctx context.Context, sb providers.Sandbox, script string, stdin []byte, maxOut int64, args ...string) (providers.ExecResult, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	return s.ex.Exec(ctx, sb, providers.ExecSpec{
		Argv:    append([]string{"sh", "-c", script, "sh"}, args...),
		Stdin:   stdin,
		Timeout: s.cfg.OpTimeout, MaxOutputBytes: maxOut,
	})
}

// Snapshot archives spec.Dir of sb and stores it under spec.ID; the ref's
// Bytes is the archive's size. Returns providers.ErrFileNotFound when Dir
// does not exist, providers.ErrNotAFile when it is not a directory,
// providers.ErrFileTooLarge when the archive is over Config.MaxBytes and
// providers.ErrSnapshotTooLarge when it is over spec.MaxBytes (what is
// left of the instance's quota). A failed Snapshot stores nothing.
func (s *Snapshotter) Snapshot(ctx context.Context, sb providers.Sandbox, spec providers.SnapshotSpec) (providers.SnapshotRef, error) {
	tmp := tempPath()
	defer s.run(context.WithoutCancel(ctx), sb, removeScript, nil, 0, tmp)
	limit, quota := s.cfg.MaxBytes, false
	if spec.MaxBytes > 0 && spec.MaxBytes < limit {
		limit, quota = spec.MaxBytes, true
	}
	res, err := s.run(ctx, sb, archiveScript, nil, 64, spec.Dir, tmp, strconv.FormatInt(limit, 10))
	if err != nil {
		return providers.SnapshotRef{}, fmt.Errorf("execsnap: archive: %w", err)
	}
	switch res.ExitCode {
	case 0:
	case exitNotFound:
		return providers.SnapshotRef{}, providers.ErrFileNotFound
	case exitNotADir:
		return providers.SnapshotRef{}, providers.ErrNotAFile
	case exitTooLarge:
		if quota {
			return providers.SnapshotRef{}, providers.ErrSnapshotTooLarge
		}
		return providers.SnapshotRef{}, providers.ErrFileTooLarge
	default:
		return providers.SnapshotRef{}, fmt.Errorf("execsnap: archive: exit %d", res.ExitCode)
	}
	size, err := strconv.ParseInt(strings.TrimSpace(string(res.Stdout)), 10, 64)
	if err != nil {
		// Not %w: the parse error quotes what the sandbox printed.
		return providers.SnapshotRef{}, errors.New("execsnap: archive size: not a number")
	}
	r := &chunkReader{s: s, ctx: ctx, sb: sb, path: tmp, size: size}
	n, err := s.store.Put(ctx, spec.ID, r, limit)
	if err != nil {
		return providers.SnapshotRef{}, fmt.Errorf("execsnap: store: %w", err)
	}
	if n != size {
		_ = s.store.Delete(context.WithoutCancel(ctx), spec.ID)
		return providers.SnapshotRef{}, fmt.Errorf("execsnap: archive of %d bytes came out as %d", size, n)
	}
	return providers.SnapshotRef{ID: spec.ID, Ref: spec.ID, Bytes: n}, nil
}

// chunkReader reads an archive out of the sandbox one Exec per chunk.
type chunkReader struct {
	s        *Snapshotter
	ctx      context.Context
	sb       providers.Sandbox
	path     string
	size     int64
	block    int64
	buf      []byte
	returned int64
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.buf) == 0 {
		if r.returned >= r.size {
			return 0, io.EOF
		}
		bs := r.s.cfg.ChunkBytes
		res, err := r.s.run(r.ctx, r.sb, chunkScript, nil, bs, r.path, strconv.FormatInt(bs, 10), strconv.FormatInt(r.block, 10))
		if err != nil {
			return 0, err
		}
		if res.ExitCode != 0 || res.StdoutTruncated {
			return 0, fmt.Errorf("execsnap: read block %d: exit %d", r.block, res.ExitCode)
		}
		want := min(bs, r.size-r.returned)
		if int64(len(res.Stdout)) != want {
			return 0, fmt.Errorf("execsnap: block %d has %d bytes; want %d", r.block, len(res.Stdout), want)
		}
		r.buf, r.block = res.Stdout, r.block+1
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	r.returned += int64(n)
	return n, nil
}

// Restore writes the snapshot ref.ID into sb at dir, creating parents.
// Returns providers.ErrSnapshotGone when the store has no such blob.
func (s *Snapshotter) Restore(ctx context.Context, sb providers.Sandbox, ref providers.SnapshotRef, dir string) error {
	rc, _, err := s.store.Open(ctx, ref.ID)
	if errors.Is(err, blobstore.ErrNotFound) {
		return providers.ErrSnapshotGone
	}
	if err != nil {
		return fmt.Errorf("execsnap: open: %w", err)
	}
	defer rc.Close()
	tmp := tempPath()
	defer s.run(context.WithoutCancel(ctx), sb, removeScript, nil, 0, tmp)
	buf := make([]byte, s.cfg.ChunkBytes)
	for {
		n, rerr := io.ReadFull(rc, buf)
		if n > 0 {
			res, err := s.run(ctx, sb, appendScript, buf[:n], 0, tmp)
			if err != nil {
				return fmt.Errorf("execsnap: write: %w", err)
			}
			if res.ExitCode != 0 {
				return fmt.Errorf("execsnap: write: exit %d", res.ExitCode)
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return fmt.Errorf("execsnap: read blob: %w", rerr)
		}
	}
	res, err := s.run(ctx, sb, extractScript, nil, 0, dir, tmp)
	if err != nil {
		return fmt.Errorf("execsnap: extract: %w", err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("execsnap: extract: exit %d", res.ExitCode)
	}
	return nil
}

// Delete deletes the snapshot's blob; a blob already gone is success.
func (s *Snapshotter) Delete(ctx context.Context, ref providers.SnapshotRef) error {
	return s.store.Delete(ctx, ref.ID)
}
