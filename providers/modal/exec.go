package modal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/execfile"
	"github.com/sandgate/sandgate/providers/internal/uuid"
	"github.com/sandgate/sandgate/providers/modal/proto/routerpb"
)

// Exec limits and timings.
const (
	// maxArgBytes is the SDK's limit on argv (Modal's ARG_MAX is about
	// twice that).
	maxArgBytes = 65536
	stdinChunk  = 1 << 20
	// waitCall is the per-call deadline of TaskExecWait; it is called
	// again, every second on a failure, until the exec's own deadline.
	waitCall  = 60 * time.Second
	waitRetry = time.Second
	// execGrace is how long past its timeout the broker waits for Modal
	// to report a command's end before it kills the command itself.
	execGrace = 10 * time.Second
	// drainWait bounds reading the rest of the output once the command
	// has ended (a background child may hold the output open).
	drainWait = 5 * time.Second
	killWait  = 30 * time.Second
	// timeoutMargin is how much later than the in-sandbox timeout Modal's
	// own exec timeout falls, so that the wrapper, not Modal, kills the
	// command and every child it started, and tells a timeout.
	timeoutMargin = 5 * time.Second
	// argvFileDir holds the argv file of a command whose argv is over
	// what Modal takes in TaskExecStart (wrapArgvFile); the launcher
	// removes it before the command starts.
	argvFileDir = "/tmp"
)

// execMarker prefixes the argument that names an exec's process group, so
// that a canceled Exec can find and kill it (Modal's router has no kill).
const execMarker = "sandgate-exec-"

// wrap runs argv, without a shell, under GNU timeout: timeout leads its own
// process group (which every process the command starts joins), kills that
// whole group at the deadline, and otherwise exits as the command did, a
// signal included. The marker argument makes the group findable.
func wrap(execID string, timeout time.Duration, argv []string) []string {
	return append([]string{"timeout", "-s", "KILL", timeoutSecs(timeout), "sh", "-c", `exec "$@"`, execMarker + execID}, argv...)
}

// timeoutSecs is GNU timeout's duration argument: "0" for none.
func timeoutSecs(timeout time.Duration) string {
	if timeout <= 0 {
		return "0"
	}
	return strconv.FormatFloat(timeout.Seconds(), 'f', 3, 64)
}

// argvLauncher runs the command whose argv the shell file $1 sets (set
// -- with every argument single-quoted, argvScript), without a shell
// between: it reads the file, removes it, and execs the command, whose
// exit status, signals and stdin are its own.
const argvLauncher = `f=$1 && . "$f" && rm -f -- "$f" && exec "$@"`

// argvScript is the file argvLauncher reads: argv single-quoted, which
// holds any byte but NUL (ExecSpec.Check refuses NUL).
func argvScript(argv []string) string {
	var b strings.Builder
	b.WriteString("set --")
	for _, a := range argv {
		b.WriteString(" '")
		b.WriteString(strings.ReplaceAll(a, "'", `'\''`))
		b.WriteString("'")
	}
	b.WriteString("\n")
	return b.String()
}

// wrapArgvFile is wrap for an argv written to file in the sandbox first:
// Modal's SDKs keep command_args under 64 KiB, the protocol allows 256
// KiB of argv.
func wrapArgvFile(execID string, timeout time.Duration, file string) []string {
	return []string{"timeout", "-s", "KILL", timeoutSecs(timeout), "sh", "-c", argvLauncher, execMarker + execID, file}
}

// killScript kills the process group of the exec whose marker is
// sandgate-exec-$1. Its own arguments never hold the whole marker.
const killScript = `for p in /proc/[0-9]*; do
	case " $(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)" in
	*" ` + execMarker + `$1 "*) n=${p#/proc/}; kill -9 "-$n" "$n" 2>/dev/null ;;
	esac
done
exit 0
`

