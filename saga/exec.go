package saga

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/providers"
)

// ExecSpec is one exec (or durable command) as the provider runs it.
type ExecSpec = providers.ExecSpec

// ExecResult is an exec's outcome as the provider reports it.
type ExecResult = providers.ExecResult

// Exec runs spec (its timeout clamped to the scope in lim already, clamped
// saying whether it was) in workspace id of lease l, and calls answer with
// the result before recording the exec's end: the client does not wait
// for that, the connection's next request (and a drain) does.
//
// Its first round trip reads the workspace, counts the request against
// the lease's exec rate limit and marks the exec busy at once
// (store.DB.ExecBegin), so that the idle reaper never ends the workspace
// mid-command. The answers keep the order of every other workspace route
// (rate limit, 404, 410, 409); a request whose rate check borrows from
// Redis shares the read's pipeline, and its mark is its own round trip
// once allowed.
func (s *Saga) Exec(ctx context.Context, l sandgate.Lease, lim sandgate.Limits, id string, spec ExecSpec, clamped bool, answer func(ExecResult, bool)) error {
	now := s.clock.Now()
	member := sandgate.NewID("exec_")
	queue, limited := s.limiter.QueueOn(ctx, l.ID, admission.ClassExec, true)
	w, marked, err := s.db.ExecBegin(ctx, l.AccountID, l.InstanceID, id, member, spec.Timeout, now, queue)
	if marked {
		// Any refusal from here on ends the mark it made.
		defer func() {
			if marked {
				s.execEnded(ctx, w, member, s.clock.Now())
			}
		}()
	}
	if err := s.checkRead(ctx, l, w, err, limited); err != nil {
		return err
	}
	if err := checkUsable(w, now, func() {
		if w.State != sandgate.WorkspaceRunning || now.Before(w.ExpiresAt) {
			return
		}
		// ExecBegin read only an exec's fields; ending it needs the record.
		bg := context.WithoutCancel(ctx)
		s.bg.Go(func() {
			if full, err := s.db.Workspace(bg, w.AccountID, w.ID); err == nil {
				s.expireIfDue(bg, full, now)
			}
		})
	}); err != nil {
		return err
	}
	spec.Timeout, clamped, err = ClampToExpiry(spec.Timeout, clamped, lim, w.ExpiresAt.Sub(now))
	if err != nil {
		return err
	}
	p, err := s.ProviderOf(w.Provider)
	if err != nil {
		return err
	}
	if !marked {
		if err := s.db.ExecStarted(ctx, w, member, now.Add(spec.Timeout+30*time.Second), now); err != nil {
			return Unavailable(err)
		}
	}
	// The command dies with the request: a client that went away can never
	// read the result, and exec is never replayed.
	ectx, cancel := context.WithTimeout(ctx, spec.Timeout+30*time.Second)
	defer cancel()
	res, err := p.Exec(ectx, sandboxOf(w), spec)
	end := s.clock.Now()
	marked = false
	if err != nil {
		s.execEnded(ctx, w, member, end)
		return s.sandboxError(ctx, w, opSandbox, err)
	}
	answer(res, clamped)
	s.execEnded(ctx, w, member, end)
	return nil
}

// execEnded records the end of an exec, whatever its outcome: the
// workspace stops being busy and idles an idle timeout after the end, not
// after the exec's deadline (a quick command with timeout_seconds: 900 must
// not keep a workspace, and its bill, alive for 15 minutes). It outlives a
// client that went away. When it fails the mark stays until the deadline,
// which only errs on the side of keeping the workspace. It is exec's
// second Redis round trip, paid after the command's answer is out.
func (s *Saga) execEnded(ctx context.Context, w sandgate.Workspace, member string, end time.Time) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.db.ExecEnded(ctx, w, member, end); err != nil {
		s.log.Warn("exec end not recorded; the workspace stays busy until the exec's deadline",
			requestAttr(ctx), sandgate.WorkspaceAttr(w.ID), slog.Any(sandgate.KeyError, err))
	}
}

// ClampToExpiry clamps an exec's timeout, already clamped to the scope
// (clamped says whether it was), to untilExpiry, the time left before the
// workspace's expires_at: 410 when none is.
func ClampToExpiry(timeout time.Duration, clamped bool, lim sandgate.Limits, untilExpiry time.Duration) (time.Duration, bool, error) {
	d, more, err := policy.ClampExecTimeout(timeout, lim.DefaultExecTimeout, lim.MaxExecTimeout, untilExpiry)
	return d, clamped || more, err
}

func sandboxOf(w sandgate.Workspace) providers.Sandbox { return providers.Sandbox{Ref: w.ProviderRef} }

// ReadFile reads path in w (usable), at most max bytes and one more that
// tells a file that grew, into dst: it touches the workspace's activity
// first. It returns the size the provider counted.
func (s *Saga) ReadFile(ctx context.Context, w sandgate.Workspace, path string, max int64, dst io.Writer) (int64, error) {
	p, err := s.touched(ctx, w)
	if err != nil {
		return 0, err
	}
	n, err := p.ReadFile(ctx, sandboxOf(w), path, max, dst)
	if err != nil {
		return 0, s.sandboxError(ctx, w, opSandbox, err)
	}
	return n, nil
}

// WriteFile writes contents to path in w (usable), touching its activity
// first. finish, called once the provider is done, answers for the
// request body contents came from: its refusal wins over what the
// provider made of it (the provider read the fault and wrote nothing).
func (s *Saga) WriteFile(ctx context.Context, w sandgate.Workspace, path string, contents io.Reader, finish func() error) error {
	p, err := s.touched(ctx, w)
	if err != nil {
		return err
	}
	err = p.WriteFile(ctx, sandboxOf(w), path, contents)
	if ferr := finish(); ferr != nil {
		return ferr
	}
	if err != nil {
		return s.sandboxError(ctx, w, opSandbox, err)
	}
	return nil
}

// touched touches w's activity and returns its provider.
func (s *Saga) touched(ctx context.Context, w sandgate.Workspace) (providers.Provider, error) {
	if err := s.db.Touch(ctx, w, s.clock.Now()); err != nil {
		return nil, Unavailable(err)
	}
	return s.ProviderOf(w.Provider)
}
