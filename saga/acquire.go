package saga

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/store"
)

// restoreMargin keeps a warm start's restore clear of the workspace's
// pending deadline, past which its slot would be freed under it.
const restoreMargin = 10 * time.Second

// ReasonProviderClosed is details.reason of the 403 paused that refuses an
// Acquire whose instance's provider takes no new workspaces (accept_new:
// false) or is no longer configured.
const ReasonProviderClosed = "provider_closed"

// Acquired is an Acquire's outcome.
type Acquired struct {
	Workspace sandgate.Workspace
	// Replayed: the Idempotency-Key had created Workspace before (200,
	// not 201).
	Replayed bool
}

// Acquire runs POST /v1/workspaces for instance in, in the spec's order:
// idempotency replay → validate (the snapshot included) → the provider
// accepts new work → admission (stop and pause, concurrency, funds,
// budget, risk) → provider create → restore → confirm. A refusal before
// the create leaves nothing behind; a failure after it terminates what
// was created before answering.
//
// The replay costs no round trip of its own on the way to a create: the
// admission script's first check is the key's claim, which answers a
// claimed key as a replay. Whatever refuses the request before that check
// (validation, the snapshot, the provider, admission's checks in Go)
// looks the key up first, and a claimed key answers the replay instead
// (replayOr), so every request is answered as if the lookup came first.
func (s *Saga) Acquire(ctx context.Context, in sandgate.Instance, key string, req protocol.AcquireRequest) (Acquired, error) {
	return s.acquire(ctx, in, key, req, true)
}

