// Package termination ends workspaces: it records the start of a
// termination, asks the provider to end the sandbox, and records the
// confirmed end. The gateway (release), the operator API (stop, pause,
// revoke) and the background sweeps share it, so every path ends a
// workspace the same way and with an exact reason.
package termination

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/store"
)

// ErrProvider wraps a provider failure to end a sandbox: the workspace
// stays terminating and is retried later.
var ErrProvider = errors.New("termination: the provider did not confirm the end")

// Terminator ends workspaces. It is safe for concurrent use, and ending the
// same workspace from several places at once is safe: only one starts the
// termination, and the provider's Terminate is idempotent.
type Terminator struct {
	db      *store.DB
	provs   *providers.Set
	clock   sandgate.Clock
	log     *slog.Logger
	timeout time.Duration
	settler Settler
	egress  EgressMeter
}

// EgressMeter returns, and forgets, what the broker's egress proxy
// counted for workspace id (out is sandbox to destination, in is back).
// The broker (internal/broker) passes the egress proxy's Forget.
type EgressMeter func(workspaceID string) EgressCount

// EgressCount is a workspace's egress count at its end: the count itself
// (store.Egress: its counter and every byte it counted), which the script
// recording the end adds as far as the record lacks it, and, when Exact,
// how much that is (NewOut, NewIn). A count whose last keep is in doubt
// is not exact: the record, not this process, knows what it lacks.
type EgressCount struct {
	store.Egress
	NewOut, NewIn int64
	Exact         bool
}

// Settler charges a workspace whose end is recorded (package billing). It
// must be idempotent by workspace id: Finish may run more than once.
type Settler interface {
	Settle(ctx context.Context, w sandgate.Workspace) error
}

// FinishSettler is an optional interface of a Settler: it records a
// terminating workspace's confirmed end at at and settles it in one step
// (billing.Billing.FinishAndSettle), returning the record as it left it.
// w is the record as it is now. Release uses it.
type FinishSettler interface {
	FinishAndSettle(ctx context.Context, w sandgate.Workspace, at time.Time, eg store.Egress) (sandgate.Workspace, error)
}

// Config configures a Terminator.
type Config struct {
	// Timeout bounds one provider call; 0 means 30s.
	Timeout time.Duration
}

// Deps are what a Terminator works with.
type Deps struct {
	DB *store.DB
	// Providers end each workspace on the provider it was created on. nil
	// (tests of billing alone) records ends without asking any provider.
	Providers *providers.Set
	Clock     sandgate.Clock
	Log       *slog.Logger // nil discards
	// Settler, when set, settles every confirmed end's usage.
	Settler Settler
	// EgressMeter, when set, makes every confirmed end record the
	// workspace's egress bytes with its usage.
	EgressMeter EgressMeter
}

// New returns a Terminator.
func New(cfg Config, d Deps) *Terminator {
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	return &Terminator{db: d.DB, provs: d.Providers, clock: d.Clock, log: d.Log, timeout: cfg.Timeout,
		settler: d.Settler, egress: d.EgressMeter}
}

// Terminate ends w with reason. It returns whether the end is confirmed.
// A workspace already terminating (an earlier attempt failed) is retried;
// one still starting is left to its Acquire, which sees the termination
// when it confirms the create. A provider failure leaves the workspace
// terminating for a later retry and returns the error.
func (t *Terminator) Terminate(ctx context.Context, w sandgate.Workspace, reason sandgate.TerminationReason) (bool, error) {
	ok, _, err := t.TerminateIf(ctx, w, reason, store.CondNone)
	return ok, err
}

