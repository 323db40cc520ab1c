package gateway

import (
	"encoding/json"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/saga"
)

// Durable commands (spec §Durable commands), run by package saga: a
// handler reads the route, calls one saga method and renders its status.

// commandRoute is every durable command route's prologue: the identity
// (its key), the route's workspace if it can take commands (counted
// against the rate limit of class), and, when reserve, the bytes a
// command request may hold in flight (reserveCommand). release is never
// nil once err is.
func (s *Server) commandRoute(c echo.Context, class admission.Class, reserve bool) (w sandgate.Workspace, key string, release func(), err error) {
	id := c.Param("identity")
	if err := policy.ValidateCommandIdentity(id); err != nil {
		return w, "", nil, err
	}
	if w, err = s.usable(c, class); err != nil {
		return w, "", nil, err
	}
	release = func() {}
	if reserve {
		if release, err = s.reserveCommand(c, w); err != nil {
			dropUnreadBody(c)
			return w, "", nil, err
		}
	}
	return w, saga.CommandKey(id), release, nil
}

// startCommand is PUT …/commands/{identity}: 202 when this request
// claimed the identity and launched the command, 200 with the current
// status, whatever the body, when the identity was claimed before.
func (s *Server) startCommand(c echo.Context) error {
	w, key, release, err := s.commandRoute(c, admission.ClassExec, true)
	if err != nil {
		return err
	}
	defer release()
	st, err := s.saga.StartCommand(c.Request().Context(), w, key, limitsOf(c).MaxOutputBytes, func() (saga.ExecSpec, error) {
		read := s.bodyDeadline(c)
		spec, _, err := s.execSpec(c, w)
		read()
		if err != nil {
			dropUnreadBody(c) // it may have timed out
		}
		return spec, err
	})
	if err != nil {
		return err
	}
	if st.Started {
		return renderCommand(c, st, http.StatusAccepted)
	}
	return renderCommand(c, st, http.StatusOK)
}

// readCommand is GET …/commands/{identity}.
func (s *Server) readCommand(c echo.Context) error {
	w, key, release, err := s.commandRoute(c, admission.ClassRead, true)
	if err != nil {
		return err
	}
	defer release()
	st, err := s.saga.ReadCommand(c.Request().Context(), w, key, limitsOf(c).MaxOutputBytes)
	if err != nil {
		return err
	}
	return renderCommand(c, st, http.StatusOK)
}

// cancelCommand is POST …/commands/{identity}/cancel: 202, idempotent
// (saga.Saga.CancelCommand).
func (s *Server) cancelCommand(c echo.Context) error {
	w, key, _, err := s.commandRoute(c, "", false)
	if err != nil {
		return err
	}
	state, err := s.saga.CancelCommand(c.Request().Context(), w, key)
	if err != nil {
		return err
	}
	return answerJSON(c, http.StatusAccepted, protocol.CommandStatus{State: state})
}

// renderCommand writes a command's status with code; a finished
// command's output is base64-encoded straight into the response.
func renderCommand(c echo.Context, st saga.CommandStatus, code int) error {
	r := st.Result
	if r == nil {
		return answerJSON(c, code, protocol.CommandStatus{State: st.State, ExitCode: st.ExitCode, TimedOut: st.TimedOut})
	}
	// protocol.CommandStatus with its exit fields.
	state, _ := json.Marshal(st.State)
	return b64JSON{
		text: []string{
			`{"state":` + string(state) + `,"exit_code":` + jsonInt(int64(r.ExitCode)) + `,"stdout_b64":"`,
			`","stderr_b64":"`,
			`","output_truncated":` + jsonBool(r.StdoutTruncated || r.StderrTruncated) +
				`,"stdout_bytes":` + jsonInt(r.StdoutBytes) +
				`,"stderr_bytes":` + jsonInt(r.StderrBytes) +
				`,"timed_out":` + jsonBool(r.TimedOut) + `}`,
		},
		b64: [][][]byte{onepart(r.Stdout), onepart(r.Stderr)},
	}.write(c, code)
}

// execSpec reads and checks a durable command's request body, as exec's
// (execRequest), and clamps its timeout to w's expires_at too.
func (s *Server) execSpec(c echo.Context, w sandgate.Workspace) (saga.ExecSpec, bool, error) {
	spec, clamped, err := s.execRequest(c)
	if err != nil {
		return saga.ExecSpec{}, false, err
	}
	spec.Timeout, clamped, err = saga.ClampToExpiry(spec.Timeout, clamped, limitsOf(c), w.ExpiresAt.Sub(s.clock.Now()))
	return spec, clamped, err
}

// reserveCommand reserves what a durable command request of w may hold
// from the budget of bytes in flight (and w's shares of it), before its body is read: the body,
// and the output a status read may carry (max_output_bytes of each stream,
// and the runner's status lines). It does not count against the
// per-workspace and per-instance caps: a repeated PUT of one identity
// answers the command's status (spec §Durable commands), whatever else runs.
func (s *Server) reserveCommand(c echo.Context, w sandgate.Workspace) (func(), error) {
	lim := limitsOf(c)
	return s.inflight.acquireBytes(tenantOf(w), bodyCost(c)+2*lim.MaxOutputBytes+1024)
}