// Exec runs one command through the sandbox's command router; see
// [providers.Provider]. TaskExecStart is never sent twice: a command may
// have run once it was dispatched.
func (p *Provider) Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	if len(spec.Argv) == 0 {
		return providers.ExecResult{}, errors.New("modal: exec: empty argv")
	}
	n := 0
	for _, a := range spec.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return providers.ExecResult{}, errors.New("modal: exec: argv holds a NUL byte")
		}
		n += len(a)
	}
	argvFile := ""
	if n+len(spec.Argv) > maxArgBytes-512 {
		// Over what Modal takes: the argv goes to a file first, which
		// a small launcher runs (wrapArgvFile).
		argvFile = argvFileDir + "/.sandgate-argv-" + uuid.New()
		if err := execfile.WriteFile(ctx, p, sb, argvFile, strings.NewReader(argvScript(spec.Argv))); err != nil {
			return providers.ExecResult{}, fmt.Errorf("modal: exec: write the argv file: %w", err)
		}
	}
	r, err := p.router(ctx, sb.Ref)
	if err != nil {
		return providers.ExecResult{}, err
	}
	start := time.Now()
	res, err := p.exec(ctx, r, spec, argvFile)
	if err != nil {
		return providers.ExecResult{}, err
	}
	p.log.Debug("exec finished",
		"argc", len(spec.Argv), "stdin_bytes", len(spec.Stdin), "exit_code", res.ExitCode,
		"stdout_bytes", res.StdoutBytes, "stderr_bytes", res.StderrBytes,
		"timed_out", res.TimedOut, "duration", time.Since(start))
	return res, nil
}

// exec runs spec through router r; argvFile, when set, holds spec's argv
// in the sandbox (wrapArgvFile).
func (p *Provider) exec(ctx context.Context, r *router, spec providers.ExecSpec, argvFile string) (providers.ExecResult, error) {
	execID := uuid.New()
	args := wrap(execID, spec.Timeout, spec.Argv)
	if argvFile != "" {
		args = wrapArgvFile(execID, spec.Timeout, argvFile)
	}
	req := &routerpb.TaskExecStartRequest{
		TaskId:       r.taskID,
		ExecId:       execID,
		CommandArgs:  args,
		StdoutConfig: routerpb.TaskExecStdoutConfig_TASK_EXEC_STDOUT_CONFIG_PIPE,
		StderrConfig: routerpb.TaskExecStderrConfig_TASK_EXEC_STDERR_CONFIG_PIPE,
	}
	if spec.Timeout > 0 {
		// Modal kills the command too, a margin after the wrapper does
		// (whole seconds, rounded up).
		secs := uint32((spec.Timeout + timeoutMargin + time.Second - 1) / time.Second)
		req.TimeoutSecs = &secs
	}
	if spec.Dir != "" {
		req.Workdir = &spec.Dir
	}
	start := time.Now()
	err := p.call(ctx, r, nil, func(ctx context.Context) error {
		_, err := r.rc.TaskExecStart(ctx, req)
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			// Canceled in flight: the start may have been dispatched.
			kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killWait)
			p.kill(kctx, r, execID)
			cancel()
		}
		return providers.ExecResult{}, p.routerError(ctx, r, "exec: start", err)
	}

	// The command runs. Feed stdin and read both streams while waiting.
	ioctx, stopIO := context.WithCancel(context.WithoutCancel(ctx))
	defer stopIO()
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		p.writeStdin(ioctx, r, execID, spec.Stdin)
	}()
	out := newCapture(spec.MaxOutputBytes)
	errOut := newCapture(spec.MaxOutputBytes)
	go func() {
		defer wg.Done()
		p.readStream(ioctx, r, execID, routerpb.TaskExecStdioFileDescriptor_TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDOUT, out)
	}()
	go func() {
		defer wg.Done()
		p.readStream(ioctx, r, execID, routerpb.TaskExecStdioFileDescriptor_TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDERR, errOut)
	}()
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()

	var deadline time.Time
	if spec.Timeout > 0 {
		deadline = start.Add(spec.Timeout + execGrace)
	}
	code, werr := p.wait(ctx, r, execID, deadline)
	timedOut := false
	switch {
	case ctx.Err() != nil:
		// The caller gave up: kill the command and everything it started
		// before answering, with a context of our own.
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killWait)
		p.kill(kctx, r, execID)
		cancel()
		return providers.ExecResult{}, context.Cause(ctx)
	case errors.Is(werr, errDeadline):
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killWait)
		p.kill(kctx, r, execID)
		cancel()
		code, timedOut = 128+9, true
	case werr != nil:
		return providers.ExecResult{}, werr
	}
	if spec.Timeout > 0 && code == 128+9 && time.Since(start) >= spec.Timeout {
		timedOut = true // killed by the wrapper's timeout (or Modal's)
	}
	select {
	case <-drained:
	case <-time.After(drainWait):
		stopIO()
		<-drained
	}
	res := providers.ExecResult{ExitCode: code, TimedOut: timedOut}
	res.Stdout, res.StdoutBytes, res.StdoutTruncated = out.result()
	res.Stderr, res.StderrBytes, res.StderrTruncated = errOut.result()
	return res, nil
}