// TerminateIf is Terminate that starts the termination only when cond
// (store.CondExpired, store.CondIdle) holds, checked atomically against
// the record: started reports whether this call started it. A workspace
// for which cond does not hold is left as it is (false, false, nil).
func (t *Terminator) TerminateIf(ctx context.Context, w sandgate.Workspace, reason sandgate.TerminationReason, cond string) (ok, started bool, err error) {
	ctx = context.WithoutCancel(ctx)
	prev, started, ref, err := t.db.BeginTerminateIf(ctx, w, reason, t.clock.Now(), cond)
	if err != nil {
		return false, false, err
	}
	if ref != "" {
		w.ProviderRef = ref // w may have been read before its create was confirmed
	}
	switch {
	case prev == "":
		return false, false, store.ErrNotFound
	case prev == sandgate.WorkspaceTerminated:
		return true, false, nil
	case started && prev == sandgate.WorkspaceStarting:
		return false, true, nil
	case !started && prev != sandgate.WorkspaceTerminating:
		return false, false, nil // cond does not hold
	}
	ok, err = t.Finish(ctx, w)
	return ok, started, err
}

// Release ends workspace id for a client of instance inst (account
// acct): the release, in two Redis round trips. The first starts the
// termination (store.DB.BeginRelease: ownership checked, slot freed, the
// record answered); the provider then ends the sandbox; the second records
// the end and settles (FinishSettler), answering the final record. A
// workspace of another instance, or none, is store.ErrNotFound. One still
// starting is left to its Acquire, one already terminated is answered as
// it is. A provider failure leaves it terminating for a later retry and
// returns the record with an error wrapping ErrProvider.
func (t *Terminator) Release(ctx context.Context, acct, inst, id string) (sandgate.Workspace, error) {
	ctx = context.WithoutCancel(ctx)
	prev, started, rec, err := t.db.BeginRelease(ctx, acct, inst, id, sandgate.ReasonReleased, t.clock.Now())
	if err != nil {
		return rec, err
	}
	if prev == sandgate.WorkspaceTerminated || (started && prev == sandgate.WorkspaceStarting) ||
		(prev == sandgate.WorkspaceTerminating && t.createInFlight(rec)) {
		return rec, nil
	}
	if rec.ProviderRef != "" && t.provs != nil {
		if err := t.terminate(ctx, rec); err != nil && !errors.Is(err, providers.ErrSandboxGone) {
			t.log.Error("provider terminate failed; will retry", sandgate.WorkspaceAttr(rec.ID), slog.Any("err", err))
			return rec, fmt.Errorf("%w: %w", ErrProvider, err)
		}
	}
	rec, eg, exact := t.egressBytes(rec)
	fs, ok := t.settler.(FinishSettler)
	if !ok || !exact { // no billing, one without the one-step path, or egress bytes only the record knows: step by step
		if err := t.db.FinishTerminate(ctx, rec, t.clock.Now(), eg); err != nil {
			return rec, err
		}
		if t.settler != nil {
			if err := t.settler.Settle(ctx, rec); err != nil {
				t.log.Error("terminate: settle usage", sandgate.WorkspaceAttr(rec.ID), slog.Any("err", err))
			}
		}
		return t.db.Workspace(ctx, acct, id)
	}
	cur, err := fs.FinishAndSettle(ctx, rec, t.clock.Now(), eg)
	if err != nil {
		// The end may be recorded with the settlement failed: the hold
		// stays open, reconcile reports it and billing's repair settles it.
		t.log.Error("terminate: record end and settle", sandgate.WorkspaceAttr(rec.ID), slog.Any("err", err))
		if cur.State == sandgate.WorkspaceTerminated {
			return cur, nil
		}
		return rec, err
	}
	return cur, nil
}

// FailCreate ends a workspace whose create nobody confirmed (its gateway
// died between the provider's create and Confirm): the record becomes
// terminating with reason failed and its slot, reservation and
// Idempotency-Key are freed at once (store.FailCreate), and sb's ref is
// stored with it; then whatever the provider created for it (sb, zero
// when nothing) is terminated and the end recorded. A provider failure
// leaves it terminating with that ref, for a later pass to retry. started
// is false when the workspace was no longer starting.
func (t *Terminator) FailCreate(ctx context.Context, w sandgate.Workspace, sb providers.Sandbox) (ok, started bool, err error) {
	ctx = context.WithoutCancel(ctx)
	w.ProviderRef = sb.Ref
	started, err = t.db.FailCreate(ctx, w, t.clock.Now())
	if err != nil || !started {
		return false, started, err
	}
	ok, err = t.Finish(ctx, w)
	return ok, true, err
}

