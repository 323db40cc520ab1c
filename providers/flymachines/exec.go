package flymachines

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/tick"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/runner"
)

// execDir is the broker-owned directory in the guest under which each
// direct exec keeps its stdin, output and pid while it runs: under the
// agent's directory, which no jail sees, so a tenant cannot touch the pid
// a kill reads.
const execDir = providers.GuestExecDir

// inlineStdin is the most base64 of stdin one vendor exec carries (a
// multiple of 4, so that pieces decode on their own); more is staged into
// the guest in pieces of this size first.
const inlineStdin = 1 << 20

// wrapScript runs one command in the guest so that its result survives
// exec's JSON strings. It gets $1 = its directory, $2 = how many bytes of
// base64 stdin to read from its own stdin and append to $1/in (read with
// head -c, so exec's stdin need not end), $3 = bytes kept per stream, $4 =
// the timeout in seconds, $5 = the working directory ("" for the
// default), $6 = 1 to run (0: only stage stdin), then argv.
//
// The command runs as the leader of its own session (setsid, which does
// not fork here: a background job of sh leads no group), so the timeout
// kills all it started. The answer comes once the command has exited and
// nothing holds its output open any more; a process it left behind in its
// session (one that did not leave it, as package runner's runner does) is
// killed at the timeout by the watchdog, which outlives the answer only
// while such a process remains. Each stream goes
// through a FIFO to a reader that keeps the first $3 bytes and counts the
// rest, so memory and disk stay bounded whatever the command writes; a
// reader that cannot keep its bytes (the guest's disk full) drains the
// stream and counts "lost", which fails the exec rather than answer part
// of the output as the whole. A staged piece is confirmed by a line
// "sandgate-staged N". The answer is one line "sandgate-exec STATUS
// TIMEDOUT MORE_OUT MORE_ERR" and the kept stdout and stderr, each base64
// on a line of its own.
const wrapScript = `d=$1 n=$2 m=$3 t=$4 w=$5 r=$6
shift 6
umask 077
mkdir -p "$d" || exit 90
if [ "$n" -gt 0 ]; then head -c "$n" | base64 -d >>"$d/in" || { rm -rf "$d"; exit 91; }; fi
[ "$r" = 1 ] || { echo "sandgate-staged $n"; exit 0; }
: >>"$d/in"
mkfifo "$d/o" "$d/e" || { rm -rf "$d"; exit 92; }
{ head -c "$m" >"$d/so" && wc -c >"$d/no" || { cat >/dev/null; echo lost >"$d/no"; }; } <"$d/o" &
o=$!
{ head -c "$m" >"$d/se" && wc -c >"$d/ne" || { cat >/dev/null; echo lost >"$d/ne"; }; } <"$d/e" &
e=$!
setsid sh -c 'echo $$ >"$1/pid"; if [ -n "$2" ]; then cd "$2" || exit 126; fi; shift 2; exec "$@"' sh "$d" "$w" "$@" <"$d/in" >"$d/o" 2>"$d/e" &
c=$!
sh -c 'trap "kill \"\$s\" 2>/dev/null; exit 0" TERM; sleep "$1" & s=$!; wait "$s"; : >"$2/to"; kill -9 "-$3" 2>/dev/null || kill -9 "$3" 2>/dev/null' sh "$t" "$d" "$c" </dev/null >/dev/null 2>&1 &
k=$!
wait "$c"
s=$?
wait "$o" "$e"
kill -0 "-$c" 2>/dev/null || kill "$k" 2>/dev/null
x=0
[ -e "$d/to" ] && [ "$s" -eq 137 ] && x=1
a=$(cat "$d/no" 2>/dev/null) b=$(cat "$d/ne" 2>/dev/null)
echo "sandgate-exec $s $x ${a:-lost} ${b:-lost}"
base64 -w0 "$d/so"; echo
base64 -w0 "$d/se"; echo
rm -rf "$d"
exit 0
`

// killScript gets $1 = a direct exec's directory and kills the session
// of its command, if it recorded itself.
const killScript = `p=$(cat "$1/pid" 2>/dev/null) && [ -n "$p" ] && kill -9 "-$p" 2>/dev/null; exit 0`

