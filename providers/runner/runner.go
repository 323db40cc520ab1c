// Package runner runs durable commands in any sandbox that has Exec: a
// small POSIX sh runner, started detached inside the sandbox, records the
// command's pid, capped output with the real byte counts, and exit status
// in a broker-owned directory there, so a command outlives the exec that
// started it and every broker process. A provider whose sandboxes do not
// keep background processes between execs (providers/local) runs the same
// runner natively and reads the same files with [ReadDir].
package runner

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate/providers"
)

// DefaultDir is the broker-owned directory in the sandbox under which each
// command gets its own directory, named by the broker's command id. No
// client is ever told about it.
const DefaultDir = "/tmp/.sandgate/cmd"

// Files of one command's directory. The runner writes them in this order;
// Exit is written last, by a rename, once the output is complete.
const (
	FileClaim    = "claim"       // created once, exclusively, by the launch
	FileStdin    = "stdin"       // the command's stdin, removed by the runner before the command starts
	FilePID      = "pid"         // the runner's pid, which is its process group
	FileCancel   = "cancel"      // a cancel came: the fence a late launch obeys
	FileTimedOut = "timedout"    // the watchdog killed the command at its timeout
	FileStdout   = "stdout"      // the first max bytes of stdout
	FileStderr   = "stderr"      // the first max bytes of stderr
	FileStdoutN  = "stdout.more" // how many more bytes stdout had
	FileStderrN  = "stderr.more" // how many more bytes stderr had
	FileExit     = "exit"        // the exit status; the command is finished
)

// Script is the runner. It gets $1 = its directory (which holds stdin), $2
// = the bytes kept per stream, $3 = the timeout in seconds (0: none), and
// the command's argv after them. It must run as the leader of its own
// process group: cancel and the timeout kill that whole group.
//
// It records its pid and only then checks for the cancel fence, while a
// cancel writes the fence and only then reads the pid: whichever comes
// second sees the other, so a late launch never runs the command and an
// early cancel always finds it. Each stream goes through a FIFO to a
// reader that keeps the first $2 bytes (GNU head -c reads no more than it
// keeps) and counts the rest. The exit status is written by a rename once
// both readers are done, so a reader of the directory sees complete output
// whenever it sees the status.
//
// The stdin file is opened on descriptor 9 and removed at once, before the
// command starts: the spec forbids persisting stdin, so it lives on only
// in the open file, which the command alone reads (every other process of
// the runner closes descriptor 9) and which is freed when it closes it.
// Descriptors 3 and up to 8 are left to the caller (providers/local passes
// bwrap its options and seccomp filter on 3 and 4).
const Script = `d=$1 m=$2 t=$3
shift 3
echo $$ >"$d/pid.tmp" && mv -f "$d/pid.tmp" "$d/` + FilePID + `" || { rm -f "$d/` + FileStdin + `"; exit 1; }
exec 9<"$d/` + FileStdin + `"
rm -f "$d/` + FileStdin + `"
[ -e "$d/` + FileCancel + `" ] && exit 0
rm -f "$d/out.fifo" "$d/err.fifo"
mkfifo "$d/out.fifo" "$d/err.fifo" || exit 1
{ head -c "$m" >"$d/` + FileStdout + `"; wc -c >"$d/` + FileStdoutN + `"; } <"$d/out.fifo" 9<&- &
{ head -c "$m" >"$d/` + FileStderr + `"; wc -c >"$d/` + FileStderrN + `"; } <"$d/err.fifo" 9<&- &
w=
if [ "$t" -gt 0 ]; then
	(
		trap 'kill "$s" 2>/dev/null; exit 0' TERM
		sleep "$t" &
		s=$!
		wait "$s"
		: >"$d/` + FileTimedOut + `"
		kill -KILL 0
	) 9<&- &
	w=$!
fi
"$@" <&9 9<&- >"$d/out.fifo" 2>"$d/err.fifo" &
exec 9<&-
wait "$!"
c=$?
[ -z "$w" ] || kill "$w" 2>/dev/null
wait
rm -f "$d/out.fifo" "$d/err.fifo"
echo "$c" >"$d/exit.tmp" && mv -f "$d/exit.tmp" "$d/` + FileExit + `"
`

