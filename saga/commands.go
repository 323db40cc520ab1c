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

// ErrCommandClaimed is StartCommand's answer when another request claimed
// the identity first: the caller answers the command's current status.
var ErrCommandClaimed = errors.New("saga: command identity claimed by another request")

// StartCommand launches a durable command under key in w (usable) on w's
// own provider: identity claimed in Redis (one launch across every
// gateway) → launched in the sandbox → recorded launched. It returns the
// state to answer with 202. A launch that definitely did not start frees
// the identity again; one whose outcome is unknown stays starting, for a
// read to learn from the sandbox or fence past its dispatch deadline.
// Returns ErrCommandClaimed when the identity was claimed before.
func (s *Saga) StartCommand(ctx context.Context, w sandgate.Workspace, key string, spec providers.ExecSpec) (sandgate.CommandState, error) {
	p, err := s.ProviderOf(w.Provider)
	if err != nil {
		return "", err
	}
	now := s.clock.Now()
	err = s.db.ClaimCommand(ctx, w, key, now, now.Add(s.cfg.DispatchTimeout), now.Add(spec.Timeout))
	var claimed *store.CommandClaimed
	switch {
	case errors.As(err, &claimed):
		return "", ErrCommandClaimed
	case errors.Is(err, store.ErrStateChanged):
		return "", protocol.E(protocol.WorkspaceGone, "the workspace has ended; acquire a new one")
	case err != nil:
		return "", Unavailable(err)
	}

	// Claimed: the launch must settle even if the client goes away.
	ctx = context.WithoutCancel(ctx)
	dctx, cancel := context.WithTimeout(ctx, s.cfg.DispatchTimeout)
	err = runner.For(p).StartCommand(dctx, providers.Sandbox{Ref: w.ProviderRef}, key, spec)
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
			return "", &protocol.Error{Code: protocol.WorkspaceGone, Message: "the workspace's sandbox has ended; acquire a new one", Err: err}
		}
		return "", &protocol.Error{Code: protocol.CommandNotStarted, Message: "the command could not be started; nothing ran", Err: err}
	}
	// The outcome is unknown: the record stays starting until a read
	// learns it from the sandbox, or fences it past the dispatch deadline.
	return "", &protocol.Error{Code: protocol.UpstreamError, Message: "the launch's outcome is unknown; read the command's status", Err: err}
}