// Exec runs spec in the Machine, in a fresh jail of the agent. A command
// whose timeout fits one vendor exec (cfg.DirectExecMax) runs directly; a
// longer one, or one without a timeout, runs as a durable command of
// package runner and is polled, so that no single vendor exec outlives
// the vendor's exec limit. Returns providers.ErrSandboxGone once the
// Machine is gone.
func (p *Provider) Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	if err := checkSpec(spec); err != nil {
		return providers.ExecResult{}, err
	}
	spec, err := p.jailed(ctx, sb, spec)
	if err != nil {
		return providers.ExecResult{}, err
	}
	start := time.Now()
	var res providers.ExecResult
	via := "exec"
	if spec.Timeout > 0 && spec.Timeout <= p.cfg.DirectExecMax {
		res, err = p.direct(ctx, sb, spec)
	} else {
		via = "runner"
		res, err = p.viaRunner(ctx, sb, spec)
	}
	if err != nil {
		return providers.ExecResult{}, err
	}
	p.log.Debug("exec finished", "fly_machine_id", sb.Ref, "via", via,
		"argc", len(spec.Argv), "stdin_bytes", len(spec.Stdin), "exit_code", res.ExitCode,
		"stdout_bytes", res.StdoutBytes, "stderr_bytes", res.StderrBytes, "timed_out", res.TimedOut,
		"duration", time.Since(start))
	return res, nil
}

// checkSpec refuses what cannot be passed to a process
// (providers.ExecSpec.Check).
func checkSpec(spec providers.ExecSpec) error {
	if err := spec.Check(); err != nil {
		return fmt.Errorf("flymachines: exec: %w", err)
	}
	return nil
}

// directExecer is the provider's direct exec, for packages runner,
// execfile and execsnap: their scripts are short, so a timeout over
// cfg.DirectExecMax is cut to it. With jail, the script runs in a fresh
// jail without egress or the workspace's env (files and snapshots: a path
// then resolves as the tenant sees it, never into the agent's
// directory); without, as root of the guest (the runner, whose files are
// in the agent's directory and whose commands start their own jail).
type directExecer struct {
	p    *Provider
	jail bool
}

func (d directExecer) Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	if err := checkSpec(spec); err != nil {
		return providers.ExecResult{}, err
	}
	if d.jail {
		spec.Argv = providers.GuestRunArgv(nil, spec.Dir, false, spec.Argv)
		spec.Dir = ""
	}
	if spec.Timeout <= 0 || spec.Timeout > d.p.cfg.DirectExecMax {
		spec.Timeout = d.p.cfg.DirectExecMax
	}
	return d.p.direct(ctx, sb, spec)
}

