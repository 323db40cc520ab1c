package gateway

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
)

// exec is POST …/exec: not replayable, so it is never retried by anyone.
//
// Its first round trip reads the workspace and marks the exec busy at once
// (store.DB.ExecBegin), so the body is read and checked before it, unless
// the token is still within a refusal of its rate limit (then it is
// refused before anything else, the body unread). The
// answers keep the order of every other workspace route (rate limit, 404,
// 410, 409, then the in-flight caps and the body): a request refused by
// the caps or its body takes usable's path, which marks nothing, and so
// does a request whose rate check borrows from Redis (the borrow shares
// the read's pipeline and the mark is its own round trip once allowed).
func (s *Server) exec(c echo.Context) error {
	a, id, lim := authFrom(c), c.Param("id"), limitsOf(c)
	if !policy.ValidID(id) {
		return s.execRefused(c, nil)
	}
	// A token that Redis last refused, and that is still within that
	// refusal, is refused before its body is read: a tenant over its
	// limit costs neither the body's reading nor a round trip.
	if err := s.limiter.Refused(a.Lease.ID, admission.ClassExec); err != nil {
		return err
	}
	// The worst case is reserved before the body is read: the body, and
	// max_output_bytes of each stream.
	release, err := s.inflight.acquire(id, a.Lease.InstanceID, bodyCost(c)+2*lim.MaxOutputBytes)
	if err != nil {
		return s.execRefused(c, err)
	}
	defer release()
	spec, clamped, err := s.execRequest(c)
	if err != nil {
		return s.execRefused(c, err)
	}
	ctx := c.Request().Context()
	now := s.clock.Now()
	// Instead of a plain touch: the exec keeps the workspace busy until
	// its deadline, so the idle reaper never ends it mid-command.
	member := sandgate.NewID("exec_")
	var limited func() error
	w, marked, err := s.db.ExecBegin(ctx, a.Lease.AccountID, a.Lease.InstanceID, id, member, spec.Timeout, now, func(p redis.Pipeliner) error {
		limited = s.limiter.Queue(ctx, p, a.Lease.ID, admission.ClassExec)
		if p.Len() > 0 {
			return nil // answered by the pipeline
		}
		// Decided here: a refusal Redis gave another request while this
		// one's body was read stops it before its mark.
		if err := limited(); protocol.CodeOf(err) == protocol.RateLimited {
			return err
		}
		return nil
	})
	if marked {
		// Any refusal from here on ends the mark it made.
		defer func() {
			if marked {
				s.execEnded(c, w, member, s.clock.Now())
			}
		}()
	}
	if err := s.checkRead(c, w, err, limited); err != nil {
		return err
	}
	if err := checkUsable(w, now, func() {
		if w.State != sandgate.WorkspaceRunning || now.Before(w.ExpiresAt) {
			return
		}
		// ExecBegin read only an exec's fields; ending it needs the record.
		bg := context.WithoutCancel(ctx)
		go func() {
			if full, err := s.db.Workspace(bg, w.AccountID, w.ID); err == nil {
				s.expireIfDue(bg, full, now)
			}
		}()
	}); err != nil {
		return err
	}
	spec.Timeout, clamped, err = clampToExpiry(spec.Timeout, clamped, lim, w.ExpiresAt.Sub(now))
	if err != nil {
		return err
	}
	// The output goes straight into pooled chunks, and from there, base64
	// encoded, into the response: never into a string or a marshalled body.
	var stdout, stderr outBuf
	defer stdout.free()
	defer stderr.free()
	spec.Stdout, spec.Stderr = &stdout, &stderr
	p, err := s.providerOf(w)
	if err != nil {
		return err
	}
	if !marked {
		if err := s.db.ExecStarted(ctx, w, member, now.Add(spec.Timeout+30*time.Second), now); err != nil {
			return unavailable(err)
		}
	}
	// The command dies with the request: a client that went away can never
	// read the result, and exec is never replayed.
	ctx, cancel := context.WithTimeout(ctx, spec.Timeout+30*time.Second)
	defer cancel()
	res, err := p.Exec(ctx, sandboxOf(w), spec)
	end := s.clock.Now()
	marked = false
	if err != nil {
		s.execEnded(c, w, member, end)
		return providerError(err)
	}
	out, errOut := stdout.parts(), stderr.parts()
	if res.Stdout != nil || res.Stderr != nil { // a provider that kept the output itself
		out, errOut = onepart(res.Stdout), onepart(res.Stderr)
	}
	// The answer goes out first, and the end, timed when the command
	// ended, is recorded after it, before the handler returns: the client
	// does not wait for it, the connection's next request (and a drain)
	// does. Until it lands the busy mark keeps the workspace, which only
	// errs on the side of keeping it.
	_ = execBody(res, out, errOut, clamped).write(c, http.StatusOK)
	_ = http.NewResponseController(c.Response().Writer).Flush() // a writer that cannot flush sends it on return
	stdout.free()
	stderr.free()
	release()
	s.execEnded(c, w, member, end)
	return nil
}

// execRefused answers an exec refused before its first round trip, by
// the in-flight caps or its body (err), or by an invalid id (err nil):
// usable's answer comes first, as on every workspace route.
func (s *Server) execRefused(c echo.Context, err error) error {
	if _, uerr := s.usable(c, admission.ClassExec); uerr != nil {
		return uerr
	}
	return err
}

