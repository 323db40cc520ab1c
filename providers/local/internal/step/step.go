// Package step is the local provider's step: every durable command's
// sandbox is started through it, a small process that is the broker's own
// binary run again (its path with argv[1] = "--"+Name; argv[0] = Name is
// recognised too), recognised in this package's init. This package needs
// little beyond the standard library's system calls, so a binary's
// package initialisation reaches its init early: the step does not wait
// for the broker's HTTP, TLS, telemetry and vendor packages to be
// initialised, a third of its start (24 ms against 16 on a
// paravirtualised 2-vCPU host). (An exec starts bwrap from the broker
// itself, as the first process of a pid namespace, or forks in the
// workspace's resident.)
//
//	sandgate-exec-step --fds N [--rlimit NAME=N]… [--cgroup FILE]… [--uid U --gid G]
//	    [--stage DIR [--bind SRC NAME]… [--disk IMAGE --mount-bin MOUNT]] [--ns-fd FD]
//	    -- bwrap --args 3 -- ARGV…
//
// N is how many descriptors past stderr the broker handed over (bwrap's
// options and seccomp filter); they go on to bwrap as they are.
//
// The step exists because a durable command outlives the broker (no pid
// namespace of the broker's can hold it) and bwrap's --die-with-parent
// cannot be relied on alone. bwrap's pid 1 (inside the sandbox) calls
// setsid and sets its parent-death signal only after the whole mount
// set-up; if the outer bwrap dies in that window (killed with the broker,
// a timeout or a Terminate), pid 1 is orphaned without a parent-death
// signal and outside the exec's process group, and the command runs on
// with nobody to kill it. The step:
//
//   - joins the workspace's cgroups (each FILE is a cgroup.procs) before it
//     forks anything, so nothing of the sandbox ever runs outside them;
//   - is a child subreaper: whatever bwrap orphans is reparented to it, not
//     to init;
//   - gets SIGTERM as its parent-death signal, from the broker, and SIGTERM
//     is also how the broker kills an exec: it then SIGKILLs every child it
//     has (bwrap, or bwrap's orphaned pid 1, whose death ends the sandbox's
//     pid namespace), until none is left, and exits with 137;
//   - when bwrap exits, kills whatever is left the same way and exits with
//     bwrap's status (128+n for a signal n).
//
// Its children are never reaped by anyone else, so signalling one by pid can
// never hit a reused pid.
//
// The broker shares the step's staging (Stage), namespace and resource
// limit code: an exec's mount namespace is staged the same way.
package step

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// Name is the step's argv[0], and its first argument with "--" before it.
const Name = "sandgate-exec-step"

// Exit codes of the step itself, before bwrap runs; the local provider's
// other helper processes use them too.
const (
	ExitUsage  = 120 // malformed arguments: a bug
	ExitCgroup = 121 // a cgroup could not be joined: nothing ran
	ExitStart  = 122 // the command could not be started
)

// Stage is what Mount stages in the calling thread's mount namespace.
type Stage struct {
	Dir   string      // a fresh tmpfs is mounted here
	Binds [][2]string // each {SRC, NAME}: SRC bound at Dir/NAME
	Disk  string      // the workspace's disk image, mounted on Dir/d; "": none
	// MountBin is mount(8), for the image.
	MountBin string
	// DiskOwner is the host uid (and gid) that the image's workspace,
	// home and tmp directories (DiskDirs) belong to; 0: left as they
	// are. An image copied from its template holds them as root's until
	// its first mount.
	DiskOwner int
}

// DiskDirs are the directories at the top of a workspace's disk image
// that the sandbox binds as /workspace, /root and /tmp.
var DiskDirs = [...]string{"workspace", "home", "tmp"}

// Rlimit is one resource limit, soft and hard (--rlimit NAME=N).
type Rlimit struct {
	Resource int
	Value    uint64
}

// Scrub drops the host path from a file-system error, keeping the
// operation and the cause (so errors.Is still finds fs.ErrNotExist and the
// like): errors must never carry paths.
func Scrub(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return fmt.Errorf("%s: %w", le.Op, le.Err)
	}
	return err
}
