package flysprites

import (
	"context"
	"fmt"
	"time"

	"github.com/sandgate/sandgate/providers"
)

// Snapshots go through the shared blob store (package execsnap): Sprites
// checkpoints restore only into the same sprite (sheet §7), and a snapshot
// must warm-start a new one.
//
// The archive is made and unpacked by the sprite's own user, which may be
// unable to read a file (mode 0000, say) or to write into a directory it
// made read-only (0555), which would stop tar. So before archiving, the
// modes of such files and directories are recorded in modesFile inside
// the directory, children before parents, and relaxed (u+r, u+rwx);
// afterwards, in the source and after each restore, the recorded modes
// are put back and modesFile removed. A restore also makes the
// directories already at its path writable, so that the archive can
// replace their files.

const modesFile = ".sandgate-snapshot-modes"

// prepareScript gets $1 = dir. Records are "PATH MODE", NUL-terminated;
// sorted in reverse, a path comes before its parent's ('/' > ' ').
const prepareScript = `[ -d "$1" ] || exit 0
cd "$1" || exit 1
t=` + modesFile + `.tmp
{
	find . -type d ! -perm -u+rwx -printf '%p %m\0' -exec chmod u+rwx {} \; &&
	find . ! -type d ! -type l ! -perm -u+r -printf '%p %m\0' -exec chmod u+r {} +
} >"$t" || exit 1
sort -z -r "$t" >` + modesFile + ` && rm -f "$t"
`

// settleScript gets $1 = dir and puts the recorded modes back.
const settleScript = `[ -d "$1" ] || exit 0
cd "$1" || exit 1
rm -f ` + modesFile + `.tmp
[ -f ` + modesFile + ` ] || exit 0
xargs -0 -r -n 1 sh -c 'chmod "${1##* }" "${1% *}"' sh <` + modesFile + ` || exit 1
rm -f ` + modesFile + `
`

// writableScript gets $1 = dir: its directories become writable by the
// user before a restore.
const writableScript = `[ -d "$1" ] || exit 0
find "$1" -type d ! -perm -u+rwx -exec chmod u+rwx {} \;
exit 0
`

func (p *Provider) guestScript(ctx context.Context, sb providers.Sandbox, script, dir string) error {
	res, err := p.Exec(ctx, sb, providers.ExecSpec{Argv: []string{"sh", "-c", script, "sh", dir}, Timeout: 5 * time.Minute, MaxOutputBytes: 1 << 10})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("exit %d", res.ExitCode)
	}
	return nil
}

// Snapshot implements providers.Provider.
func (p *Provider) Snapshot(ctx context.Context, sb providers.Sandbox, spec providers.SnapshotSpec) (providers.SnapshotRef, error) {
	if err := p.guestScript(ctx, sb, prepareScript, spec.Dir); err != nil {
		p.guestScript(context.WithoutCancel(ctx), sb, settleScript, spec.Dir)
		return providers.SnapshotRef{}, fmt.Errorf("flysprites: snapshot: prepare: %w", err)
	}
	ref, err := p.snap.Snapshot(ctx, sb, spec)
	if serr := p.guestScript(context.WithoutCancel(ctx), sb, settleScript, spec.Dir); serr != nil && err == nil {
		p.log.Error("snapshot source modes not restored", "err", serr)
	}
	if err != nil {
		return providers.SnapshotRef{}, fmt.Errorf("flysprites: snapshot: %w", err)
	}
	return ref, nil
}

// Restore implements providers.Provider: the archive is written back into
// sb at dir, and the recorded modes put back.
func (p *Provider) Restore(ctx context.Context, sb providers.Sandbox, ref providers.SnapshotRef, dir string) error {
	if err := p.guestScript(ctx, sb, writableScript, dir); err != nil {
		return fmt.Errorf("flysprites: restore: %w", err)
	}
	if err := p.snap.Restore(ctx, sb, ref, dir); err != nil {
		return fmt.Errorf("flysprites: restore: %w", err)
	}
	if err := p.guestScript(ctx, sb, settleScript, dir); err != nil {
		return fmt.Errorf("flysprites: restore: modes: %w", err)
	}
	return nil
}
