// Package saga is the service floor between the HTTP rooms and the
// state: every v1 operation that changes state or calls a provider runs
// here, with its compensating steps: acquire (admit → create → restore →
// confirm), release, exec, file reads and writes, a snapshot's create and
// delete, and a durable command's launch, status and cancel. The
// gateway, the operator API and tests all call it; it speaks domain types
// and protocol errors, never HTTP.
package saga

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/internal/running"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
)

// Config configures a Saga. A zero field means the default noted beside it.
type Config struct {
	// CreateTimeout bounds one provider create. 0 means 90 seconds; it
	// must stay below the store's PendingTimeout.
	CreateTimeout time.Duration
	// SnapshotTimeout bounds one provider snapshot, and a warm start's
	// restore. 0 means 10 minutes.
	SnapshotTimeout time.Duration
	// TerminateTimeout bounds one provider call that cleans up (a
	// snapshot's contents deleted at once). 0 means 30 seconds.
	TerminateTimeout time.Duration
	// DispatchTimeout bounds the launch of a durable command. A command
	// whose launch was not confirmed within it (a gateway died) is fenced
	// and reads as canceled. 0 means 1 minute.
	DispatchTimeout time.Duration
	// AfterCreate, when set, is called by Acquire right after the
	// provider created the sandbox and before the record is confirmed.
	// Test only: it lets a test stop a gateway at that point.
	AfterCreate func(workspaceID string)
}

// Admitter decides whether an Acquire may run: nil to admit, a
// *admission.Replay for a claimed key, or a *protocol.Error refusal.
type Admitter interface {
	Admit(ctx context.Context, r *admission.Request) error
}

// Holds gives back what admission reserved (package billing).
type Holds interface {
	// Release frees a workspace's hold uncharged: nothing ran.
	Release(ctx context.Context, w sandgate.Workspace) error
	// FlushAlerts writes the budget alerts an admission queued.
	FlushAlerts(ctx context.Context, acct string)
}

// Deps are what a Saga works with; every one is required.
type Deps struct {
	DB         *store.DB
	Providers  *providers.Set
	Admission  Admitter
	Holds      Holds
	Terminator *termination.Terminator
	// Limiter counts a workspace route's request against its lease's
	// rate limit in the workspace read's round trip (Load, Usable, Exec).
	// nil counts nothing.
	Limiter *admission.Limiter
	Clock   sandgate.Clock
	Log     *slog.Logger // nil discards
}

// Saga runs the multi-step operations. It is safe for concurrent use.
type Saga struct {
	cfg     Config
	db      *store.DB
	provs   *providers.Set
	admit   Admitter
	holds   Holds
	term    *termination.Terminator
	limiter *admission.Limiter
	clock   sandgate.Clock
	log     *slog.Logger
	// bg counts the work a request leaves to run after it (an expired
	// workspace's end), which calls the providers too.
	bg running.Group
}

// New returns a Saga. A missing dependency is an error: each one guards
// money, slots or sandboxes.
func New(cfg Config, d Deps) (*Saga, error) {
	switch {
	case d.DB == nil:
		return nil, errors.New("saga: no store")
	case d.Providers == nil:
		return nil, errors.New("saga: no providers")
	case d.Admission == nil:
		return nil, errors.New("saga: no admission pipeline")
	case d.Holds == nil:
		return nil, errors.New("saga: no billing (holds)")
	case d.Terminator == nil:
		return nil, errors.New("saga: no terminator")
	case d.Clock == nil:
		return nil, errors.New("saga: no clock")
	}
	if cfg.CreateTimeout == 0 {
		cfg.CreateTimeout = 90 * time.Second
	}
	if cfg.SnapshotTimeout == 0 {
		cfg.SnapshotTimeout = 10 * time.Minute
	}
	if cfg.TerminateTimeout == 0 {
		cfg.TerminateTimeout = 30 * time.Second
	}
	if cfg.DispatchTimeout == 0 {
		cfg.DispatchTimeout = time.Minute
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	return &Saga{cfg: cfg, db: d.DB, provs: d.Providers, admit: d.Admission, holds: d.Holds, term: d.Terminator, limiter: d.Limiter, clock: d.Clock, log: d.Log}, nil
}

// Wait waits until the work requests left to run in the background has
// returned, or ctx ends; it returns how many were still running then. The
// broker calls it before it closes the providers.
func (s *Saga) Wait(ctx context.Context) int { return s.bg.Wait(ctx) }

// DispatchTimeout is the bound of a durable command's launch.
func (s *Saga) DispatchTimeout() time.Duration { return s.cfg.DispatchTimeout }

// Scope is an instance's scope as it applies now: defaults filled from
// the limits' and from the instance's provider's capabilities (every size
// it runs when the scope names none, its default image), and limits
// clamped to what the provider honours (Capabilities.ClampLimits).
func (s *Saga) Scope(in sandgate.Instance) (sandgate.Scope, *providers.Entry, error) {
	e, err := s.provs.ForInstance(in.Provider)
	if err != nil {
		return sandgate.Scope{}, nil, err
	}
	caps := e.Provider.Capabilities()
	scope := caps.Effective(in.Scope)
	scope.Limits = caps.ClampLimits(scope.Limits.WithDefaults())
	return scope, e, nil
}

// ProviderOf returns the provider a record names (a workspace's or a
// snapshot's), whether or not it accepts new work. One no longer
// configured is 403 paused with reason provider_closed, as for a new
// acquire: a refusal before anything ran must be a 4xx, since the client
// reports a 5xx exec as one that may have run, and restoring the
// provider's config is the operator's decision.
func (s *Saga) ProviderOf(name string) (providers.Provider, error) {
	e, err := s.provs.Get(name)
	if err != nil {
		return nil, &protocol.Error{Code: protocol.Paused, Reason: ReasonProviderClosed,
			Message: "the provider this resource lives on is not configured on this broker; ask its operator", Err: err}
	}
	return e.Provider, nil
}

// requestIDKey is the context key of the request id WithRequestID sets.
type requestIDKey struct{}

// WithRequestID returns ctx carrying the id of the request it serves, for
// the Saga's log lines about that request.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// requestAttr is the log attribute of ctx's request id ("" when none).
func requestAttr(ctx context.Context) slog.Attr {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return slog.String(sandgate.KeyRequestID, id)
}

// HashString is the hex SHA-256 of s: how keys and requests are compared.
func HashString(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// Unavailable is the refusal for a store failure outside admission.
func Unavailable(err error) error {
	return &protocol.Error{Code: protocol.Unavailable, Message: "the broker cannot reach its store; retry shortly", RetryAfter: time.Second, Err: err}
}

// admissionUnavailable is admission's fail-closed refusal, for a store
// failure on an Acquire's way to the admission script.
func admissionUnavailable(err error) error {
	return &protocol.Error{Code: protocol.AdmissionUnavailable, Message: "the broker cannot evaluate admission; retry shortly", RetryAfter: time.Second, Err: err}
}

// replayed answers a replay from its key's record: a conflict for another
// request, in progress while the original runs, nil once it is done.
func replayed(rec store.IdemRecord, reqHash string) error {
	if rec.Hash != reqHash {
		return protocol.E(protocol.IdempotencyConflict, "this Idempotency-Key was used with a different request")
	}
	if rec.State != store.IdemDone {
		return &protocol.Error{Code: protocol.IdempotencyInProgress,
			Message: "the original request with this Idempotency-Key is still running", RetryAfter: time.Second}
	}
	return nil
}