// acquire is Acquire. again allows it to evaluate the request once more
// when a stop or pause ended its workspace before the create was
// confirmed (stoppedWhileStarting).
func (s *Saga) acquire(ctx context.Context, in sandgate.Instance, key string, req protocol.AcquireRequest, again bool) (Acquired, error) {
	if err := policy.ValidateIdempotencyKey(key); err != nil {
		return Acquired{}, err
	}
	keyHash, reqHash := HashString(key), acquireHash(req)

	now := s.clock.Now()
	scope, prov, err := s.Scope(in)
	if err != nil {
		return s.replayOr(ctx, in, keyHash, reqHash, providerClosed(err))
	}
	caps := prov.Provider.Capabilities()
	ws, env, egress, err := validateAcquire(req, scope, now)
	if err != nil {
		return s.replayOr(ctx, in, keyHash, reqHash, err)
	}
	snap, err := s.warmStart(ctx, in, req.SnapshotID, prov.Name, now)
	if err != nil {
		return s.replayOr(ctx, in, keyHash, reqHash, err)
	}
	if !prov.AcceptNew {
		return s.replayOr(ctx, in, keyHash, reqHash, providerClosed(nil))
	}
	size, ok := caps.Size(ws.Size)
	if !ok { // the scope was checked against the provider: a changed provider
		return s.replayOr(ctx, in, keyHash, reqHash, protocol.E(protocol.SizeNotAllowed, "this broker's provider for the instance does not run size "+ws.Size))
	}
	if snap != nil && !fits(caps, *snap, size) {
		return s.replayOr(ctx, in, keyHash, reqHash, protocol.E(protocol.SnapshotGone,
			"the snapshot was taken in a workspace with more disk than size "+ws.Size+" has; start cold or acquire a larger size"))
	}
	ws.ID = sandgate.NewID(sandgate.PrefixWorkspace)
	ws.AccountID, ws.InstanceID, ws.Provider = in.AccountID, in.ID, prov.Name
	ws.Domains = strings.Join(egress, ",") // for the egress proxy of every gateway (docs/egress.md)

	areq := &admission.Request{
		Workspace: ws, Scope: scope,
		Keys:    store.AdmissionKeys(ws.AccountID, ws.InstanceID, ws.ID, keyHash),
		KeyHash: keyHash, RequestHash: reqHash, Now: now,
	}
	err = s.admit.Admit(ctx, areq)
	if rec, ok := admission.IsReplay(err); ok { // claimed before, or by a concurrent request
		return s.replayAcquire(ctx, in, rec, reqHash)
	}
	if err != nil {
		if rec, ierr := s.db.Idempotency(ctx, in.AccountID, in.ID, store.OpAcquire, keyHash); ierr == nil &&
			rec.WorkspaceID == ws.ID && rec.State == store.IdemInProgress {
			// This request's own claim: the script ran on the primary but
			// its answer was lost, or the replicas did not acknowledge it.
			// Undo it, so that a retry re-evaluates now rather than
			// meeting idempotency_in_progress until the pending deadline.
			s.undoAdmission(context.WithoutCancel(ctx), ws, keyHash)
			return Acquired{}, err
		}
		// A check in Go (the broker-wide stop) may refuse before the
		// script's claim check ran.
		return s.replayOr(ctx, in, keyHash, reqHash, err)
	}
	ws = areq.Workspace // the record as admission wrote it: priced
	if areq.Queued {
		s.holds.FlushAlerts(ctx, ws.AccountID)
	}

	// The create must finish even if the client goes away: the slot and
	// the key are already held, and only this goroutine can settle them.
	ctx = context.WithoutCancel(ctx)
	cctx, cancel := context.WithTimeout(ctx, s.cfg.CreateTimeout)
	sb, err := prov.Provider.Create(cctx, providers.CreateSpec{
		WorkspaceID: ws.ID, InstanceID: ws.InstanceID, AccountID: ws.AccountID, Size: size, Image: ws.Image,
		Env: env, Egress: sandgate.EgressPolicy{AllowedDomains: egress}, ExpiresAt: ws.ExpiresAt, IdleTimeout: ws.IdleTimeout,
	})
	cancel()
	if err != nil {
		s.undoAdmission(ctx, ws, keyHash)
		if errors.Is(err, providers.ErrNoCapacity) {
			return Acquired{}, &protocol.Error{Code: protocol.Unavailable, Message: "the sandbox provider has no capacity for a new workspace now; retry later", RetryAfter: time.Minute, Err: err}
		}
		if errors.Is(err, providers.ErrImageUnavailable) {
			return Acquired{}, &protocol.Error{Code: protocol.ImageNotAllowed, Reason: "image_unavailable", Message: "the image cannot be run: no registry has it, it is too large, or it runs as a user other than root; pick another image", Err: err}
		}
		return Acquired{}, &protocol.Error{Code: protocol.UpstreamError, Message: "the sandbox provider could not create the workspace; retry with the same Idempotency-Key", Err: err}
	}
	if s.cfg.AfterCreate != nil {
		s.cfg.AfterCreate(ws.ID)
	}
	if snap != nil {
		// Warm start: the directory comes back at the same path before the
		// 201, within the workspace's pending deadline.
		rctx, cancel := context.WithTimeout(ctx, min(s.cfg.SnapshotTimeout, now.Add(s.db.Config().PendingTimeout-restoreMargin).Sub(s.clock.Now())))
		err := prov.Provider.Restore(rctx, sb, providers.SnapshotRef{ID: snap.ID, Ref: snap.ProviderRef}, snap.Dir)
		cancel()
		if err != nil {
			// spec §Acquire: a failure after provider create terminates
			// what was created before answering. The key is freed, so a
			// retry re-evaluates; the workspace stays listed as failed.
			_ = s.terminateSandbox(ctx, ws, sb.Ref, false)
			s.freeKey(ctx, ws, keyHash)
			return Acquired{}, providerError(opRestore, err)
		}
	}
	started := sb.StartedAt
	if started.IsZero() {
		started = s.clock.Now()
	}
	// The confirm answers with the record it left: the answer costs no
	// further read (acquire's third and last round trip).
	cur, ok, err := s.db.ConfirmRecord(ctx, ws, sb.Ref, started, keyHash, reqHash)
	if err == nil && ok {
		return Acquired{Workspace: cur}, nil
	}
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		// Redis failed: nothing may run that the broker does not account
		// for. The key is freed, so that a retry re-evaluates: the confirm
		// may or may not have marked it done, and the end frees only a key
		// still in progress. When not even the end could be
		// recorded, the sandbox and the key stay as the record has them:
		// a running record is a workspace its key replays, ended by the
		// reaper like any other; a starting one is failed by the reaper
		// at its pending deadline, which ends the sandbox and frees the
		// key.
		if s.terminateSandbox(ctx, ws, sb.Ref, true) == nil {
			s.freeKey(ctx, ws, keyHash)
		}
		return Acquired{}, Unavailable(err)
	}
	// Released while starting, or pending slot lost.
	_ = s.terminateSandbox(ctx, ws, sb.Ref, false)
	cur, err = s.db.Workspace(ctx, ws.AccountID, ws.ID)
	if err != nil {
		return Acquired{}, Unavailable(err)
	}
	if again && stoppedWhileStarting(cur) {
		// The client never got this workspace, and never will: a 201 of
		// a terminated workspace, and its key replaying it for days,
		// would keep the client's acquisition failing. The key is freed
		// and the request evaluated again, so the client gets the
		// refusal the stop or pause gives (or, lifted meanwhile, a
		// workspace).
		if err := s.db.FreeKeyOf(ctx, ws.AccountID, ws.InstanceID, store.OpAcquire, keyHash, ws.ID); err != nil {
			return Acquired{}, Unavailable(err)
		}
		return s.acquire(ctx, in, key, req, false)
	}
	return Acquired{Workspace: cur}, nil
}

