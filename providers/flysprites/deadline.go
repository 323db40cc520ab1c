package flysprites

import (
	"context"
	"fmt"
	"time"

	"github.com/sandgate/sandgate/providers"
)

// Sprites have no lifetime field, and idling only puts a sprite to sleep
// (sheet §9). So Create starts the agent's keeper (sandgate-guest keeper
// --detach) inside the sprite, outside every jail, in a session of its
// own: it outlives the exec that started it and every broker process,
// waits on the wall clock (a sleeping sprite does not advance a monotonic
// sleep), and at expires_at kills every process in another PID namespace
// (every jail, so every tenant process) until none is left. The sprite
// then has nothing to run, sleeps, and costs only storage until the
// reaper deletes it. A tenant, in its jail, can neither see nor signal it.

// keeperScript gets $1 = the agent's directory, then the keeper's argv. It
// makes the directory and the files the fs API wrote root's own (mode
// 0700 and 0600), then starts the keeper, which detaches itself once
// it serves.
const keeperScript = `d=$1
shift
chown -R 0:0 "$d" && chmod 0700 "$d" "$d/` + providers.GuestBinaryName + `" || exit 1
for f in "$d/egress.cred" "$d/egress.ca" "$d/jail.json"; do
	if [ -e "$f" ]; then chmod 0600 "$f" || exit 1; fi
done
exec "$@"
`

// startKeeper delivers nothing itself: Create wrote the agent and its
// files with the fs API. It runs keeperScript as root through one exec. A
// zero at (a test's spec: the broker always sets expires_at) starts no
// keeper, and then no command runs in the sprite: `sandgate-guest run`
// refuses a jail without a live keeper (docs/guest.md), as it does once
// the keeper has died, so a sprite whose keeper is gone runs no command
// without a lifetime (and execJail then deletes it).
func (p *Provider) startKeeper(ctx context.Context, name string, at time.Time, wsID string, egress bool) error {
	var ve *providers.VendorEgress
	if egress {
		ve = p.vendor
	}
	argv := []string{"sudo", "-n", "sh", "-c", keeperScript, "sh", providers.GuestDir}
	if !at.IsZero() {
		argv = append(argv, providers.GuestKeeperArgv(at, ve, wsID, true)...)
	}
	r, err := p.c.run(ctx, name, wsCommand{argv: argv, max: 4 << 10, killAfter: time.Minute})
	if err != nil {
		return fmt.Errorf("flysprites: create: start the keeper: %w", err)
	}
	if r.res.ExitCode != 0 {
		return fmt.Errorf("flysprites: create: start the keeper: exit %d", r.res.ExitCode)
	}
	return nil
}