// Vanished ends workspace w, whose sandbox the vendor no longer has
// (a provider answered providers.ErrSandboxGone, or the reaper's listing
// lacks it), with reason failed: its slot is freed and its end recorded
// and settled at at, when the broker learned of it (or the vendor's own
// end), so that metering stops there: at the earliest half a minute
// (billing.AccrualGrace/2) before now, at the latest at its expires_at.
// Only a running workspace is ended:
// one still starting belongs to its Acquire, and one already ending keeps
// its reason. started reports whether this call ended it. w needs only
// its ID and AccountID; the record is read again.
func (t *Terminator) Vanished(ctx context.Context, w sandgate.Workspace, at time.Time) (started bool, err error) {
	ctx = context.WithoutCancel(ctx)
	cur, err := t.db.Workspace(ctx, w.AccountID, w.ID)
	if err != nil {
		return false, err
	}
	if cur.State != sandgate.WorkspaceRunning {
		return false, nil
	}
	now := t.clock.Now()
	if at.IsZero() || at.After(now) {
		at = now
	}
	// Accrual charges a running workspace's periods once they ended
	// billing.AccrualGrace ago: an end backdated further (a listing that
	// took that long) could fall inside a period already charged, and the
	// final entry would charge that time again. Half the grace is left for
	// a broker whose clock runs ahead. Accrual never passes the deadline,
	// so the end never needs to either.
	if floor := now.Add(-billing.AccrualGrace / 2); at.Before(floor) {
		at = floor
	}
	if !cur.ExpiresAt.IsZero() && at.After(cur.ExpiresAt) {
		at = cur.ExpiresAt
	}
	if at.Before(cur.StartedAt) {
		at = cur.StartedAt
	}
	prev, started, _, err := t.db.BeginTerminateIf(ctx, cur, sandgate.ReasonFailed, at, store.CondNone)
	if err != nil || !started || prev != sandgate.WorkspaceRunning {
		return false, err
	}
	t.log.Warn("sandbox gone at the provider; workspace ended", sandgate.WorkspaceAttr(cur.ID),
		slog.String(sandgate.KeyProvider, cur.Provider), slog.String("reason", string(sandgate.ReasonFailed)))
	_, err = t.finish(ctx, cur, at)
	return true, err
}

// Finish asks the provider to end a terminating workspace and records the
// confirmed end. A workspace whose create may still be in flight is left
// to its Acquire (false, nil): see createInFlight.
func (t *Terminator) Finish(ctx context.Context, w sandgate.Workspace) (bool, error) {
	return t.finish(ctx, w, time.Time{})
}

// finish is Finish recording the end at at, or when the provider
// confirmed it for a zero at.
func (t *Terminator) finish(ctx context.Context, w sandgate.Workspace, at time.Time) (bool, error) {
	if t.createInFlight(w) {
		return false, nil
	}
	if w.ProviderRef != "" && t.provs != nil {
		err := t.terminate(ctx, w)
		if err != nil && !errors.Is(err, providers.ErrSandboxGone) {
			t.log.Error("provider terminate failed; will retry", sandgate.WorkspaceAttr(w.ID), slog.Any("err", err))
			return false, fmt.Errorf("%w: %w", ErrProvider, err)
		}
	}
	w, eg, _ := t.egressBytes(w) // settled from the record the end leaves
	if at.IsZero() {
		at = t.clock.Now()
	}
	if err := t.db.FinishTerminate(ctx, w, at, eg); err != nil {
		t.log.Error("terminate: record end", sandgate.WorkspaceAttr(w.ID), slog.Any("err", err))
		return false, err
	}
	if t.settler != nil {
		// A failed settlement leaves the hold open: reconcile reports it and
		// billing's repair pass (Billing.Run) settles it.
		if err := t.settler.Settle(ctx, w); err != nil {
			t.log.Error("terminate: settle usage", sandgate.WorkspaceAttr(w.ID), slog.Any("err", err))
		}
	}
	if w.StartedAt.IsZero() {
		// Never confirmed: its Acquire may have met a failing store before
		// it could free its Idempotency-Key, which would then answer 409
		// until its TTL. A key that is done, or another's, stays.
		if err := t.db.FreePendingKey(ctx, w.AccountID, w.InstanceID, w.ID); err != nil {
			t.log.Error("terminate: free the key of a create never confirmed", sandgate.WorkspaceAttr(w.ID), slog.Any("err", err))
		}
	}
	return true, nil
}