// stoppedWhileStarting reports whether a stop or pause ended w before its
// create was confirmed.
func stoppedWhileStarting(w sandgate.Workspace) bool {
	return w.StartedAt.IsZero() && (w.TerminationReason == sandgate.ReasonPaused || w.TerminationReason == sandgate.ReasonEmergencyStopped)
}

// providerClosed refuses new work on a provider that takes none.
func providerClosed(err error) error {
	return &protocol.Error{Code: protocol.Paused, Reason: ReasonProviderClosed,
		Message: "the provider of this instance takes no new workspaces; the operator must move the instance to another provider", Err: err}
}

// terminateSandbox ends a sandbox that Confirm refused, or whose restore
// failed, and records the end (reason failed); the record keeps the
// sandbox's ref, so that a provider failure is retried by the reaper. A
// store failure is returned. When the confirm may have run (its answer
// lost), the sandbox is then left running: ended under a record the store
// could not change, a running workspace would go on being billed, and
// replayed to its client, with no sandbox behind it. The record, running
// or starting, leaves it to the reaper (at its idle timeout or
// expires_at, or at its pending deadline). Otherwise no record can name
// the sandbox, and it is ended at once.
func (s *Saga) terminateSandbox(ctx context.Context, w sandgate.Workspace, ref string, confirmMayHaveRun bool) error {
	w.ProviderRef = ref
	_, _, err := s.db.BeginTerminate(ctx, w, sandgate.ReasonFailed, s.clock.Now())
	if err != nil {
		s.log.Error("terminate: record", sandgate.WorkspaceAttr(w.ID), slog.Bool("sandbox_left", confirmMayHaveRun), slog.Any(sandgate.KeyError, err))
		if confirmMayHaveRun {
			return err
		}
	}
	_, _ = s.term.Finish(ctx, w) // a failure is logged, and retried by the reaper
	return err
}

// freeKey frees an Acquire's Idempotency-Key once its workspace's end is
// recorded, so a retry re-evaluates. A failure is logged: the key then
// replays the ended workspace.
func (s *Saga) freeKey(ctx context.Context, ws sandgate.Workspace, keyHash string) {
	if err := s.db.FreeKey(ctx, ws.AccountID, ws.InstanceID, store.OpAcquire, keyHash); err != nil {
		s.log.Error("free the key of a failed create", sandgate.WorkspaceAttr(ws.ID), slog.Any(sandgate.KeyError, err))
	}
}

// undoAdmission removes what an admission wrote for ws, when nothing
// ran: the hold goes back uncharged, then the record, slot and key go. A
// failure is logged; the reaper fails what is left at the pending
// deadline. The hold goes first: another broker's repair frees a hold
// whose record is gone without knowing its month and scopes, so in the
// other order it could take the hold first and leave the budgets
// counting it.
func (s *Saga) undoAdmission(ctx context.Context, ws sandgate.Workspace, keyHash string) {
	if err := s.holds.Release(ctx, ws); err != nil {
		s.log.Error("release the hold of an undone admission", sandgate.WorkspaceAttr(ws.ID), slog.Any(sandgate.KeyError, err))
	}
	if err := s.db.Abort(ctx, ws, keyHash); err != nil {
		s.log.Error("abort an undone admission", sandgate.WorkspaceAttr(ws.ID), slog.Any(sandgate.KeyError, err))
	}
}

// replayOr answers the replay when the Idempotency-Key is claimed, and
// refusal otherwise: a request refused before admission's claim check
// ran. The store unreachable, new work fails closed with admission's own
// code (spec §Broker obligations).
func (s *Saga) replayOr(ctx context.Context, in sandgate.Instance, keyHash, reqHash string, refusal error) (Acquired, error) {
	rec, err := s.db.Idempotency(ctx, in.AccountID, in.ID, store.OpAcquire, keyHash)
	switch {
	case err == nil:
		return s.replayAcquire(ctx, in, rec, reqHash)
	case errors.Is(err, store.ErrNotFound):
		return Acquired{}, refusal
	default:
		return Acquired{}, admissionUnavailable(err)
	}
}

func (s *Saga) replayAcquire(ctx context.Context, in sandgate.Instance, rec store.IdemRecord, reqHash string) (Acquired, error) {
	if err := replayed(rec, reqHash); err != nil {
		return Acquired{}, err
	}
	w, err := s.db.Workspace(ctx, in.AccountID, rec.WorkspaceID)
	if errors.Is(err, store.ErrNotFound) {
		return Acquired{}, protocol.E(protocol.WorkspaceGone, "the workspace this Idempotency-Key created is gone")
	}
	if err != nil {
		return Acquired{}, Unavailable(err)
	}
	return Acquired{Workspace: w, Replayed: true}, nil
}