// errDeadline: the exec ran past its timeout and grace without Modal
// reporting its end.
var errDeadline = errors.New("modal: exec: no exit status by the deadline")

// wait calls TaskExecWait until the command's exit status arrives: a
// 60 s deadline per call, again every second on a failure, until deadline
// (zero: none). A signal n is folded to 128+n.
func (p *Provider) wait(ctx context.Context, r *router, execID string, deadline time.Time) (int, error) {
	refreshed := false
	for {
		if !deadline.IsZero() && time.Now().After(deadline) {
			return 0, errDeadline
		}
		d := time.Now().Add(waitCall)
		if !deadline.IsZero() && deadline.Before(d) {
			d = deadline
		}
		cctx, cancel := context.WithDeadline(ctx, d)
		resp, err := r.rc.TaskExecWait(r.authed(cctx), &routerpb.TaskExecWaitRequest{TaskId: r.taskID, ExecId: execID})
		cancel()
		if err == nil {
			switch s := resp.GetExitStatus().(type) {
			case *routerpb.TaskExecWaitResponse_Code:
				return int(s.Code), nil
			case *routerpb.TaskExecWaitResponse_Signal:
				return 128 + int(s.Signal), nil
			}
			err = status.Error(codes.Unknown, "no exit status")
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		code := status.Code(err)
		switch {
		case code == codes.Unauthenticated && !refreshed:
			refreshed = true
			if rerr := p.refresh(ctx, r); rerr != nil {
				return 0, rerr
			}
			continue
		case code == codes.DeadlineExceeded:
			continue // the per-call deadline: call again
		case transient(code):
			if gone, derr := p.done(ctx, r.sandboxID); derr == nil && gone {
				return 0, p.routerError(ctx, r, "exec: wait", err)
			}
			if !sleep(ctx, waitRetry) {
				return 0, ctx.Err()
			}
			continue
		}
		return 0, p.routerError(ctx, r, "exec: wait", err)
	}
}

// writeStdin sends stdin in chunks at their byte offsets, then eof.
func (p *Provider) writeStdin(ctx context.Context, r *router, execID string, stdin []byte) {
	var off int
	for {
		end := min(off+stdinChunk, len(stdin))
		req := &routerpb.TaskExecStdinWriteRequest{TaskId: r.taskID, ExecId: execID, Offset: uint64(off), Data: stdin[off:end], Eof: end == len(stdin)}
		err := p.call(ctx, r, transient, func(ctx context.Context) error {
			_, err := r.rc.TaskExecStdinWrite(ctx, req)
			return err
		})
		if err != nil {
			if ctx.Err() == nil {
				p.log.Warn("exec stdin not delivered", "code", status.Code(err).String())
			}
			return
		}
		if end == len(stdin) {
			return
		}
		off = end
	}
}

// readStream reads one output stream to its end, reopening it at the
// offset received so far after a transient failure. A stream that ends
// otherwise (a lasting failure, or drainWait run out) is marked lost.
func (p *Provider) readStream(ctx context.Context, r *router, execID string, fd routerpb.TaskExecStdioFileDescriptor, c *capture) {
	failures := 0
	refreshed := false
	for {
		stream, err := r.rc.TaskExecStdioRead(r.authed(ctx), &routerpb.TaskExecStdioReadRequest{TaskId: r.taskID, ExecId: execID, Offset: uint64(c.total()), FileDescriptor: fd})
		for err == nil {
			var msg *routerpb.TaskExecStdioReadResponse
			if msg, err = stream.Recv(); err == nil {
				c.write(msg.GetData())
				failures = 0
			}
		}
		if err == io.EOF {
			return
		}
		if ctx.Err() != nil {
			c.lose() // the rest did not arrive within drainWait
			return
		}
		code := status.Code(err)
		if code == codes.Unauthenticated && !refreshed {
			refreshed = true
			if p.refresh(ctx, r) == nil {
				continue
			}
		}
		if !transient(code) || failures >= routerRetries {
			c.lose()
			return
		}
		failures++
		if !sleep(ctx, routerBackoff<<failures) {
			c.lose()
			return
		}
	}
}

// kill kills the exec's process group, and again until Modal reports the
// exec ended, for at most killWait: the kill may come before the command's
// process exists.
func (p *Provider) kill(ctx context.Context, r *router, execID string) {
	for ctx.Err() == nil {
		if _, err := p.run(ctx, r, []string{"sh", "-c", killScript, "sh", execID}); err != nil {
			return
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := r.rc.TaskExecWait(r.authed(pctx), &routerpb.TaskExecWaitRequest{TaskId: r.taskID, ExecId: execID})
		cancel()
		if err == nil && resp.GetExitStatus() != nil {
			return
		}
		if err != nil && status.Code(err) != codes.DeadlineExceeded {
			return
		}
	}
}

// run runs a helper command of the provider's own (not the client's) and
// returns its exit code.
func (p *Provider) run(ctx context.Context, r *router, argv []string) (int, error) {
	res, err := p.exec(ctx, r, providers.ExecSpec{Argv: argv, Timeout: time.Minute}, "")
	return res.ExitCode, err
}

// capture keeps the first max bytes of a stream and counts the rest; a
// stream lost before its end reads as truncated.
type capture struct {
	mu   sync.Mutex
	max  int64
	buf  []byte
	n    int64
	lost bool // the stream failed before its end
}

func newCapture(max int64) *capture { return &capture{max: max} }

func (c *capture) write(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if keep := c.max - int64(len(c.buf)); keep > 0 {
		c.buf = append(c.buf, b[:min(int64(len(b)), keep)]...)
	}
	c.n += int64(len(b))
}

// lose marks the stream as ended before its end: what was captured is
// reported truncated, never as the whole output (protocol: partial output
// is never presented as complete).
func (c *capture) lose() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lost = true
}

func (c *capture) total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func (c *capture) result() ([]byte, int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte{}, c.buf...), c.n, c.lost || c.n > int64(len(c.buf))
}

// ReadFile reads a file in the sandbox through Exec; see [execfile.ReadFile].
func (p *Provider) ReadFile(ctx context.Context, sb providers.Sandbox, path string, max int64, w io.Writer) (int64, error) {
	return execfile.ReadFile(ctx, p, sb, path, max, w)
}

// WriteFile writes a file in the sandbox through Exec; see [execfile.WriteFile].
func (p *Provider) WriteFile(ctx context.Context, sb providers.Sandbox, path string, r io.Reader) error {
	return execfile.WriteFile(ctx, p, sb, path, r)
}

// Interface guards
var _ execfile.Execer = (*Provider)(nil)
