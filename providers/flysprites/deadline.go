package flysprites

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// Sprites have no lifetime field, and idling only puts a sprite to sleep
// (sheet §9). So Create starts a deadline process inside the sprite, in a
// session of its own (it outlives the exec that started it and every
// broker process): it waits on the wall clock (a sleeping sprite does not
// advance a monotonic sleep), and at expires_at kills every process whose
// environment carries markerVar, which every command the broker starts
// does, until none is left. The sprite then has nothing to run, sleeps,
// and costs only storage until the reaper deletes it. The deadline process
// itself runs without the marker.

// deadlineScript gets $1 = the deadline in unix seconds, $2 = the marker
// line (NAME=VALUE).
const deadlineScript = `d=$1 m=$2
while :; do
	n=$(date +%s) || n=0
	[ "$n" -ge "$d" ] && break
	r=$((d - n))
	[ "$r" -gt 30 ] && r=30
	sleep "$r"
done
while :; do
	k=0
	for e in /proc/[0-9]*/environ; do
		p=${e#/proc/}
		p=${p%/environ}
		[ "$p" = "$$" ] && continue
		grep -qzxF -- "$m" "$e" 2>/dev/null || continue
		kill -KILL "$p" 2>/dev/null && k=1
	done
	[ "$k" = 1 ] || break
	sleep 1
done
`

// exitNoSetsid: the guest has no setsid, so no process can outlive its exec.
const exitNoSetsid = 84

// launchDeadline gets $1 = the script, $2 and $3 its arguments, and starts
// it detached.
var launchDeadline = `command -v setsid >/dev/null 2>&1 || exit ` + strconv.Itoa(exitNoSetsid) + `
setsid sh -c "$1" sh "$2" "$3" </dev/null >/dev/null 2>&1 &
exit 0
`

// startDeadline starts the deadline process of sprite name, with the
// sprite's default environment (no marker).
func (p *Provider) startDeadline(ctx context.Context, name string, base []string, at time.Time) error {
	unix := at.Unix()
	if at.Nanosecond() > 0 {
		unix++ // never before expires_at
	}
	r, err := p.c.run(ctx, name, wsCommand{
		argv: []string{"sh", "-c", launchDeadline, "sh", deadlineScript, strconv.FormatInt(unix, 10), markerVar + "=" + name},
		env:  base, max: 1 << 10, killAfter: time.Minute,
	})
	if err != nil {
		return fmt.Errorf("flysprites: create: start the deadline process: %w", err)
	}
	if r.res.ExitCode != 0 {
		return fmt.Errorf("flysprites: create: start the deadline process: exit %d", r.res.ExitCode)
	}
	return nil
}