// Exit codes of the launch script; they avoid those of sh and the tools.
const (
	exitNoSetsid = 84 // no setsid: the runner could not lead its own group
	exitNoDir    = 85 // the command's directory could not be made
	exitFenced   = 86 // a cancel came first
	exitClaimed  = 87 // launched before
)

// launchScript gets $1 = the runner script, $2 = the command's directory,
// $3 = max bytes, $4 = timeout seconds, $5 = a random token, the command's
// stdin on its stdin and its argv after. It claims the directory
// exclusively and starts the runner in a new session, detached from the
// exec, which returns at once.
var launchScript = `r=$1 d=$2 m=$3 t=$4 k=$5
shift 5
command -v setsid >/dev/null 2>&1 || exit ` + strconv.Itoa(exitNoSetsid) + `
mkdir -p -- "$d" 2>/dev/null || exit ` + strconv.Itoa(exitNoDir) + `
[ -e "$d/` + FileCancel + `" ] && exit ` + strconv.Itoa(exitFenced) + `
i=$d/stdin.$k
cat >"$i" || { rm -f "$i"; exit ` + strconv.Itoa(exitNoDir) + `; }
if ! (set -C; : >"$d/` + FileClaim + `") 2>/dev/null; then
	rm -f "$i"
	exit ` + strconv.Itoa(exitClaimed) + `
fi
mv -f "$i" "$d/` + FileStdin + `"
setsid sh -c "$r" sh "$d" "$m" "$t" "$@" </dev/null >/dev/null 2>&1 &
exit 0
`

// readScript gets $1 = the command's directory and $2 = max bytes. It
// prints the state line (absent, running, completed CODE, canceled,
// timedout or lost), then for a finished command a line of four counts
// (stdout kept, stdout more, stderr kept, stderr more) and at most $2
// bytes of stdout and of stderr.
//
// It asks whether the runner is gone before it looks at any mark: the
// runner writes the exit status, and the watchdog and a cancel their
// marks, before the runner dies, so a runner found gone has left every
// file it ever will. Asked after the marks, a runner that finished (or
// was killed at its timeout) between the two looks would read as lost.
var readScript = `d=$1 m=$2
[ -e "$d/` + FileClaim + `" ] || { echo absent; exit 0; }
g=
p=$(cat "$d/` + FilePID + `" 2>/dev/null) && [ -n "$p" ] && ! kill -0 "$p" 2>/dev/null && g=1
if [ -e "$d/` + FileExit + `" ]; then s="completed $(cat "$d/` + FileExit + `")"
	# The watchdog marks its kill before it sends it: an exit recorded after
	# it is the timeout's (as ReadDir reads it).
	[ -e "$d/` + FileTimedOut + `" ] && s=timedout
elif [ -e "$d/` + FileCancel + `" ]; then s=canceled
elif [ -e "$d/` + FileTimedOut + `" ]; then s=timedout
elif [ -n "$g" ]; then s=lost
else echo running; exit 0
fi
n() { if [ -e "$1" ]; then wc -c <"$1"; else echo 0; fi; }
r() { if [ -s "$1" ]; then cat "$1"; else echo 0; fi; }
echo "$s"
echo $(n "$d/` + FileStdout + `") $(r "$d/` + FileStdoutN + `") $(n "$d/` + FileStderr + `") $(r "$d/` + FileStderrN + `")
[ -e "$d/` + FileStdout + `" ] && head -c "$m" "$d/` + FileStdout + `"
[ -e "$d/` + FileStderr + `" ] && head -c "$m" "$d/` + FileStderr + `"
exit 0
`

// cancelScript gets $1 = the command's directory. A finished command is
// left alone; otherwise it writes the fence and kills the runner's whole
// process group, if the runner recorded itself.
var cancelScript = `d=$1
mkdir -p -- "$d" 2>/dev/null || exit 1
[ -e "$d/` + FileExit + `" ] && exit 0
: >"$d/` + FileCancel + `" || exit 1
[ -e "$d/` + FileExit + `" ] && exit 0
p=$(cat "$d/` + FilePID + `" 2>/dev/null) && [ -n "$p" ] && kill -9 "-$p" 2>/dev/null
exit 0
`