// direct runs spec through wrapScript in one vendor exec (after staging a
// large stdin in pieces). When the exec's answer is lost (a canceled
// context, a 408, a broken connection) the command is killed by a second
// exec, best effort; its own timeout in the guest bounds it regardless.
func (p *Provider) direct(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	dir := execDir + "/" + randomHex(12)
	stdin := base64.StdEncoding.EncodeToString(spec.Stdin)
	maxOut := max(spec.MaxOutputBytes, 0)
	secs := strconv.FormatFloat(spec.Timeout.Seconds(), 'f', 3, 64)
	for len(stdin) > inlineStdin {
		piece := stdin[:inlineStdin]
		stdin = stdin[inlineStdin:]
		out, err := p.vendorExec(ctx, sb, []string{"sh", "-c", wrapScript, "sh", dir, strconv.Itoa(len(piece)), "0", "0", "", "0"}, piece, p.cfg.DirectExecMax, 4<<10)
		if err != nil {
			p.cleanup(ctx, sb, dir)
			return providers.ExecResult{}, fmt.Errorf("flymachines: exec: stage stdin: %w", err)
		}
		// The wrapper confirms a staged piece on stdout: an answer sent as
		// raw output carries no exit status (sheet §1.5, UNCERTAIN).
		if out.ExitCode != 0 || !bytes.Equal(bytes.TrimSpace(out.Stdout), []byte("sandgate-staged "+strconv.Itoa(len(piece)))) {
			p.cleanup(ctx, sb, dir)
			return providers.ExecResult{}, fmt.Errorf("flymachines: exec: stage stdin: exit code %d in the guest, no confirmation", out.ExitCode)
		}
	}
	argv := append([]string{"sh", "-c", wrapScript, "sh", dir, strconv.Itoa(len(stdin)), strconv.FormatInt(maxOut, 10), secs, spec.Dir, "1"}, spec.Argv...)
	// The answer holds at most two streams of maxOut bytes in base64.
	limit := 2*(base64.StdEncoding.EncodedLen(int(min(maxOut, 1<<40)))) + 64<<10
	out, err := p.vendorExec(ctx, sb, argv, stdin, spec.Timeout, int64(limit)*2)
	if err != nil {
		var gone bool
		err, gone = p.mapGone(ctx, sb, err)
		if !gone {
			p.kill(ctx, sb, dir)
		}
		if ctx.Err() != nil {
			return providers.ExecResult{}, fmt.Errorf("flymachines: exec: %w", context.Cause(ctx))
		}
		return providers.ExecResult{}, fmt.Errorf("flymachines: exec: %w", err)
	}
	res, perr := parseWrapped(out.Stdout, maxOut)
	if perr != nil {
		if out.ExitSignal > 0 || out.ExitCode != 0 {
			return providers.ExecResult{}, fmt.Errorf("flymachines: exec: the guest wrapper failed with exit code %d, signal %d", out.ExitCode, out.ExitSignal)
		}
		return providers.ExecResult{}, fmt.Errorf("flymachines: exec: %w", perr)
	}
	return res, nil
}

// outsidePath is the whole environment of the broker's scripts that run as
// the guest's root outside every jail.
const outsidePath = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"

// outsideArgv runs argv with an environment of outsidePath alone: the
// vendor's exec gives a command the Machine's environment, which is not
// the broker's to trust.
func outsideArgv(argv []string) []string {
	return append([]string{"/usr/bin/env", "-i", outsidePath}, argv...)
}

// vendorOut is a vendor exec's outcome.
type vendorOut struct {
	Stdout     []byte
	ExitCode   int
	ExitSignal int
}

// vendorExec sends one exec. The vendor's timeout is the command's plus a
// margin, so the guest's own timeout answers first. Both answer types of
// the exec route are read: JSON ExecResponse, or the raw output as
// application/octet-stream (whose exit status is not documented; the
// wrapper's own answer line carries it).
func (p *Provider) vendorExec(ctx context.Context, sb providers.Sandbox, argv []string, stdin string, timeout time.Duration, limit int64) (vendorOut, error) {
	vt := int(timeout/time.Second) + 10
	ctx, cancel := context.WithTimeout(ctx, time.Duration(vt+15)*time.Second)
	defer cancel()
	// A taken pooled Machine not bound yet is bound first, in this same
	// exec (pool.go).
	bind := p.jails.pendingBind(sb.Ref)
	if bind != nil {
		argv = append(append([]string{"sh", "-c", bindScript, "sh"}, bind...), argv...)
	}
	out, err := p.sendExec(ctx, sb, argv, stdin, vt, limit)
	if err != nil || bind == nil {
		return out, err
	}
	rest, ok := bytes.CutPrefix(out.Stdout, []byte(boundMark))
	if !ok {
		return vendorOut{}, fmt.Errorf("fly: exec: the Machine could not be bound to its workspace (exit code %d in the guest)", out.ExitCode)
	}
	p.jails.bound(sb.Ref)
	out.Stdout = rest
	return out, nil
}

