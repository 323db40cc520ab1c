package reaper

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/runner"
	"github.com/sandgate/sandgate/store"
)

// createMargin is how long past its pending deadline a starting workspace
// is left to its Acquire before the reaper resolves it: CreatedAt is
// truncated to the second, the slot's deadline is not.
const createMargin = time.Second

// sweepWorkspaces walks every live workspace once: it ends those past
// expires_at (expired), idle ones (idle), those of a revoked instance
// (lease_revoked) and, every ReconcileInterval, running ones whose
// sandbox the provider no longer lists (failed); it retries terminations
// the provider has not confirmed and resolves creates whose outcome is
// unknown, whichever gateway made them (failed); then it terminates the
// provider's sandboxes that have no live record (orphaned) and frees
// slots and reservations whose workspace is gone. It stops when ctx ends
// (the leader lease was lost).
func (r *Reaper) sweepWorkspaces(ctx context.Context) error {
	l := r.listProviders(ctx)
	now := r.clock.Now()
	ws, err := r.db.LiveWorkspaces(ctx, "", "", now)
	if err != nil {
		return err
	}
	truth := r.truthDue(l.at)
	revoked := map[string]map[string]time.Time{}
	pending := r.db.Config().PendingTimeout
	for _, w := range ws {
		if err := ctx.Err(); err != nil {
			return err
		}
		rev, ok := revoked[w.AccountID]
		if !ok {
			if rev, err = r.db.Revoked(ctx, w.AccountID); err != nil {
				return err
			}
			revoked[w.AccountID] = rev
		}
		name := providerName(w.Provider)
		r.settle(ctx, w, now, pending, rev, l.all[name])
		if truth && l.complete[name] {
			r.checkVanished(ctx, w, l.all[name], l.at)
		}
		// Not an orphan this pass, even if settle ends it now: the listing
		// predates that end. A sandbox left behind by it is the next
		// pass's, with a fresh listing.
		delete(l.own[name], w.ID)
	}
	if r.provs != nil {
		for _, e := range r.provs.All() {
			if vendor := l.own[e.Name]; vendor != nil {
				if err := r.sweepOrphans(ctx, e.Provider, vendor); err != nil {
					return err
				}
			}
		}
	}
	return r.reconcile(ctx)
}

// truthDue reports whether this pass compares running workspaces with
// the listings taken at at: once every ReconcileInterval.
func (r *Reaper) truthDue(at time.Time) bool {
	if r.cfg.ReconcileInterval < 0 {
		return false
	}
	last := r.lastTruth.Load()
	if last != 0 && at.Sub(time.Unix(0, last)) < r.cfg.ReconcileInterval {
		return false
	}
	return r.lastTruth.CompareAndSwap(last, at.UnixNano())
}

// checkVanished ends w, running and confirmed at least a
// ReconcileInterval before the listing taken at at, when that complete
// listing of its provider (every broker id's sandboxes) lacks it: the
// vendor ended it (a crash, a vendor-side kill) and nothing else would
// tell. Its metering stops at at. One due to expire or idle out within
// a ReconcileInterval is left to that end.
func (r *Reaper) checkVanished(ctx context.Context, w sandgate.Workspace, vendor map[string]providers.Sandbox, at time.Time) {
	if w.State != sandgate.WorkspaceRunning || w.StartedAt.IsZero() || w.ProviderRef == "" ||
		w.StartedAt.After(at.Add(-r.cfg.ReconcileInterval)) {
		return
	}
	if _, ok := vendor[w.ID]; ok {
		return
	}
	// A vendor that enforces the lifetime or the idle timeout itself may
	// end the sandbox a little before the broker's clock says so: such an
	// end is the broker's to record, with its own reason, shortly.
	soon := at.Add(r.cfg.ReconcileInterval)
	if !soon.Before(w.ExpiresAt) || (w.IdleTimeout > 0 && !soon.Before(w.IdleAt())) {
		return
	}
	started, err := r.term.Vanished(ctx, w, at)
	if started {
		r.stats.Vanished.Add(1)
		r.stats.Failed.Add(1)
		r.correct(ctx, string(sandgate.ReasonFailed), 1)
		r.log.Info("reaper ended a workspace its provider no longer has", sandgate.WorkspaceAttr(w.ID),
			slog.String(sandgate.KeyInstanceID, w.InstanceID), slog.String("reason", string(sandgate.ReasonFailed)), slog.Any(sandgate.KeyError, err))
	}
}

// providerName is the name a record's provider field stands for.
func providerName(name string) string {
	if name == "" {
		return providers.LegacyName
	}
	return name
}

