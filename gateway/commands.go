package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/saga"
	"github.com/sandgate/sandgate/store"
)

// Durable commands (spec §Durable commands). The identity is claimed in
// Redis by one script, so across every gateway process only one request
// ever launches it; the command's state lives in Redis, its output and
// exit status only in the sandbox (providers.Commander), where any gateway
// reads them, also after every gateway restarted.

// commandKey names a command by the SHA-256 of its identity: a fixed-size,
// safe name for the store and the sandbox.
func commandKey(identity string) string { return saga.HashString(identity) }

func identityOf(c echo.Context) (string, error) {
	id := c.Param("identity")
	if err := policy.ValidateCommandIdentity(id); err != nil {
		return "", err
	}
	return commandKey(id), nil
}

// startCommand is PUT …/commands/{identity}: 202 when this request
// claimed the identity and launched the command, 200 with the current
// status, whatever the body, when the identity was claimed before.
func (s *Server) startCommand(c echo.Context) error {
	key, err := identityOf(c)
	if err != nil {
		return err
	}
	w, err := s.usable(c, admission.ClassExec)
	if err != nil {
		return err
	}
	release, err := s.reserveCommand(c)
	if err != nil {
		return err
	}
	defer release()
	ctx := c.Request().Context()
	if cmd, err := s.db.Command(ctx, w, key); err == nil {
		return s.commandStatus(c, w, cmd, http.StatusOK)
	} else if !errors.Is(err, store.ErrNotFound) {
		return unavailable(err)
	}

	spec, _, err := s.execSpec(c, w)
	if err != nil {
		return err
	}
	st, err := s.saga.StartCommand(ctx, w, key, spec)
	if errors.Is(err, saga.ErrCommandClaimed) { // another request claimed it first
		cmd, err := s.db.Command(ctx, w, key)
		if err != nil {
			return unavailable(err)
		}
		return s.commandStatus(c, w, cmd, http.StatusOK)
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusAccepted, protocol.CommandStatus{State: string(st)})
}

// readCommand is GET …/commands/{identity}.
func (s *Server) readCommand(c echo.Context) error {
	key, err := identityOf(c)
	if err != nil {
		return err
	}
	w, err := s.usable(c, admission.ClassRead)
	if err != nil {
		return err
	}
	release, err := s.reserveCommand(c)
	if err != nil {
		return err
	}
	defer release()
	cmd, err := s.db.Command(c.Request().Context(), w, key)
	if errors.Is(err, store.ErrNotFound) {
		return c.JSON(http.StatusOK, protocol.CommandStatus{State: protocol.CommandUnknown})
	}
	if err != nil {
		return unavailable(err)
	}
	return s.commandStatus(c, w, cmd, http.StatusOK)
}

// cancelCommand is POST …/commands/{identity}/cancel: 202, idempotent. An
// identity never claimed is fenced; a claimed command is fenced or killed
// in the sandbox; a completed one keeps its result.
func (s *Server) cancelCommand(c echo.Context) error {
	key, err := identityOf(c)
	if err != nil {
		return err
	}
	w, err := s.usable(c, "")
	if err != nil {
		return err
	}
	cmds, err := s.commandsOf(w)
	if err != nil {
		return err
	}
	ctx := context.WithoutCancel(c.Request().Context())
	out, err := s.db.CancelCommand(ctx, w, key, s.clock.Now())
	if err != nil {
		return unavailable(err)
	}
	if out == store.CancelRecorded {
		// Fence a launch still on its way, kill a running command.
		cctx, cancel := context.WithTimeout(ctx, s.cfg.TerminateTimeout)
		err := cmds.CancelCommand(cctx, sandboxOf(w), key)
		cancel()
		if err != nil && !errors.Is(err, providers.ErrSandboxGone) {
			return &protocol.Error{Code: protocol.UpstreamError, Message: "the sandbox provider could not cancel the command; retry", Err: err}
		}
		s.log.Info("durable command canceled", sandgate.WorkspaceAttr(w.ID))
	}
	cmd, err := s.db.Command(ctx, w, key)
	if err != nil {
		return unavailable(err)
	}
	return c.JSON(http.StatusAccepted, protocol.CommandStatus{State: string(cmd.State)})
}

