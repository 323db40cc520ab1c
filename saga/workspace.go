package saga

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
)

// ErrNotFound is the refusal of a workspace id that is unknown, or another
// instance's (spec §Trust model: the two answer alike).
var ErrNotFound = protocol.E(protocol.NotFound, "no such workspace for this instance")

// ErrBadWorkspaceID answers a workspace id no broker mints (spec
// §Identifiers) with 400, not 404: a client takes 404 on Release as done,
// and must not record a mangled id's workspace as released.
var ErrBadWorkspaceID = protocol.E(protocol.InvalidRequest,
	"the workspace id is malformed: an id is 1 to 64 characters of [A-Za-z0-9._-], never . or ..; send it exactly as the broker returned it")

// Load reads workspace id for lease l, counting the request against the
// lease's rate limit of class (when not "" and the Saga has a limiter) in
// the same round trip, and answers in every workspace route's order: 429,
// then 404 (no such workspace, or another instance's), then 503.
func (s *Saga) Load(ctx context.Context, l sandgate.Lease, id string, class admission.Class) (sandgate.Workspace, error) {
	if !policy.ValidID(id) {
		return sandgate.Workspace{}, ErrBadWorkspaceID
	}
	queue, limited := s.limiter.QueueOn(ctx, l.ID, class, false)
	w, err := s.db.WorkspacePipelined(ctx, l.AccountID, id, queue)
	if err := s.checkRead(ctx, l, w, err, limited); err != nil {
		return sandgate.Workspace{}, err
	}
	return w, nil
}

// checkRead answers a workspace read and the rate check that rode with it.
func (s *Saga) checkRead(ctx context.Context, l sandgate.Lease, w sandgate.Workspace, err error, limited func() error) error {
	if lerr := limited(); protocol.CodeOf(lerr) == protocol.RateLimited {
		return lerr
	} else if lerr != nil && err == nil {
		s.log.Warn("rate limiter unavailable; request let through", requestAttr(ctx), slog.String(sandgate.KeyLeaseID, l.ID), slog.Any("err", lerr))
	}
	if errors.Is(err, store.ErrNotFound) || (err == nil && w.InstanceID != l.InstanceID) {
		return ErrNotFound
	}
	if err != nil {
		return Unavailable(err)
	}
	return nil
}

// Workspace is the status read of workspace id by lease l (Load, counted
// against no rate class): one found past its deadline is ended in the
// background, and reads as terminating meanwhile.
func (s *Saga) Workspace(ctx context.Context, l sandgate.Lease, id string) (sandgate.Workspace, error) {
	w, err := s.Load(ctx, l, id, "")
	if err != nil {
		return w, err
	}
	s.expireIfDue(ctx, w, s.clock.Now())
	return w, nil
}

// Usable is Load of a workspace that can take commands now: 409 while
// starting, 410 once terminating, terminated or past expires_at (and one
// found past it is ended in the background).
func (s *Saga) Usable(ctx context.Context, l sandgate.Lease, id string, class admission.Class) (sandgate.Workspace, error) {
	w, err := s.Load(ctx, l, id, class)
	if err != nil {
		return w, err
	}
	now := s.clock.Now()
	return w, checkUsable(w, now, func() { s.expireIfDue(ctx, w, now) })
}

// checkUsable answers 410 for a workspace gone at now, after calling
// expire (which ends one found past its deadline), and 409 while it starts.
func checkUsable(w sandgate.Workspace, now time.Time, expire func()) error {
	switch {
	case w.GoneAt(now):
		expire()
		return protocol.E(protocol.WorkspaceGone, "the workspace has ended; acquire a new one")
	case w.State == sandgate.WorkspaceStarting:
		return &protocol.Error{Code: protocol.WorkspaceNotReady, Message: "the workspace is still starting; retry shortly", RetryAfter: time.Second}
	}
	return nil
}

// expireIfDue ends a workspace found past its deadline at now, in the
// background. The reaper does the same on its own schedule; this only
// makes it prompt.
func (s *Saga) expireIfDue(ctx context.Context, w sandgate.Workspace, now time.Time) {
	if w.State != sandgate.WorkspaceRunning || now.Before(w.ExpiresAt) {
		return
	}
	ctx = context.WithoutCancel(ctx)
	s.bg.Go(func() { s.term.Terminate(ctx, w, sandgate.ReasonExpired) })
}

// Release is DELETE of a workspace: idempotent, never refused for funds,
// budgets, pauses or stops (spec §Release). Two round trips
// (termination.Terminator.Release): start the termination, reading the
// record; after the provider's terminate, record the end and settle. A
// starting workspace is finished by its Acquire, which sees the release
// when it confirms; a terminating one is retried here.
func (s *Saga) Release(ctx context.Context, l sandgate.Lease, id string) (sandgate.Workspace, error) {
	if !policy.ValidID(id) {
		return sandgate.Workspace{}, ErrBadWorkspaceID
	}
	w, err := s.term.Release(ctx, l.AccountID, l.InstanceID, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return w, ErrNotFound
	case err != nil && !errors.Is(err, termination.ErrProvider):
		return w, Unavailable(err)
	}
	return w, nil
}

// Metered is a terminated workspace's metered_seconds, as the usage
// ledger has them.
func Metered(w sandgate.Workspace) int64 {
	m, _ := billing.Metered(w)
	return m
}
