package saga

import (
	"context"
	"errors"
	"log/slog"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/runner"
	"github.com/sandgate/sandgate/store"
)

// Durable commands (spec §Durable commands). The identity is claimed in
// Redis by one script, so across every gateway process only one request
// ever launches it; the command's state lives in Redis, its output and
// exit status only in the sandbox (providers.Commander), where any gateway
// reads them, also after every gateway restarted.

// CommandResult is a finished command's result as the sandbox reports
// it, with its output.
type CommandResult = providers.CommandStatus

// CommandStatus is a durable command's status as a request answers it.
type CommandStatus struct {
	// State is the protocol's state (protocol.CommandStarting, …).
	State string
	// ExitCode and TimedOut are the recorded exit of a command whose
	// output the sandbox lost; ExitCode is nil otherwise.
	ExitCode *int
	TimedOut bool
	// Result is the sandbox's answer, output included, once the command
	// finished; State is then the state recorded for it.
	Result *CommandResult
	// Started is true when this request claimed the identity and launched
	// the command (202); false when it answers a command claimed before.
	Started bool
}

// CommandKey names a command by the SHA-256 of its identity: a
// fixed-size, safe name for the store and the sandbox.
func CommandKey(identity string) string { return HashString(identity) }

// StartCommand is the PUT of durable command key in w (usable): a
// command claimed before answers its status (ReadCommand), whatever the
// body; otherwise spec, called only then, reads the request, and the
// command is launched on w's own provider: identity claimed in Redis (one
// launch across every gateway) → launched in the sandbox → recorded
// launched. A launch that definitely did not start frees the identity
// again; one whose outcome is unknown stays starting, for a read to learn
// from the sandbox or fence past its dispatch deadline.
func (s *Saga) StartCommand(ctx context.Context, w sandgate.Workspace, key string, maxOutput int64, spec func() (ExecSpec, error)) (CommandStatus, error) {
	if cmd, err := s.db.Command(ctx, w, key); err == nil {
		return s.commandStatus(ctx, w, cmd, maxOutput)
	} else if !errors.Is(err, store.ErrNotFound) {
		return CommandStatus{}, Unavailable(err)
	}
	sp, err := spec()
	if err != nil {
		return CommandStatus{}, err
	}
	st, err := s.launch(ctx, w, key, sp)
	if errors.Is(err, errClaimed) { // another request claimed it first
		cmd, err := s.db.Command(ctx, w, key)
		if err != nil {
			return CommandStatus{}, Unavailable(err)
		}
		return s.commandStatus(ctx, w, cmd, maxOutput)
	}
	if err != nil {
		return CommandStatus{}, err
	}
	return CommandStatus{State: string(st), Started: true}, nil
}

// errClaimed is launch's answer when another request claimed the
// identity first.
var errClaimed = errors.New("saga: command identity claimed by another request")

