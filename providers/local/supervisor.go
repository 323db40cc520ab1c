package local

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// SupervisorName is the supervisor's $0, in its command line.
const SupervisorName = "sandgate-supervisor"

// Files of the supervisor, in the workspace directory.
const (
	supervisorFile = "supervisor.pid" // "<pid> <start>": the supervisor's process
	endedFile      = "ended"          // written at expires_at: the sandbox is gone
)

// supervisorScript is the per-workspace supervisor: a detached sh (its own
// session, no parent-death signal) that outlives every broker process. It
// sleeps until the deadline (waking at least every 10 s, and leaving at
// once when the workspace directory is gone: Terminate removed it), then
// marks the workspace ended, so that open refuses it, and kills every
// recorded exec (SIGTERM to its step, which kills its sandbox) and the
// process group of every durable command runner whose process still has
// its recorded start time (a reused pid is never signalled).
//
// $1 workspace directory, $2 deadline (unix seconds).
const supervisorScript = `
dir=$1 deadline=$2
start_of() { s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; set -- $s; [ "$1" != Z ] || return 1; shift 19; echo "$1"; }
while [ -d "$dir" ]; do
  now=$(date +%s)
  [ "$now" -ge "$deadline" ] && break
  left=$((deadline - now)); [ "$left" -gt 10 ] && left=10
  sleep "$left"
done
[ -d "$dir" ] || exit 0
: > "$dir/ended"
for f in "$dir"/execs/*; do
  [ -f "$f" ] || continue
  pg=${f##*/}; want=$(cat "$f")
  [ "$(start_of "$pg")" = "$want" ] && kill -s TERM -- "$pg" 2>/dev/null
done
for f in "$dir"/commands/*/host.pid; do
  [ -f "$f" ] || continue
  read pid want < "$f"
  [ "$(start_of "$pid")" = "$want" ] && kill -s KILL -- "-$pid" 2>/dev/null
done
exit 0
`

// supervise starts the workspace's supervisor, which ends it at deadline
// even when no broker process runs, and records it for stopSupervisor.
func (p *Provider) supervise(l layout, deadline time.Time) error {
	if deadline.IsZero() {
		return nil
	}
	secs := (deadline.UnixMilli() + 999) / 1000
	// $0 names it in ps (and lets tests tell it from an escaped sandbox).
	cmd := exec.Command("/bin/sh", "-c", supervisorScript, SupervisorName, string(l), strconv.FormatInt(secs, 10))
	cmd.Env = []string{"PATH=" + defaultPath}
	cmd.Dir = "/"
	cmd.SysProcAttr = durableProcAttr()
	if err := cmd.Start(); err != nil {
		return err
	}
	pid := cmd.Process.Pid
	start, err := procStart(pid)
	go cmd.Wait() // reap it while this process lives; after that, init does
	if err != nil {
		return nil // it exited already
	}
	return os.WriteFile(filepath.Join(string(l), supervisorFile), []byte(strconv.Itoa(pid)+" "+strconv.FormatUint(start, 10)+"\n"), 0o600)
}

// stopSupervisor kills the workspace's supervisor, if it still runs.
func stopSupervisor(l layout) {
	b, err := os.ReadFile(filepath.Join(string(l), supervisorFile))
	if err != nil {
		return
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return
	}
	pid, _ := strconv.Atoi(f[0])
	want, _ := strconv.ParseUint(f[1], 10, 64)
	if got, err := procStart(pid); pid > 0 && err == nil && got == want {
		killGroup(pid)
	}
}

// ended reports whether the workspace's supervisor ended it.
func ended(l layout) bool {
	_, err := os.Stat(filepath.Join(string(l), endedFile))
	return !errors.Is(err, fs.ErrNotExist)
}

// markEnded marks the workspace ended, as its supervisor does at the
// deadline. Best effort: a workspace already removed needs no mark.
func markEnded(l layout) {
	_ = os.WriteFile(filepath.Join(string(l), endedFile), nil, 0o644)
}
