package spritetest

import (
	"testing"

	"github.com/sandgate/sandgate/providers/internal/fakeserver"
)

// sudoScript is the guest's /usr/bin/sudo: the fake runs every command as
// the guest's root already (see the package doc), so it only parses
// sudo's options, refuses a user other than root, and resets the
// environment as Ubuntu's sudoers (env_reset, secure_path) does unless
// -E is given; NAME=VALUE arguments before the command are set, as sudo
// sets them for a user allowed ALL.
const sudoScript = `#!/bin/sh
keep=
while [ $# -gt 0 ]; do
	case $1 in
	-n|-H|-S|--non-interactive|--set-home|--stdin) shift ;;
	-E|--preserve-env) keep=1; shift ;;
	-u|--user) [ "$2" = root ] || [ "$2" = "#0" ] || { echo "sudo: unknown user $2" >&2; exit 1; }; shift 2 ;;
	--) shift; break ;;
	-*) echo "sudo: unsupported option $1" >&2; exit 1 ;;
	*) break ;;
	esac
done
[ $# -gt 0 ] || { echo "usage: sudo [-nEH] [-u root] command" >&2; exit 1; }
set -- SUDO_COMMAND="$*" "$@"
if [ -z "$keep" ]; then
	set -- -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/snap/bin \
		HOME=/root USER=root LOGNAME=root SHELL=/bin/sh MAIL=/var/mail/root \
		SUDO_USER=sprite SUDO_UID=1000 SUDO_GID=1000 ${TERM:+TERM="$TERM"} "$@"
fi
exec env "$@"
`

// bootScript is what the sprite called name runs before its agent: the
// guest's writable file systems (fakeserver.GuestBoot), its hostname,
// and sudoScript as /usr/bin/sudo.
func bootScript(name string) string {
	return fakeserver.GuestBoot + "hostname " + shellQuote(name) + " || exit 1\n" +
		"cat >/usr/bin/sudo <<'SANDGATE_FAKE_SUDO' && chmod 0755 /usr/bin/sudo || exit 1\n" + sudoScript + "SANDGATE_FAKE_SUDO\n"
}

// Canary is a TCP listener on the host's loopback that counts
// connections: a sprite reaches it unless a jail keeps it off the network.
type Canary = fakeserver.Canary

// StartCanary starts a Canary for the test and stops it when the test ends.
func StartCanary(tb testing.TB) *Canary { return fakeserver.StartCanary(tb) }