// launch claims and launches command key in w, returning the state to
// answer with 202, or errClaimed.
func (s *Saga) launch(ctx context.Context, w sandgate.Workspace, key string, spec providers.ExecSpec) (sandgate.CommandState, error) {
	p, err := s.ProviderOf(w.Provider)
	if err != nil {
		return "", err
	}
	now := s.clock.Now()
	err = s.db.ClaimCommand(ctx, w, key, now, now.Add(s.cfg.DispatchTimeout), now.Add(spec.Timeout))
	var claimed *store.CommandClaimed
	switch {
	case errors.As(err, &claimed):
		return "", errClaimed
	case errors.Is(err, store.ErrStateChanged):
		return "", protocol.E(protocol.WorkspaceGone, "the workspace has ended; acquire a new one")
	case err != nil:
		return "", Unavailable(err)
	}

	// Claimed: the launch must settle even if the client goes away.
	ctx = context.WithoutCancel(ctx)
	dctx, cancel := context.WithTimeout(ctx, s.cfg.DispatchTimeout)
	err = runner.For(p).StartCommand(dctx, sandboxOf(w), key, spec)
	cancel()
	switch {
	case err == nil:
		st, err := s.db.CommandLaunched(ctx, w, key)
		if err != nil {
			return "", Unavailable(err)
		}
		s.log.Info("durable command started", sandgate.WorkspaceAttr(w.ID), slog.Int("argc", len(spec.Argv)), slog.String("state", string(st)))
		return st, nil
	case errors.Is(err, providers.ErrCommandFenced):
		// A cancel came between the claim and the launch: it recorded the
		// command canceled, and nothing ran.
		cmd, err := s.db.Command(ctx, w, key)
		if err != nil {
			return "", Unavailable(err)
		}
		return cmd.State, nil
	case errors.Is(err, providers.ErrSandboxGone), errors.Is(err, providers.ErrCommandNotStarted):
		// Definitely not started: the identity is free again.
		if uerr := s.db.UnclaimCommand(ctx, w, key); uerr != nil {
			s.log.Error("unclaim command", sandgate.WorkspaceAttr(w.ID), slog.Any(sandgate.KeyError, uerr))
		}
		if errors.Is(err, providers.ErrSandboxGone) {
			return "", s.sandboxError(ctx, w, opSandbox, err)
		}
		return "", &protocol.Error{Code: protocol.CommandNotStarted, Message: "the command could not be started; nothing ran", Err: err}
	}
	// The outcome is unknown: the record stays starting until a read
	// learns it from the sandbox, or fences it past the dispatch deadline.
	return "", &protocol.Error{Code: protocol.UpstreamError, Message: "the launch's outcome is unknown; read the command's status", Err: err}
}

// ReadCommand is the GET of durable command key in w (usable): unknown
// for an identity never claimed, otherwise its status with at most
// maxOutput bytes of each stream.
func (s *Saga) ReadCommand(ctx context.Context, w sandgate.Workspace, key string, maxOutput int64) (CommandStatus, error) {
	cmd, err := s.db.Command(ctx, w, key)
	if errors.Is(err, store.ErrNotFound) {
		return CommandStatus{State: protocol.CommandUnknown}, nil
	}
	if err != nil {
		return CommandStatus{}, Unavailable(err)
	}
	return s.commandStatus(ctx, w, cmd, maxOutput)
}

// CancelCommand cancels durable command key in w (usable), idempotently,
// and returns its state after: an identity never claimed is fenced; a
// claimed command is fenced or killed in the sandbox; a completed one
// keeps its result.
func (s *Saga) CancelCommand(ctx context.Context, w sandgate.Workspace, key string) (string, error) {
	p, err := s.ProviderOf(w.Provider)
	if err != nil {
		return "", err
	}
	ctx = context.WithoutCancel(ctx)
	out, err := s.db.CancelCommand(ctx, w, key, s.clock.Now())
	if err != nil {
		return "", Unavailable(err)
	}
	if out == store.CancelRecorded {
		// Fence a launch still on its way, kill a running command.
		cctx, cancel := context.WithTimeout(ctx, s.cfg.TerminateTimeout)
		err := runner.For(p).CancelCommand(cctx, sandboxOf(w), key)
		cancel()
		if err != nil && !errors.Is(err, providers.ErrSandboxGone) {
			return "", &protocol.Error{Code: protocol.UpstreamError, Message: "the sandbox provider could not cancel the command; retry", Err: err}
		}
		s.log.Info("durable command canceled", sandgate.WorkspaceAttr(w.ID))
	}
	cmd, err := s.db.Command(ctx, w, key)
	if err != nil {
		return "", Unavailable(err)
	}
	return string(cmd.State), nil
}