// validateAcquire checks an Acquire against the scope: the record to
// admit, and the parts that are never persisted (env, egress).
func validateAcquire(req protocol.AcquireRequest, scope sandgate.Scope, now time.Time) (sandgate.Workspace, map[string]string, []string, error) {
	fail := func(err error) (sandgate.Workspace, map[string]string, []string, error) {
		return sandgate.Workspace{}, nil, nil, err
	}
	if err := policy.ValidateLabel(req.Label); err != nil {
		return fail(err)
	}
	if err := policy.ValidateAgent(req.Agent); err != nil {
		return fail(err)
	}
	if err := policy.ValidateRunID(req.RunID); err != nil {
		return fail(err)
	}
	size, err := policy.ResolveSize(scope, req.Size)
	if err != nil {
		return fail(err)
	}
	image, err := policy.ResolveImage(scope, req.Image)
	if err != nil {
		return fail(err)
	}
	if err := policy.ValidateEnv(req.Env, scope.Limits.MaxEnvEntries); err != nil {
		return fail(err)
	}
	domains, err := policy.CheckEgress(req.Egress, scope.EgressCeiling, scope.Limits.MaxEgressDomains)
	if err != nil {
		return fail(err)
	}
	lim := scope.Limits
	w := sandgate.Workspace{
		Label: req.Label, Size: size.Name, Image: image, Agent: req.Agent, RunID: req.RunID,
		State: sandgate.WorkspaceStarting, CreatedAt: now.Truncate(time.Second),
		ExpiresAt: now.Truncate(time.Second).Add(lim.MaxLifetime), IdleTimeout: lim.IdleTimeout,
	}
	return w, req.Env, domains, nil
}

// acquireHash is the canonical hash of an Acquire request: the fields as
// sent, with env values replaced by their hashes (spec §Idempotency).
func acquireHash(req protocol.AcquireRequest) string {
	env := make(map[string]string, len(req.Env))
	for k, v := range req.Env {
		env[k] = HashString(v)
	}
	canon := struct {
		Label, Size, Image, SnapshotID, Agent, RunID string
		Env                                          map[string]string
		Egress                                       []string
		EgressSet                                    bool
	}{req.Label, req.Size, req.Image, req.SnapshotID, req.Agent, req.RunID, env, nil, req.Egress != nil}
	if req.Egress != nil {
		canon.Egress = req.Egress.AllowedDomains
	}
	b, _ := json.Marshal(canon) // maps marshal with sorted keys
	return HashString(string(b))
}

// warmStart checks Acquire's snapshot_id: 404 for an id this instance does
// not own (or one still being created, which no client can know yet), 410
// once it is expired or deleted, and 410 for a snapshot held by another
// provider than the one the workspace would run on: a warm start restores
// only on the provider that stored it, and the client starts cold.
func (s *Saga) warmStart(ctx context.Context, in sandgate.Instance, id, provider string, now time.Time) (*sandgate.Snapshot, error) {
	if id == "" {
		return nil, nil
	}
	if !policy.ValidID(id) {
		// Not the path's id: as for an unknown snapshot, the client
		// falls back to a cold start (spec §Acquire, snapshot_id).
		return nil, errSnapshotNotFound()
	}
	snap, err := s.Snapshot(ctx, in, id)
	if err != nil {
		return nil, err
	}
	switch {
	case snap.State == sandgate.SnapshotCreating:
		return nil, errSnapshotNotFound()
	case !snap.UsableAt(now):
		return nil, protocol.E(protocol.SnapshotGone, "the snapshot expired or was deleted; start cold")
	case providerName(snap.Provider) != provider:
		return nil, protocol.E(protocol.SnapshotGone, "the snapshot is held by another provider than this instance's; start cold")
	}
	return &snap, nil
}

// fits reports whether snap can be restored into a workspace of size:
// the disk of the size it was taken in is not larger than size's. A
// restore that cannot fit would otherwise fail after the create, on every
// warm start, as a retryable provider error. A snapshot without a
// recorded size, or sizes without a disk quota, are not refused.
func fits(caps providers.Capabilities, snap sandgate.Snapshot, size sandgate.Size) bool {
	from, ok := caps.Size(snap.Size)
	return !ok || from.DiskMiB == 0 || size.DiskMiB == 0 || from.DiskMiB <= size.DiskMiB
}

// providerName is the name a record's provider field stands for.
func providerName(name string) string {
	if name == "" {
		return providers.LegacyName
	}
	return name
}