// Execer runs one command in a sandbox; every [providers.Provider] is one.
type Execer interface {
	Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error)
}

// opTimeout bounds one exec of the launch, read or cancel scripts.
const opTimeout = time.Minute

// Runner is the generic [providers.Commander] over Exec. It needs sandboxes
// that keep background processes running between execs, sh, setsid and
// GNU coreutils. Create it with New.
type Runner struct {
	ex  Execer
	dir string
}

// New returns a Runner that keeps commands under dir in the sandbox; ""
// means DefaultDir.
func New(ex Execer, dir string) *Runner {
	if dir == "" {
		dir = DefaultDir
	}
	return &Runner{ex: ex, dir: dir}
}

// For returns p's own Commander when it has one, else a Runner over its Exec.
func For(p providers.Provider) providers.Commander {
	if c, ok := p.(providers.Commander); ok {
		return c
	}
	return New(p, "")
}

// checkID refuses an id that is not a safe single path segment.
func checkID(id string) error {
	if id == "" || len(id) > 128 || id[0] == '.' || strings.ContainsAny(id, "/\x00") {
		return errors.New("runner: command id is not a safe file name")
	}
	return nil
}

// CommandDir returns the directory of command id of sandbox sb under base.
// It is keyed by the sandbox's reference too, so a snapshot that carried
// another sandbox's command directories into this one can never answer for
// a command of this one.
func CommandDir(base string, sb providers.Sandbox, id string) string {
	sum := sha256.Sum256([]byte(sb.Ref))
	return path.Join(base, hex.EncodeToString(sum[:8]), id)
}

func (r *Runner) path(sb providers.Sandbox, id string) string { return CommandDir(r.dir, sb, id) }

// StartCommand implements [providers.Commander].
func (r *Runner) StartCommand(ctx context.Context, sb providers.Sandbox, id string, spec providers.ExecSpec) error {
	if err := checkID(id); err != nil {
		return fmt.Errorf("%w: %w", providers.ErrCommandNotStarted, err)
	}
	if len(spec.Argv) == 0 {
		return fmt.Errorf("runner: start: empty argv: %w", providers.ErrCommandNotStarted)
	}
	argv := []string{"sh", "-c", launchScript, "sh", Script, r.path(sb, id),
		strconv.FormatInt(max(spec.MaxOutputBytes, 0), 10), strconv.FormatInt(TimeoutSeconds(spec.Timeout), 10), token()}
	argv = append(argv, wrapDir(spec.Dir, spec.Argv)...)
	res, err := r.ex.Exec(ctx, sb, providers.ExecSpec{Argv: argv, Stdin: spec.Stdin, Timeout: opTimeout, MaxOutputBytes: 1024})
	if err != nil {
		return fmt.Errorf("runner: start: %w", err)
	}
	switch {
	case res.TimedOut:
		return errors.New("runner: start: the launch timed out")
	case res.ExitCode == 0, res.ExitCode == exitClaimed:
		return nil
	case res.ExitCode == exitFenced:
		return fmt.Errorf("runner: start: %w", providers.ErrCommandFenced)
	case res.ExitCode == exitNoSetsid, res.ExitCode == exitNoDir:
		return fmt.Errorf("runner: start: the sandbox cannot run durable commands (exit code %d): %w", res.ExitCode, providers.ErrCommandNotStarted)
	}
	return fmt.Errorf("runner: start: launch failed with exit code %d", res.ExitCode)
}

// wrapDir runs argv in dir, when one is set, through sh's cd: the runner
// itself always starts in the sandbox's default directory. dir is passed as
// an argument, never spliced into the script.
func wrapDir(dir string, argv []string) []string {
	if dir == "" {
		return argv
	}
	return append([]string{"sh", "-c", `cd "$1" || exit 126; shift; exec "$@"`, "sh", dir}, argv...)
}