// sendExec sends one exec of argv, outside every jail, and decodes its answer.
func (p *Provider) sendExec(ctx context.Context, sb providers.Sandbox, argv []string, stdin string, vt int, limit int64) (vendorOut, error) {
	req := ExecRequest{Command: outsideArgv(argv), Stdin: stdin, Timeout: vt}
	var raw rawAnswer
	for attempt := 0; ; attempt++ {
		err := p.c.do(ctx, "exec", http.MethodPost, p.machinePath(sb.Ref)+"/exec", nil, req, &raw, limit)
		if err == nil {
			break
		}
		// A 429 is the rate limiter refusing the request before anything
		// ran (Fly allows about 1 request per second per action and
		// Machine, bursts of 3): that alone is safe to send again.
		if !statusIs(err, http.StatusTooManyRequests) || attempt >= 5 {
			return vendorOut{}, err
		}
		if serr := p.c.sleep(ctx, time.Duration(500<<attempt)*time.Millisecond); serr != nil {
			return vendorOut{}, err
		}
	}
	mt, _, _ := mime.ParseMediaType(raw.contentType)
	if mt == "application/octet-stream" {
		return vendorOut{Stdout: raw.body}, nil
	}
	var er ExecResponse
	if len(bytes.TrimSpace(raw.body)) > 0 {
		if err := json.Unmarshal(raw.body, &er); err != nil {
			return vendorOut{}, errors.New("fly: exec: undecodable answer")
		}
	}
	code := er.ExitCode
	if er.ExitSignal > 0 && code <= 0 {
		code = 128 + er.ExitSignal
	}
	return vendorOut{Stdout: []byte(er.Stdout), ExitCode: code, ExitSignal: er.ExitSignal}, nil
}

// parseWrapped decodes wrapScript's answer.
func parseWrapped(b []byte, maxOut int64) (providers.ExecResult, error) {
	bad := errors.New("the guest wrapper's answer is malformed")
	i := bytes.Index(b, []byte("sandgate-exec "))
	if i < 0 {
		return providers.ExecResult{}, bad
	}
	lines := strings.Split(string(b[i:]), "\n")
	if len(lines) < 3 {
		return providers.ExecResult{}, bad
	}
	f := strings.Fields(lines[0])
	if len(f) != 5 {
		return providers.ExecResult{}, bad
	}
	if f[3] == "lost" || f[4] == "lost" {
		return providers.ExecResult{}, errors.New("the guest could not keep the command's output (is its disk full?)")
	}
	var n [4]int64
	for j := range n {
		v, err := strconv.ParseInt(f[j+1], 10, 64)
		if err != nil || v < 0 {
			return providers.ExecResult{}, bad
		}
		n[j] = v
	}
	so, err1 := base64.StdEncoding.DecodeString(strings.TrimSpace(lines[1]))
	se, err2 := base64.StdEncoding.DecodeString(strings.TrimSpace(lines[2]))
	if err1 != nil || err2 != nil || int64(len(so)) > maxOut || int64(len(se)) > maxOut {
		return providers.ExecResult{}, bad
	}
	res := providers.ExecResult{
		ExitCode: int(n[0]), TimedOut: n[1] == 1,
		Stdout: so, Stderr: se,
		StdoutBytes: int64(len(so)) + n[2], StderrBytes: int64(len(se)) + n[3],
	}
	res.StdoutTruncated, res.StderrTruncated = n[2] > 0, n[3] > 0
	return res, nil
}

// mapGone turns a failed vendor call into ErrSandboxGone when the Machine
// is gone: a 404, or any other refusal of a Machine the vendor reports in
// a state that never runs a command again.
func (p *Provider) mapGone(ctx context.Context, sb providers.Sandbox, err error) (error, bool) {
	if statusIs(err, http.StatusNotFound) {
		return providers.ErrSandboxGone, true
	}
	var ae *APIError
	if !errors.As(err, &ae) || ae.StatusCode >= 500 || ae.StatusCode == http.StatusRequestTimeout || ae.StatusCode == http.StatusTooManyRequests {
		return err, false
	}
	m, gerr := p.get(context.WithoutCancel(ctx), sb.Ref)
	if statusIs(gerr, http.StatusNotFound) || (gerr == nil && goneStates[m.State]) {
		return fmt.Errorf("%w (%w)", providers.ErrSandboxGone, err), true
	}
	return err, false
}

// kill kills a direct exec's command after its answer was lost.
func (p *Provider) kill(ctx context.Context, sb providers.Sandbox, dir string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	if _, err := p.vendorExec(ctx, sb, []string{"sh", "-c", killScript, "sh", dir}, "", 5*time.Second, 64<<10); err != nil {
		p.log.Warn("exec not killed after its answer was lost", "fly_machine_id", sb.Ref, sandgate.KeyError, err)
	}
}