// createInFlight reports whether w's create may still run in its
// Acquire: ended while starting, it names no sandbox yet, and its pending
// deadline, by which every create is over, has not passed. That Acquire
// ends the sandbox it gets and records the end; recording it first would
// say terminated while a sandbox nobody was asked to end runs on.
func (t *Terminator) createInFlight(w sandgate.Workspace) bool {
	return w.StartedAt.IsZero() && w.ProviderRef == "" &&
		t.clock.Now().Before(w.CreatedAt.Add(t.db.Config().PendingTimeout+time.Second))
}

// egressBytes returns w with the bytes it moved through the egress proxy
// added, for the final usage entry, and the count the script recording the
// end adds to the record (store.Egress); exact is false when the bytes to
// add are known only to that script (EgressCount.Exact): w's are then
// short, and the entry must be built from the record the end leaves. It
// runs after the provider's end, so no byte comes later. Counted in this
// broker process: bytes another process proxied for the workspace and did
// not record are not (README, "Egress bytes").
func (t *Terminator) egressBytes(w sandgate.Workspace) (_ sandgate.Workspace, _ store.Egress, exact bool) {
	if t.egress == nil {
		return w, store.Egress{}, true
	}
	c := t.egress(w.ID)
	if c.Exact {
		w.EgressBytesOut += c.NewOut
		w.EgressBytesIn += c.NewIn
	}
	return w, c.Egress, c.Exact
}

// terminate asks the workspace's own provider, accepting new work or not,
// to end its sandbox. A provider no longer configured is an error: the
// workspace stays terminating until an operator configures it again.
func (t *Terminator) terminate(ctx context.Context, w sandgate.Workspace) error {
	e, err := t.provs.Get(w.Provider)
	if err != nil {
		return err
	}
	tctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	return e.Provider.Terminate(tctx, providers.Sandbox{Ref: w.ProviderRef})
}

// Result counts a sweep.
type Result struct {
	Terminated int `json:"terminated"`
	Failed     int `json:"failed"`
}

// Scope names the workspaces a sweep ends: every account's (Account and
// Instance empty), one account's, or one instance's.
type Scope struct {
	AccountID  string
	InstanceID string
}

// Sweep ends every live workspace in scope with reason and retries those
// of the scope still terminating. Workspaces still starting are ended by
// their Acquire (counted as terminated: they will not run).
func (t *Terminator) Sweep(ctx context.Context, sc Scope, reason sandgate.TerminationReason) (Result, error) {
	var res Result
	ws, err := t.db.LiveWorkspaces(ctx, sc.AccountID, sc.InstanceID, t.clock.Now())
	if err != nil {
		return res, err
	}
	for _, w := range ws {
		var ok bool
		var err error
		if w.State == sandgate.WorkspaceTerminating {
			ok, err = t.Finish(ctx, w)
			if err == nil && !ok {
				ok = true // its create in flight: its Acquire ends it
			}
		} else {
			ok, err = t.Terminate(ctx, w, reason)
			if err == nil && !ok {
				ok = true // starting: its Acquire terminates it
			}
		}
		if ok && err == nil {
			res.Terminated++
		} else if !errors.Is(err, store.ErrNotFound) {
			res.Failed++
		}
	}
	return res, nil
}