// TimeoutSeconds rounds a timeout up to whole seconds for the runner; 0
// means none.
func TimeoutSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// ReadCommand implements [providers.Commander].
func (r *Runner) ReadCommand(ctx context.Context, sb providers.Sandbox, id string, maxOut int64) (providers.CommandStatus, error) {
	if err := checkID(id); err != nil {
		return providers.CommandStatus{}, err
	}
	maxOut = max(maxOut, 0)
	res, err := r.ex.Exec(ctx, sb, providers.ExecSpec{
		Argv:    []string{"sh", "-c", readScript, "sh", r.path(sb, id), strconv.FormatInt(maxOut, 10)},
		Timeout: opTimeout, MaxOutputBytes: 2*maxOut + 1024,
	})
	if err != nil {
		return providers.CommandStatus{}, fmt.Errorf("runner: read: %w", err)
	}
	if res.ExitCode != 0 || res.TimedOut || res.StdoutTruncated {
		return providers.CommandStatus{}, fmt.Errorf("runner: read: failed in the sandbox with exit code %d", res.ExitCode)
	}
	return parseRead(res.Stdout, maxOut)
}

// parseRead decodes the read script's output.
func parseRead(b []byte, maxOut int64) (providers.CommandStatus, error) {
	line, rest, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) == 0 {
		return providers.CommandStatus{}, errors.New("runner: read: no state")
	}
	var st providers.CommandStatus
	switch f[0] {
	case "absent":
		return st, nil
	case "running":
		st.State = providers.CommandRunning
		return st, nil
	case "completed":
		if len(f) != 2 {
			return st, errors.New("runner: read: completed without an exit status")
		}
		code, err := strconv.Atoi(f[1])
		if err != nil {
			return st, errors.New("runner: read: malformed exit status")
		}
		st.State, st.ExitCode = providers.CommandCompleted, code
	case "canceled":
		st.State, st.ExitCode = providers.CommandCanceled, killed
	case "timedout":
		st.State, st.ExitCode, st.TimedOut = providers.CommandCompleted, killed, true
	case "lost":
		st.State, st.ExitCode = providers.CommandCompleted, killed
	default:
		return st, errors.New("runner: read: unknown state")
	}
	line, rest, _ = bytes.Cut(rest, []byte("\n"))
	var n [4]int64
	f = strings.Fields(string(line))
	if len(f) != 4 {
		return st, errors.New("runner: read: malformed counts")
	}
	for i := range n {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil || v < 0 {
			return st, errors.New("runner: read: malformed counts")
		}
		n[i] = v
	}
	outLen, errLen := min(n[0], maxOut), min(n[2], maxOut)
	if int64(len(rest)) != outLen+errLen {
		return st, fmt.Errorf("runner: read: got %d bytes of output, want %d", len(rest), outLen+errLen)
	}
	st.Stdout, st.Stderr = rest[:outLen:outLen], rest[outLen:]
	st.StdoutBytes, st.StderrBytes = n[0]+n[1], n[2]+n[3]
	st.StdoutTruncated, st.StderrTruncated = st.StdoutBytes > outLen, st.StderrBytes > errLen
	return st, nil
}

// killed is the exit status of a command killed with SIGKILL: by a cancel,
// at its timeout, or by something outside the broker (the runner lost).
const killed = 128 + 9

// CancelCommand implements [providers.Commander].
func (r *Runner) CancelCommand(ctx context.Context, sb providers.Sandbox, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	res, err := r.ex.Exec(ctx, sb, providers.ExecSpec{
		Argv: []string{"sh", "-c", cancelScript, "sh", r.path(sb, id)}, Timeout: opTimeout,
	})
	if err != nil {
		return fmt.Errorf("runner: cancel: %w", err)
	}
	if res.ExitCode != 0 || res.TimedOut {
		return fmt.Errorf("runner: cancel: failed in the sandbox with exit code %d", res.ExitCode)
	}
	return nil
}

func token() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Interface guards
var _ providers.Commander = (*Runner)(nil)