// listing is what every configured provider listed at the start of a
// pass, by provider name and then workspace id.
type listing struct {
	at time.Time
	// own are the sandboxes of this broker id (List): the orphan sweep's.
	own map[string]map[string]providers.Sandbox
	// all adds those of every other broker id registered on the store
	// that the provider could list (providers.BrokerLister): unconfirmed
	// creates of any gateway are found there.
	all map[string]map[string]providers.Sandbox
	// complete is set for a provider whose all holds every registered
	// broker id's sandboxes, the only listing a missing sandbox can be
	// judged by.
	complete map[string]bool
}

// listProviders lists every configured provider's sandboxes, accepting
// new work or not, for this broker id and for every other one registered
// on the store. A provider whose List (or one broker id's ListBroker)
// failed has no entry, so its unknown creates and orphans wait for a pass
// that can ask it; the others go on.
func (r *Reaper) listProviders(ctx context.Context) listing {
	l := listing{at: r.clock.Now(), own: map[string]map[string]providers.Sandbox{},
		all: map[string]map[string]providers.Sandbox{}, complete: map[string]bool{}}
	if r.provs == nil {
		return l
	}
	brokers, berr := r.db.Brokers(ctx)
	if berr != nil {
		r.log.Warn("broker ids not read; only this broker's sandboxes are listed", slog.Any(sandgate.KeyError, berr))
	}
	byWorkspace := func(sbs []providers.Sandbox, into map[string]providers.Sandbox) {
		for _, sb := range sbs {
			if id := sb.Labels[providers.LabelWorkspace]; id != "" {
				into[id] = sb
			}
		}
	}
	for _, e := range r.provs.All() {
		sbs, err := e.Provider.List(ctx)
		if err != nil {
			r.log.Warn("provider list failed; its unknown creates and orphans wait", slog.String(sandgate.KeyProvider, e.Name), slog.Any(sandgate.KeyError, err))
			continue
		}
		own := make(map[string]providers.Sandbox, len(sbs))
		byWorkspace(sbs, own)
		all := maps.Clone(own)
		complete, failed := berr == nil, false
		bl, ok := providers.AsBrokerLister(e.Provider)
		for _, id := range brokers {
			if id == r.cfg.BrokerID {
				continue
			}
			if !ok {
				complete = false
				break
			}
			sbs, err := bl.ListBroker(ctx, id)
			if err != nil {
				r.log.Warn("provider list of another broker id failed; its unknown creates wait", slog.String(sandgate.KeyProvider, e.Name), slog.Any(sandgate.KeyError, err))
				failed = true
				break
			}
			byWorkspace(sbs, all)
		}
		l.own[e.Name] = own
		if !failed {
			l.all[e.Name] = all
			l.complete[e.Name] = complete && r.cfg.BrokerID != ""
		}
	}
	return l
}

// settle takes the one step w is due for, if any.
func (r *Reaper) settle(ctx context.Context, w sandgate.Workspace, now time.Time, pending time.Duration, rev map[string]time.Time, vendor map[string]providers.Sandbox) {
	attrs := []any{sandgate.WorkspaceAttr(w.ID), slog.String(sandgate.KeyInstanceID, w.InstanceID)}
	switch w.State {
	case sandgate.WorkspaceTerminating:
		if ok, _ := r.term.Finish(ctx, w); ok {
			r.stats.Retried.Add(1)
			r.correct(ctx, KindRetried, 1)
			r.log.Info("reaper confirmed a termination", append(attrs, slog.String("reason", string(w.TerminationReason)))...)
		}
	case sandgate.WorkspaceStarting:
		if now.Before(w.CreatedAt.Add(pending + createMargin)) {
			return
		}
		if vendor == nil {
			return // the provider could not be asked; next pass
		}
		sb, found := vendor[w.ID]
		_, started, err := r.term.FailCreate(ctx, w, sb)
		if started {
			r.stats.Failed.Add(1)
			r.correct(ctx, string(sandgate.ReasonFailed), 1)
			r.log.Info("reaper ended an unconfirmed create", append(attrs, slog.String("reason", string(sandgate.ReasonFailed)),
				slog.Bool("at_provider", found), slog.Any(sandgate.KeyError, err))...)
		}
	case sandgate.WorkspaceRunning:
		if at, ok := rev[w.InstanceID]; ok && w.CreatedAt.Before(at.Truncate(time.Second)) {
			r.end(ctx, w, sandgate.ReasonLeaseRevoked, store.CondNone, &r.stats.Revoked, attrs)
			return
		}
		if !now.Before(w.ExpiresAt) {
			r.end(ctx, w, sandgate.ReasonExpired, store.CondExpired, &r.stats.Expired, attrs)
			return
		}
		if w.IdleTimeout > 0 && !now.Before(w.LastActivity.Add(w.IdleTimeout)) && now.Before(w.IdleAt()) {
			// Idle but for its busy mark: durable commands may have finished
			// with nobody reading them.
			w = r.finishCommands(ctx, w, now)
		}
		if w.IdleTimeout > 0 && !now.Before(w.IdleAt()) {
			r.end(ctx, w, sandgate.ReasonIdle, store.CondIdle, &r.stats.Idle, attrs)
		}
	}
}