// cleanup removes a direct exec's directory, best effort.
func (p *Provider) cleanup(ctx context.Context, sb providers.Sandbox, dir string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	p.vendorExec(ctx, sb, []string{"rm", "-rf", "--", dir}, "", 5*time.Second, 64<<10)
}

// viaRunner runs spec as a durable command and polls it to the end. A
// canceled context cancels the command (killing all it started).
func (p *Provider) viaRunner(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	id := "exec-" + randomHex(12)
	if err := p.runner.StartCommand(ctx, sb, id, spec); err != nil {
		if ctx.Err() != nil {
			p.cancelCommand(ctx, sb, id)
			return providers.ExecResult{}, fmt.Errorf("flymachines: exec: %w", context.Cause(ctx))
		}
		return providers.ExecResult{}, fmt.Errorf("flymachines: exec: %w", err)
	}
	defer p.cleanup(ctx, sb, runner.CommandDir(providers.GuestCommandDir, sb, id))
	pause, failures := 100*time.Millisecond, 0
	for {
		st, err := p.runner.ReadCommand(ctx, sb, id, max(spec.MaxOutputBytes, 0))
		if ctx.Err() != nil {
			p.cancelCommand(ctx, sb, id)
			return providers.ExecResult{}, fmt.Errorf("flymachines: exec: %w", context.Cause(ctx))
		}
		if err != nil && !errors.Is(err, providers.ErrSandboxGone) && failures < 5 {
			// A read changes nothing: poll again after a vendor failure.
			failures++
			p.log.Warn("durable exec not read; polling again", "fly_machine_id", sb.Ref, sandgate.KeyError, err)
		} else if err != nil {
			return providers.ExecResult{}, fmt.Errorf("flymachines: exec: %w", err)
		}
		if err == nil && (st.State == providers.CommandCompleted || st.State == providers.CommandCanceled) {
			return providers.ExecResult{
				ExitCode: st.ExitCode, TimedOut: st.TimedOut,
				Stdout: st.Stdout, Stderr: st.Stderr,
				StdoutTruncated: st.StdoutTruncated, StderrTruncated: st.StderrTruncated,
				StdoutBytes: st.StdoutBytes, StderrBytes: st.StderrBytes,
			}, nil
		}
		if err := tick.Sleep(ctx, pause); err != nil {
			p.cancelCommand(ctx, sb, id)
			return providers.ExecResult{}, fmt.Errorf("flymachines: exec: %w", err)
		}
		pause = min(2*pause, 2*time.Second)
	}
}

func (p *Provider) cancelCommand(ctx context.Context, sb providers.Sandbox, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := p.runner.CancelCommand(ctx, sb, id); err != nil {
		p.log.Warn("exec not canceled", "fly_machine_id", sb.Ref, sandgate.KeyError, err)
	}
}

// StartCommand launches a durable command in a fresh jail; see
// [providers.Commander].
func (p *Provider) StartCommand(ctx context.Context, sb providers.Sandbox, id string, spec providers.ExecSpec) error {
	if err := checkSpec(spec); err != nil {
		return fmt.Errorf("%w: %w", providers.ErrCommandNotStarted, err)
	}
	spec, err := p.jailed(ctx, sb, spec)
	if err != nil {
		return err
	}
	return p.runner.StartCommand(ctx, sb, id, spec)
}

// ReadCommand reads a durable command; see [providers.Commander].
func (p *Provider) ReadCommand(ctx context.Context, sb providers.Sandbox, id string, maxOut int64) (providers.CommandStatus, error) {
	return p.runner.ReadCommand(ctx, sb, id, maxOut)
}

// CancelCommand cancels a durable command; see [providers.Commander].
func (p *Provider) CancelCommand(ctx context.Context, sb providers.Sandbox, id string) error {
	return p.runner.CancelCommand(ctx, sb, id)
}

func randomHex(n int) string {
	b := make([]byte, n)
	randRead(b)
	return fmt.Sprintf("%x", b)
}
