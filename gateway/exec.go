package gateway

import (
	"math"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/saga"
)

// exec is POST …/exec: not replayable, so it is never retried by anyone.
//
// Its first round trip reads the workspace and marks the exec busy at once
// (saga.Saga.Exec), so the body is read and checked before it, unless
// the token is still within a refusal of its rate limit (then it is
// refused before anything else, the body unread). The
// answers keep the order of every other workspace route (rate limit, 404,
// 410, 409, then the in-flight caps and the body): a request refused by
// the caps or its body takes usable's path, which marks nothing.
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
	// Nothing is reserved for a workspace that is unknown or another
	// instance's: such an exec is refused with its body unread.
	if err := s.execOwned(c, a.Lease, id); err != nil {
		return err
	}
	// The worst case is reserved before the body is read: the body, and
	// max_output_bytes of each stream.
	release, err := s.inflight.acquire(tenant{id, a.Lease.InstanceID, a.Lease.AccountID}, bodyCost(c)+2*lim.MaxOutputBytes)
	if err != nil {
		return s.execRefused(c, err)
	}
	defer release()
	read := s.bodyDeadline(c)
	spec, clamped, err := s.execRequest(c)
	read()
	if err != nil {
		return s.execRefused(c, err)
	}
	// The output goes straight into pooled chunks, and from there, base64
	// encoded, into the response: never into a string or a marshalled body.
	var stdout, stderr outBuf
	defer stdout.free()
	defer stderr.free()
	spec.Stdout, spec.Stderr = &stdout, &stderr
	return s.saga.Exec(requestCtx(c), a.Lease, lim, id, spec, clamped, func(res saga.ExecResult, clamped bool) {
		out, errOut := stdout.parts(), stderr.parts()
		if res.Stdout != nil || res.Stderr != nil { // a provider that kept the output itself
			out, errOut = onepart(res.Stdout), onepart(res.Stderr)
		}
		// The answer goes out first; the end, timed when the command
		// ended, is recorded after it, before the handler returns. Until
		// it lands the busy mark keeps the workspace, which only errs on
		// the side of keeping it.
		_ = execBody(res, out, errOut, clamped).write(c, http.StatusOK)
		_ = http.NewResponseController(c.Response().Writer).Flush() // a writer that cannot flush sends it on return
		stdout.free()
		stderr.free()
		release()
	})
}

// execRefused answers an exec refused before its first round trip, by
// the in-flight caps or its body (err), or by an invalid id (err nil):
// usable's answer comes first, as on every workspace route.
func (s *Server) execRefused(c echo.Context, err error) error {
	dropUnreadBody(c)
	if err != nil && c.Request().Context().Err() != nil {
		return err // the connection failed (a body that never came): nothing to read the workspace for
	}
	if _, uerr := s.usable(c, admission.ClassExec); uerr != nil {
		return uerr
	}
	return err
}

// execBody is protocol.ExecResponse, field for field and in its order,
// with the streams in parts.
func execBody(res saga.ExecResult, stdout, stderr [][]byte, clamped bool) b64JSON {
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

// execRequest is execSpec without the workspace: the timeout is defaulted
// and clamped to the scope only (clampToExpiry does the rest).
func (s *Server) execRequest(c echo.Context) (saga.ExecSpec, bool, error) {
	var req protocol.ExecRequest
	if err := decode(c, &req); err != nil {
		return saga.ExecSpec{}, false, err
	}
	if err := policy.ValidateArgv(req.Argv); err != nil {
		return saga.ExecSpec{}, false, err
	}
	if req.Dir != "" {
		if err := policy.ValidatePathField("dir", req.Dir); err != nil {
			return saga.ExecSpec{}, false, err
		}
	}
	lim := limitsOf(c)
	stdin, err := decodeB64("stdin_b64", req.StdinB64)
	if err != nil {
		return saga.ExecSpec{}, false, err
	}
	if int64(len(stdin)) > lim.MaxFileBytes {
		return saga.ExecSpec{}, false, protocol.E(protocol.PayloadTooLarge, "stdin is over max_file_bytes")
	}
	timeout, clamped, err := policy.ClampExecTimeout(policy.Seconds(req.TimeoutSeconds),
		lim.DefaultExecTimeout, lim.MaxExecTimeout, math.MaxInt64)
	if err != nil {
		return saga.ExecSpec{}, false, err
	}
	return saga.ExecSpec{Argv: req.Argv, Dir: req.Dir, Stdin: stdin, Timeout: timeout, MaxOutputBytes: lim.MaxOutputBytes}, clamped, nil
}