// commandStatus answers a command's status, learning from the sandbox what
// Redis does not know yet: a launch whose answer was lost, a command that
// finished. Output is read from the sandbox every time; it is never kept.
func (s *Saga) commandStatus(ctx context.Context, w sandgate.Workspace, cmd sandgate.Command, maxOutput int64) (CommandStatus, error) {
	ctx = context.WithoutCancel(ctx)
	if cmd.State == sandgate.CommandCanceled && !cmd.Launched {
		// Fenced before any launch: nothing ran, there is no result.
		return CommandStatus{State: protocol.CommandCanceled}, nil
	}
	p, err := s.ProviderOf(w.Provider)
	if err != nil {
		return CommandStatus{}, err
	}
	cmds := runner.For(p)
	st, err := s.readCommand(ctx, cmds, w, cmd.Key, maxOutput)
	if err != nil {
		return CommandStatus{}, err
	}
	now := s.clock.Now()
	if st.State == providers.CommandAbsent {
		switch {
		case cmd.Launched && cmd.HasExit:
			// The sandbox lost the files; the exit status is still known.
			return CommandStatus{State: string(cmd.State), ExitCode: &cmd.ExitCode, TimedOut: cmd.TimedOut}, nil
		case cmd.Launched:
			return CommandStatus{State: protocol.CommandUnknown}, nil
		case now.Before(cmd.DispatchBy):
			return CommandStatus{State: protocol.CommandStarting}, nil
		}
		// The launch's outcome was never learned (its gateway died): fence
		// it in the sandbox, so a launch still on its way never runs, and
		// record it canceled.
		return s.fenceLost(ctx, cmds, w, cmd, maxOutput)
	}
	if !cmd.Launched {
		if _, err := s.db.CommandLaunched(ctx, w, cmd.Key); err != nil {
			return CommandStatus{}, Unavailable(err)
		}
	}
	if st.State == providers.CommandRunning {
		return CommandStatus{State: protocol.CommandRunning}, nil
	}
	final, err := s.db.FinishCommand(ctx, w, cmd.Key, sandgate.CommandState(st.State), st.ExitCode, st.TimedOut, now)
	if err != nil {
		return CommandStatus{}, Unavailable(err)
	}
	return CommandStatus{State: string(final), Result: &st}, nil
}

// fenceLost fences a command whose launch was claimed but never confirmed
// before its dispatch deadline, and answers its status after the fence.
func (s *Saga) fenceLost(ctx context.Context, cmds providers.Commander, w sandgate.Workspace, cmd sandgate.Command, maxOutput int64) (CommandStatus, error) {
	if _, err := s.db.CancelCommand(ctx, w, cmd.Key, s.clock.Now()); err != nil {
		return CommandStatus{}, Unavailable(err)
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.TerminateTimeout)
	err := cmds.CancelCommand(cctx, sandboxOf(w), cmd.Key)
	cancel()
	if err != nil {
		return CommandStatus{}, s.sandboxError(ctx, w, opSandbox, err)
	}
	s.log.Warn("durable command launch never confirmed; fenced", sandgate.WorkspaceAttr(w.ID))
	// The launch may have landed just before the fence (and been killed by
	// it): read once more, and from then on let the sandbox answer.
	st, err := s.readCommand(ctx, cmds, w, cmd.Key, 0)
	if err != nil {
		return CommandStatus{}, err
	}
	if st.State == providers.CommandAbsent {
		return CommandStatus{State: protocol.CommandCanceled}, nil
	}
	if _, err := s.db.CommandLaunched(ctx, w, cmd.Key); err != nil {
		return CommandStatus{}, Unavailable(err)
	}
	cur, err := s.db.Command(ctx, w, cmd.Key)
	if err != nil {
		return CommandStatus{}, Unavailable(err)
	}
	return s.commandStatus(ctx, w, cur, maxOutput)
}

// readCommand reads command key's status from the sandbox, within the
// cleanup bound.
func (s *Saga) readCommand(ctx context.Context, cmds providers.Commander, w sandgate.Workspace, key string, maxOutput int64) (providers.CommandStatus, error) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.TerminateTimeout)
	defer cancel()
	st, err := cmds.ReadCommand(rctx, sandboxOf(w), key, maxOutput)
	if err != nil {
		return st, s.sandboxError(ctx, w, opSandbox, err)
	}
	return st, nil
}
