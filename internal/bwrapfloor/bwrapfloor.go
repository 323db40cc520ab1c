// Package bwrapfloor builds the bare bubblewrap command line that the
// benchmarks measure the local provider against: a sandbox with the local
// provider's namespaces and nothing else, the floor of any exec.
package bwrapfloor

import (
	"fmt"
	"os"
	"os/exec"
)

// Command returns the bare bwrap command line of argv with the local
// provider's namespaces: /usr and the host's /bin, /sbin, /lib and /lib64
// read-only, a fresh /proc and /dev, and no limits, disk, uid, cgroups or
// workspace binds.
func Command(argv ...string) ([]string, error) {
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		return nil, fmt.Errorf("bwrap: %w", err)
	}
	args := []string{bwrap, "--unshare-all", "--unshare-user", "--uid", "0", "--gid", "0",
		"--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"}
	for _, name := range []string{"/bin", "/sbin", "/lib", "/lib64"} {
		if t, err := os.Readlink(name); err == nil {
			args = append(args, "--symlink", t, name)
		} else if _, err := os.Stat(name); err == nil {
			args = append(args, "--ro-bind", name, name)
		}
	}
	args = append(args, "--proc", "/proc", "--dev", "/dev", "--")
	return append(args, argv...), nil
}