// commandStatus answers a command's status, learning from the sandbox what
// Redis does not know yet: a launch whose answer was lost, a command that
// finished. Output is read from the sandbox every time; it is never kept.
func (s *Server) commandStatus(c echo.Context, w sandgate.Workspace, cmd sandgate.Command, code int) error {
	ctx := context.WithoutCancel(c.Request().Context())
	if cmd.State == sandgate.CommandCanceled && !cmd.Launched {
		// Fenced before any launch: nothing ran, there is no result.
		return c.JSON(code, protocol.CommandStatus{State: protocol.CommandCanceled})
	}
	cmds, err := s.commandsOf(w)
	if err != nil {
		return err
	}
	lim := limitsOf(c)
	rctx, cancel := context.WithTimeout(ctx, s.cfg.TerminateTimeout)
	st, err := cmds.ReadCommand(rctx, sandboxOf(w), cmd.Key, lim.MaxOutputBytes)
	cancel()
	if err != nil {
		return saga.ProviderError(err)
	}
	now := s.clock.Now()
	if st.State == providers.CommandAbsent {
		switch {
		case cmd.Launched && cmd.HasExit:
			// The sandbox lost the files; the exit status is still known.
			return c.JSON(code, protocol.CommandStatus{State: string(cmd.State), ExitCode: &cmd.ExitCode, TimedOut: cmd.TimedOut})
		case cmd.Launched:
			return c.JSON(code, protocol.CommandStatus{State: protocol.CommandUnknown})
		case now.Before(cmd.DispatchBy):
			return c.JSON(code, protocol.CommandStatus{State: protocol.CommandStarting})
		}
		// The launch's outcome was never learned (its gateway died): fence
		// it in the sandbox, so a launch still on its way never runs, and
		// record it canceled.
		return s.fenceLost(c, w, cmd, code)
	}
	if !cmd.Launched {
		if _, err := s.db.CommandLaunched(ctx, w, cmd.Key); err != nil {
			return unavailable(err)
		}
	}
	if st.State == providers.CommandRunning {
		return c.JSON(code, protocol.CommandStatus{State: protocol.CommandRunning})
	}
	final, err := s.db.FinishCommand(ctx, w, cmd.Key, sandgate.CommandState(st.State), st.ExitCode, st.TimedOut, now)
	if err != nil {
		return unavailable(err)
	}
	// protocol.CommandStatus with its exit fields, encoded straight into
	// the response.
	state, _ := json.Marshal(string(final))
	return b64JSON{
		text: []string{
			`{"state":` + string(state) + `,"exit_code":` + jsonInt(int64(st.ExitCode)) + `,"stdout_b64":"`,
			`","stderr_b64":"`,
			`","output_truncated":` + jsonBool(st.StdoutTruncated || st.StderrTruncated) +
				`,"stdout_bytes":` + jsonInt(st.StdoutBytes) +
				`,"stderr_bytes":` + jsonInt(st.StderrBytes) +
				`,"timed_out":` + jsonBool(st.TimedOut) + `}`,
		},
		b64: [][][]byte{onepart(st.Stdout), onepart(st.Stderr)},
	}.write(c, code)
}

// reserveCommand reserves what a durable command request of w may hold
// from the budget of bytes in flight, before its body is read: the body,
// and the output a status read may carry (max_output_bytes of each stream,
// and the runner's status lines). It does not count against the
// per-workspace and per-instance caps: a repeated PUT of one identity
// answers the command's status (spec §Durable commands), whatever else runs.
func (s *Server) reserveCommand(c echo.Context) (func(), error) {
	lim := limitsOf(c)
	return s.inflight.acquireBytes(bodyCost(c) + 2*lim.MaxOutputBytes + 1024)
}

// fenceLost fences a command whose launch was claimed but never confirmed
// before its dispatch deadline, and answers its status after the fence.
func (s *Server) fenceLost(c echo.Context, w sandgate.Workspace, cmd sandgate.Command, code int) error {
	cmds, err := s.commandsOf(w)
	if err != nil {
		return err
	}
	ctx := context.WithoutCancel(c.Request().Context())
	if _, err := s.db.CancelCommand(ctx, w, cmd.Key, s.clock.Now()); err != nil {
		return unavailable(err)
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.TerminateTimeout)
	err = cmds.CancelCommand(cctx, sandboxOf(w), cmd.Key)
	cancel()
	if err != nil {
		return saga.ProviderError(err)
	}
	s.log.Warn("durable command launch never confirmed; fenced", sandgate.WorkspaceAttr(w.ID))
	// The launch may have landed just before the fence (and been killed by
	// it): read once more, and from then on let the sandbox answer.
	rctx, cancel := context.WithTimeout(ctx, s.cfg.TerminateTimeout)
	st, err := cmds.ReadCommand(rctx, sandboxOf(w), cmd.Key, 0)
	cancel()
	if err != nil {
		return saga.ProviderError(err)
	}
	if st.State == providers.CommandAbsent {
		return c.JSON(code, protocol.CommandStatus{State: protocol.CommandCanceled})
	}
	if _, err := s.db.CommandLaunched(ctx, w, cmd.Key); err != nil {
		return unavailable(err)
	}
	cur, err := s.db.Command(ctx, w, cmd.Key)
	if err != nil {
		return unavailable(err)
	}
	return s.commandStatus(c, w, cur, code)
}

func sandboxOf(w sandgate.Workspace) providers.Sandbox { return providers.Sandbox{Ref: w.ProviderRef} }