// execBody is protocol.ExecResponse, field for field and in its order,
// with the streams in parts.
func execBody(res providers.ExecResult, stdout, stderr [][]byte, clamped bool) b64JSON {
	return b64JSON{
		text: []string{
			`{"exit_code":` + jsonInt(int64(res.ExitCode)) + `,"stdout_b64":"`,
			`","stderr_b64":"`,
			`","stdout_truncated":` + jsonBool(res.StdoutTruncated) +
				`,"stderr_truncated":` + jsonBool(res.StderrTruncated) +
				`,"timeout_clamped":` + jsonBool(clamped) +
				`,"timed_out":` + jsonBool(res.TimedOut) +
				`,"stdout_bytes":` + jsonInt(res.StdoutBytes) +
				`,"stderr_bytes":` + jsonInt(res.StderrBytes) + `}`,
		},
		b64: [][][]byte{stdout, stderr},
	}
}

// execEnded records the end of an exec, whatever its outcome: the
// workspace stops being busy and idles an idle timeout after the end, not
// after the exec's deadline (a quick command with timeout_seconds: 900 must
// not keep a workspace, and its bill, alive for 15 minutes). It outlives a
// client that went away. When it fails the mark stays until the deadline,
// which only errs on the side of keeping the workspace. It is exec's
// second Redis round trip, paid after the command's answer is out.
func (s *Server) execEnded(c echo.Context, w sandgate.Workspace, member string, end time.Time) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), 5*time.Second)
	defer cancel()
	if err := s.db.ExecEnded(ctx, w, member, end); err != nil {
		s.log.Warn("exec end not recorded; the workspace stays busy until the exec's deadline",
			slog.String(sandgate.KeyRequestID, requestID(c)), sandgate.WorkspaceAttr(w.ID), slog.Any(sandgate.KeyError, err))
	}
}

// execSpec reads and checks an exec request body (exec and durable
// commands share it): argv, dir, stdin within max_file_bytes, and the
// timeout defaulted and clamped to the scope and expires_at.
func (s *Server) execSpec(c echo.Context, w sandgate.Workspace) (providers.ExecSpec, bool, error) {
	spec, clamped, err := s.execRequest(c)
	if err != nil {
		return providers.ExecSpec{}, false, err
	}
	spec.Timeout, clamped, err = clampToExpiry(spec.Timeout, clamped, limitsOf(c), w.ExpiresAt.Sub(s.clock.Now()))
	return spec, clamped, err
}

// execRequest is execSpec without the workspace: the timeout is defaulted
// and clamped to the scope only (clampToExpiry does the rest).
func (s *Server) execRequest(c echo.Context) (providers.ExecSpec, bool, error) {
	var req protocol.ExecRequest
	if err := decode(c, &req); err != nil {
		return providers.ExecSpec{}, false, err
	}
	if err := policy.ValidateArgv(req.Argv); err != nil {
		return providers.ExecSpec{}, false, err
	}
	if req.Dir != "" {
		if err := policy.ValidatePathField("dir", req.Dir); err != nil {
			return providers.ExecSpec{}, false, err
		}
	}
	lim := limitsOf(c)
	stdin, err := decodeB64("stdin_b64", req.StdinB64)
	if err != nil {
		return providers.ExecSpec{}, false, err
	}
	if int64(len(stdin)) > lim.MaxFileBytes {
		return providers.ExecSpec{}, false, protocol.E(protocol.PayloadTooLarge, "stdin is over max_file_bytes")
	}
	timeout, clamped, err := policy.ClampExecTimeout(policy.Seconds(req.TimeoutSeconds),
		lim.DefaultExecTimeout, lim.MaxExecTimeout, math.MaxInt64)
	if err != nil {
		return providers.ExecSpec{}, false, err
	}
	return providers.ExecSpec{Argv: req.Argv, Dir: req.Dir, Stdin: stdin, Timeout: timeout, MaxOutputBytes: lim.MaxOutputBytes}, clamped, nil
}

// clampToExpiry clamps an exec's timeout, already clamped to the scope
// (clamped says whether it was), to untilExpiry, the time left before the
// workspace's expires_at: 410 when none is.
func clampToExpiry(timeout time.Duration, clamped bool, lim sandgate.Limits, untilExpiry time.Duration) (time.Duration, bool, error) {
	d, more, err := policy.ClampExecTimeout(timeout, lim.DefaultExecTimeout, lim.MaxExecTimeout, untilExpiry)
	return d, clamped || more, err
}

// providerError maps a provider failure to the protocol: a sandbox that is
// gone is 410, anything else 502 with a fixed message (no vendor text).
func providerError(err error) error {
	switch {
	case errors.Is(err, providers.ErrSandboxGone):
		return &protocol.Error{Code: protocol.WorkspaceGone, Message: "the workspace's sandbox has ended; acquire a new one", Err: err}
	case errors.Is(err, providers.ErrFileNotFound):
		return &protocol.Error{Code: protocol.FileNotFound, Message: "no file at this path in the workspace", Err: err}
	case errors.Is(err, providers.ErrNotAFile):
		return &protocol.Error{Code: protocol.NotAFile, Message: "the path is not a regular file", Err: err}
	case errors.Is(err, providers.ErrNotWritable):
		// A deterministic mistake of the client's, not a provider failure:
		// 422 is in the spec's list for files/write and is not retried.
		return &protocol.Error{Code: protocol.NotAFile, Reason: "not_writable",
			Message: "the path cannot be written in the workspace (a read-only or system location)", Err: err}
	case errors.Is(err, providers.ErrFileTooLarge):
		return &protocol.Error{Code: protocol.FileTooLarge, Message: "the file is over max_file_bytes", Err: err}
	}
	return &protocol.Error{Code: protocol.UpstreamError, Message: "the sandbox provider failed; the outcome is unknown", Err: err}
}
