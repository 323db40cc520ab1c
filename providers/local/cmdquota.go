package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/runner"
)

// Durable commands keep their output on the host, in the workspace's
// commands/<id>/, outside its disk image: without a bound, a workspace
// could fill the data directory's file system with output. So each
// workspace may have at most Config.MaxCommands commands, and their kept
// output together at most its disk quota (Tier.DiskMiB, the size of its
// image): a command still running counts at what its output may grow to
// (max_output_bytes of each stream), a finished one at what it kept. A
// start past either is refused before anything runs
// ([providers.ErrCommandNotStarted]).

// DefaultMaxCommands is Config.MaxCommands's default.
const DefaultMaxCommands = 256

// commandsLock is the file, in a workspace's directory, whose flock
// serialises the admission of its commands across broker processes.
const commandsLock = "commands.lock"

// admitCommand takes the workspace's command admission lock and checks
// that one more command of maxOut bytes per stream fits the caps. On
// success the caller claims the command and then calls unlock, so the
// next admission counts it.
func (p *Provider) admitCommand(ctx context.Context, w opened, maxOut int64) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(string(w.layout), commandsLock), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("local: start command: %w: %w", scrub(err), providers.ErrCommandNotStarted)
	}
	if err := flockWait(ctx, f, lockExclusive); err != nil {
		f.Close()
		return nil, fmt.Errorf("local: start command: %w", err)
	}
	unlock = func() {
		flock(int(f.Fd()), lockUnlock)
		f.Close()
	}
	n, held := commandsHeld(w.layout)
	quota := commandQuota(w.rec)
	need := 2 * max(maxOut, 0)
	switch {
	case n >= p.cfg.MaxCommands:
		unlock()
		return nil, fmt.Errorf("local: start command: the workspace has %d durable commands, its most: %w", n, providers.ErrCommandNotStarted)
	case held+need > quota:
		unlock()
		return nil, fmt.Errorf("local: start command: the workspace's commands' output would pass its disk quota (%d MiB): %w",
			quota>>20, providers.ErrCommandNotStarted)
	}
	return unlock, nil
}

// commandQuota is the bytes of output a workspace's commands may keep
// together: its disk quota.
func commandQuota(rec record) int64 {
	mib := rec.DiskMiB
	if mib <= 0 { // no disk image: the default quota of its cores
		mib = 1024 * max(rec.CPUCores, 1)
	}
	return int64(mib) << 20
}

// commandsHeld returns how many commands the workspace at l has claimed
// and the bytes their output holds or may still grow to.
func commandsHeld(l layout) (n int, bytes int64) {
	entries, _ := os.ReadDir(l.commands())
	for _, e := range entries {
		d := filepath.Join(l.commands(), e.Name())
		if _, err := os.Lstat(filepath.Join(d, runner.FileClaim)); err != nil {
			continue
		}
		n++
		kept := fileSize(filepath.Join(d, runner.FileStdout)) + fileSize(filepath.Join(d, runner.FileStderr))
		if runnerAlive(d) {
			kept = max(kept, 2*maxOutOf(d))
		}
		bytes += kept
	}
	return n, bytes
}

// maxOutFile records, in a command's directory, the max_output_bytes it
// was started with, for commandsHeld.
const maxOutFile = "max_output"

// maxOutOf returns the max_output_bytes command directory d was started
// with; 0 when unknown.
func maxOutOf(d string) int64 {
	var n int64
	if b, err := os.ReadFile(filepath.Join(d, maxOutFile)); err == nil {
		fmt.Sscan(string(b), &n)
	}
	return n
}

func fileSize(name string) int64 {
	fi, err := os.Lstat(name)
	if err != nil {
		return 0
	}
	return fi.Size()
}