// commandReadTimeout bounds one read of a durable command in its sandbox.
const commandReadTimeout = 10 * time.Second

// finishCommands asks the sandbox about each durable command that keeps w
// busy and records those it finished, at their end (the time the sandbox
// gives, or now when it gives none), as a read by the client would. It
// returns w as the store has it then; on any failure, w as it was, which
// only keeps the workspace longer.
func (r *Reaper) finishCommands(ctx context.Context, w sandgate.Workspace, now time.Time) sandgate.Workspace {
	if r.provs == nil {
		return w
	}
	e, err := r.provs.Get(w.Provider)
	if err != nil {
		return w
	}
	cmds := runner.For(e.Provider)
	keys, err := r.db.BusyCommands(ctx, w)
	if err != nil {
		return w
	}
	finished := 0
	for _, key := range keys {
		cmd, err := r.db.Command(ctx, w, key)
		if err != nil || !cmd.Launched || (cmd.State != sandgate.CommandStarting && cmd.State != sandgate.CommandRunning) {
			continue // a launch never confirmed is fenced by the client's next read
		}
		rctx, cancel := context.WithTimeout(ctx, commandReadTimeout)
		st, err := cmds.ReadCommand(rctx, providers.Sandbox{Ref: w.ProviderRef}, key, 0)
		cancel()
		if err != nil || (st.State != providers.CommandCompleted && st.State != providers.CommandCanceled) {
			continue
		}
		at := st.FinishedAt
		if at.IsZero() || at.After(now) {
			at = now
		}
		if _, err := r.db.FinishCommand(ctx, w, key, sandgate.CommandState(st.State), st.ExitCode, st.TimedOut, at); err == nil {
			finished++
		}
	}
	if finished == 0 {
		return w
	}
	cur, err := r.db.Workspace(ctx, w.AccountID, w.ID)
	if err != nil {
		return w
	}
	return cur
}

func (r *Reaper) end(ctx context.Context, w sandgate.Workspace, reason sandgate.TerminationReason, cond string, n interface{ Add(int64) int64 }, attrs []any) {
	_, started, err := r.term.TerminateIf(ctx, w, reason, cond)
	if started {
		n.Add(1)
		r.correct(ctx, string(reason), 1)
		r.log.Info("reaper ended a workspace", append(attrs, slog.String("reason", string(reason)), slog.Any(sandgate.KeyError, err))...)
	}
}

// sweepOrphans terminates every listed sandbox (they all carry this
// broker's labels) whose workspace has no live record: none at all, or
// terminated. Sandboxes of live records, starting ones included, are left
// alone: a create in flight wrote its record before calling the provider.
// vendor holds no workspace that was live when the pass read the records.
func (r *Reaper) sweepOrphans(ctx context.Context, p providers.Provider, vendor map[string]providers.Sandbox) error {
	for id, sb := range vendor {
		if err := ctx.Err(); err != nil {
			return err
		}
		acct, err := r.db.InstanceAccount(ctx, sb.Labels[providers.LabelInstance])
		if err != nil {
			return err
		}
		if acct != "" {
			w, err := r.db.Workspace(ctx, acct, id)
			if err == nil && w.State != sandgate.WorkspaceTerminated {
				continue
			}
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
		}
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = p.Terminate(tctx, sb)
		cancel()
		if err != nil && !errors.Is(err, providers.ErrSandboxGone) {
			r.log.Warn("orphan not terminated; will retry", sandgate.WorkspaceAttr(id), slog.Any(sandgate.KeyError, err))
			continue
		}
		r.stats.Orphaned.Add(1)
		r.correct(ctx, string(sandgate.ReasonOrphaned), 1)
		r.log.Info("reaper terminated an orphan", sandgate.WorkspaceAttr(id), slog.String("reason", string(sandgate.ReasonOrphaned)))
	}
	return nil
}

// reconcile frees every slot and reservation whose workspace is gone,
// terminating or terminated, and reports each correction.
func (r *Reaper) reconcile(ctx context.Context) error {
	accts, err := r.db.AccountIDs(ctx)
	if err != nil {
		return err
	}
	for _, a := range accts {
		freed, err := r.db.FreeStaleSlots(ctx, a)
		for _, f := range freed {
			r.stats.SlotsFreed.Add(1)
			r.correct(ctx, KindSlotFreed, 1)
			r.log.Warn("reaper freed a stale slot", slog.String("kind", f.Kind), slog.String(sandgate.KeyAccountID, f.AccountID),
				slog.String(sandgate.KeyInstanceID, f.InstanceID), sandgate.WorkspaceAttr(f.WorkspaceID))
		}
		if err != nil {
			return err
		}
	}
	return nil
}
