package stripesync

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/billing"
)

// ErrLeased is returned by [Syncer.SyncOnce] when another gateway holds
// the account's lease now: that gateway is syncing it.
var ErrLeased = errors.New("stripesync: another gateway is syncing this account")

// ErrLeaseLost is returned when the lease ran out during a round (the
// gateway stalled past LeaseTTL): the round stops without moving the cursor.
var ErrLeaseLost = errors.New("stripesync: lease lost during the round")

// Syncer sends the settled usage of every opted-in account to Stripe
// Billing as meter events. It is safe for concurrent use, and any number
// of gateways may run one over the same Redis: a lease per account keeps
// one sender per account at a time.
//
// Metrics (no account label): sandgate.stripesync.events, a counter with
// attribute outcome = sent | skipped | failed | dead_lettered (failed
// counts every failed attempt); sandgate.stripesync.lag, a gauge of the
// seconds since the oldest waiting entry's terminated_at, the largest
// over the accounts of one pass of Run.
type Syncer struct {
	cfg  Config
	deps Deps
	rdb  redis.UniversalClient
	// ledger reads billing's usage ledger by stream position.
	ledger *billing.Ledger
	snd    *sender
	owner  string
	m      metrics
	// afterSend, when set (tests only), runs after a send succeeded and
	// before the cursor moves; its error ends the round as a crash would.
	afterSend func(entryID string) error
}

// New returns a Syncer. It reads the secret key from the environment
// variable cfg.SecretKeyEnv and fails if it is empty; its error names the
// variable, never the value.
func New(cfg Config, deps Deps) (*Syncer, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Redis == nil {
		return nil, errors.New("stripesync: a redis client is required")
	}
	deps.setDefaults()
	key := sandgate.Secret(deps.Getenv(cfg.SecretKeyEnv))
	if key.Reveal() == "" {
		return nil, fmt.Errorf("stripesync: the stripe secret key is not set (env %s)", cfg.SecretKeyEnv)
	}
	hc := deps.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	owner := deps.Owner
	if owner == "" {
		b := make([]byte, 12)
		_, _ = rand.Read(b)
		owner = hex.EncodeToString(b)
	}
	m, err := newMetrics(deps.Meter)
	if err != nil {
		return nil, err
	}
	return &Syncer{cfg: cfg, deps: deps, rdb: deps.Redis, ledger: billing.NewLedger(deps.Redis), snd: newSender(cfg.BaseURL, key, hc, cfg.RequestTimeout), owner: owner, m: m}, nil
}

// Result is what one round of one account did.
type Result struct {
	Sent, Skipped, DeadLettered int
	// More is true when the round stopped at BatchSize with entries left.
	More bool
	// Lag is the time since the terminated_at of the next entry waiting
	// after the round (by ledger order); 0 when none waits.
	Lag time.Duration
}

// Run syncs every opted-in account, one round each, then waits Interval,
// until ctx ends; it then returns nil. An account another gateway holds is
// skipped; a failing account is logged and retried next pass. Run may be
// called on every gateway at once.
func (s *Syncer) Run(ctx context.Context) error {
	for {
		s.pass(ctx)
		if err := s.deps.Sleep(ctx, s.cfg.Interval); err != nil {
			return nil
		}
	}
}

// maxBatches bounds the rounds one account gets in one pass of Run.
const maxBatches = 10

// pass is one round of every opted-in account.
func (s *Syncer) pass(ctx context.Context) {
	accts, err := s.rdb.SMembers(ctx, accountsKey()).Result()
	if err != nil {
		if ctx.Err() == nil {
			s.deps.Logger.Error("stripe sync: list accounts", sandgate.KeyError, err)
		}
		return
	}
	var lag time.Duration
	for _, acct := range accts {
		if ctx.Err() != nil {
			return
		}
		// A backlog gets up to maxBatches batches a pass, so one account
		// cannot hold a gateway's pass for long.
		for i := 1; ; i++ {
			r, err := s.SyncOnce(ctx, acct)
			lag = max(lag, r.Lag)
			switch {
			case err == nil && r.More && i < maxBatches:
				continue
			case err == nil, errors.Is(err, ErrLeased), errors.Is(err, ErrNotConfigured), ctx.Err() != nil:
			default:
				s.deps.Logger.Error("stripe sync failed", sandgate.KeyAccountID, acct, sandgate.KeyError, err)
			}
			break
		}
	}
	s.m.lag(ctx, lag)
}

// SyncOnce runs one round for acct: it takes the account's lease, sends
// the dead letters an operator requeued, then up to BatchSize ledger
// entries after the cursor, in ledger order, moving the cursor past each
// as it is done with. It returns ErrNotConfigured for an account without
// settings, ErrLeased when another gateway holds the account, and the
// send's *SendError when Stripe refused or failed and the round stopped
// at that entry.
func (s *Syncer) SyncOnce(ctx context.Context, acct string) (Result, error) {
	a, err := s.Account(ctx, acct)
	if err != nil {
		return Result{}, err
	}
	ok, err := s.rdb.SetNX(ctx, leaseKey(acct), s.owner, s.cfg.LeaseTTL).Result()
	if err != nil {
		return Result{}, fmt.Errorf("stripesync: lease %s: %w", acct, err)
	}
	if !ok {
		return Result{}, ErrLeased
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = releaseScript.Run(rctx, s.rdb, []string{leaseKey(acct)}, s.owner).Err()
	}()
	r := &round{s: s, acct: acct, a: a}
	err = r.requeued(ctx)
	if err == nil {
		err = r.ledger(ctx)
	}
	r.res.Lag = s.lag(ctx, acct)
	return r.res, err
}

// round is one SyncOnce of one account, holding its lease.
type round struct {
	s    *Syncer
	acct string
	a    Account
	res  Result
}

// record is one ledger entry with its stream id. bad says why an entry
// cannot be read (it is dead-lettered rather than block the account).
type record struct {
	streamID string
	e        billing.UsageEntry
	bad      string
}

// readAfter returns up to n ledger entries after the stream id cursor
// ("" for the start).
func (s *Syncer) readAfter(ctx context.Context, acct, cursor string, n int) ([]record, error) {
	ps, err := s.ledger.ScanAfter(ctx, acct, cursor, n)
	if err != nil {
		return nil, fmt.Errorf("stripesync: read usage ledger: %w", err)
	}
	out := make([]record, 0, len(ps))
	for _, p := range ps {
		out = append(out, toRecord(p))
	}
	return out, nil
}

// toRecord turns a positioned entry into a record; an entry that does not
// decode is marked bad, under the id "stream:<stream id>".
func toRecord(p billing.Positioned) record {
	rec := record{streamID: p.StreamID, e: p.Entry}
	if p.Err != nil {
		rec.e = billing.UsageEntry{ID: "stream:" + p.StreamID}
		rec.bad = "usage ledger entry does not decode"
	}
	return rec
}

// plan says what to do with one entry: send value, skip it (nothing to
// count, or filed before Since), or dead-letter it at once (reason).
func (r *round) plan(rec record) (value int64, skip bool, reason string) {
	e := rec.e
	if rec.bad != "" {
		return 0, false, rec.bad
	}
	if !r.a.Since.IsZero() && e.TerminatedAt.Before(r.a.Since) {
		return 0, true, ""
	}
	switch r.a.Unit {
	case UnitMicros:
		value = e.AmountMicros
	default:
		if e.Kind == billing.KindAdjustment {
			return 0, true, "" // an adjustment moves money, not seconds
		}
		value = e.Seconds
	}
	switch {
	case value == 0:
		return 0, true, ""
	case value < 0:
		return value, false, "negative value: a meter event cannot refund; credit it in Stripe"
	}
	return value, false, ""
}

// timestamp is when the entry's usage happened, inside its hour: an
// interim or final entry's period start (a period never crosses a whole
// UTC hour), or terminated_at for an adjustment (when it was made) and
// for a workspace that never started.
func timestamp(e billing.UsageEntry) time.Time {
	if e.Kind == billing.KindUsage && !e.StartedAt.IsZero() {
		return e.StartedAt
	}
	return e.TerminatedAt
}

func (r *round) event(e billing.UsageEntry, value int64) event {
	return event{
		identifier: Identifier(r.acct, e.ID),
		eventName:  r.a.EventName,
		customer:   r.a.Customer,
		value:      value,
		timestamp:  timestamp(e),
	}
}

// ledger sends the entries after the cursor, up to BatchSize.
func (r *round) ledger(ctx context.Context) error {
	s := r.s
	cursor, err := s.rdb.Get(ctx, cursorKey(r.acct)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("stripesync: cursor: %w", err)
	}
	recs, err := s.readAfter(ctx, r.acct, cursor, s.cfg.BatchSize)
	if err != nil {
		return err
	}
	r.res.More = len(recs) == s.cfg.BatchSize
	for _, rec := range recs {
		if err := ctx.Err(); err != nil {
			r.res.More = false
			return err
		}
		value, skip, reason := r.plan(rec)
		if skip {
			if err := r.advance(ctx, rec, "skipped", nil); err != nil {
				return err
			}
			r.res.Skipped++
			s.m.count(ctx, "skipped", 1)
			continue
		}
		if reason != "" {
			dl := r.deadLetter(rec, notSendable(reason), 0)
			if err := r.advance(ctx, rec, "dead", &dl); err != nil {
				return err
			}
			r.res.DeadLettered++
			s.m.count(ctx, "dead_lettered", 1)
			continue
		}
		serr, err := r.sendRetrying(ctx, r.event(rec.e, value))
		if err != nil {
			return err
		}
		if serr == nil {
			if s.afterSend != nil {
				if err := s.afterSend(rec.e.ID); err != nil {
					return err
				}
			}
			if err := r.advance(ctx, rec, "sent", nil); err != nil {
				return err
			}
			r.res.Sent++
			continue
		}
		r.res.More = false
		if serr.Retryable() || serr.accountWide() {
			return serr
		}
		rounds, err := r.fail(ctx, serr, rec.e.ID)
		if err != nil {
			return err
		}
		if rounds < s.cfg.DeadAfter {
			return serr
		}
		dl := r.deadLetter(rec, serr, rounds)
		if err := r.advance(ctx, rec, "dead", &dl); err != nil {
			return err
		}
		r.res.DeadLettered++
		s.m.count(ctx, "dead_lettered", 1)
		s.deps.Logger.Warn("stripe sync: entry dead-lettered", sandgate.KeyAccountID, r.acct, "entry_id", rec.e.ID, sandgate.KeyStatus, serr.Status)
		return serr
	}
	return nil
}

// sendRetrying sends ev, retrying a 429, 5xx or network failure up to
// MaxAttempts times with exponential backoff (or the Retry-After, when
// longer). It returns the last *SendError when the send failed for good
// in this round, or err when the round must stop for another reason
// (ctx, lease lost). Every failure is recorded in the state.
func (r *round) sendRetrying(ctx context.Context, ev event) (*SendError, error) {
	s := r.s
	for attempt := 1; ; attempt++ {
		serr := s.snd.send(ctx, ev)
		if serr == nil {
			s.m.count(ctx, "sent", 1)
			return nil, nil
		}
		var se *SendError
		if !errors.As(serr, &se) {
			se = &SendError{Message: "send failed"}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		s.m.count(ctx, "failed", 1)
		if !se.Retryable() || attempt >= s.cfg.MaxAttempts || se.RetryAfter > s.cfg.MaxRetryAfter {
			if se.Retryable() || se.accountWide() {
				if _, err := r.fail(ctx, se, ""); err != nil {
					return nil, err
				}
			}
			return se, nil
		}
		if _, err := r.fail(ctx, se, ""); err != nil {
			return nil, err
		}
		wait := s.backoff(attempt, se.RetryAfter)
		held, err := renewScript.Run(ctx, s.rdb, []string{leaseKey(r.acct)}, s.owner, (wait + s.cfg.LeaseTTL).Milliseconds()).Int()
		if err != nil {
			return nil, fmt.Errorf("stripesync: renew lease: %w", err)
		}
		if held != 1 {
			return nil, ErrLeaseLost
		}
		if err := s.deps.Sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// backoff is the wait after the attempt-th failure: BaseBackoff doubled
// per attempt up to MaxBackoff, or retryAfter when longer.
func (s *Syncer) backoff(attempt int, retryAfter time.Duration) time.Duration {
	d := s.cfg.BaseBackoff
	for i := 1; i < attempt && d < s.cfg.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, s.cfg.MaxBackoff)
	return max(d, retryAfter)
}

// fail records a failure in the state. With entryID, the failure is that
// entry's (a 4xx), and fail returns how many rounds it has failed.
func (r *round) fail(ctx context.Context, se *SendError, entryID string) (int, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	n, err := failScript.Run(ctx, r.s.rdb, []string{stateKey(r.acct)},
		se.Error(), r.s.deps.Clock.Now().UnixMilli(), 1, entryID).Int()
	if err != nil {
		return 0, fmt.Errorf("stripesync: record failure: %w", err)
	}
	return n, nil
}

// advance moves the cursor past rec. It runs even when ctx has just been
// cancelled: a send Stripe accepted must move the cursor, or a restart
// would send the entry again.
func (r *round) advance(ctx context.Context, rec record, outcome string, dl *DeadLetter) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var id, js string
	if dl != nil {
		b, _ := json.Marshal(dl)
		id, js = rec.e.ID, string(b)
	}
	n, err := advanceScript.Run(ctx, r.s.rdb,
		[]string{leaseKey(r.acct), cursorKey(r.acct), stateKey(r.acct), deadKey(r.acct)},
		r.s.owner, rec.streamID, r.s.cfg.LeaseTTL.Milliseconds(), outcome, r.s.deps.Clock.Now().UnixMilli(), id, js).Int()
	if err != nil {
		return fmt.Errorf("stripesync: advance cursor: %w", err)
	}
	if n != 1 {
		return ErrLeaseLost
	}
	return nil
}

func (r *round) deadLetter(rec record, se *SendError, rounds int) DeadLetter {
	return DeadLetter{
		EntryID:    rec.e.ID,
		StreamID:   rec.streamID,
		Identifier: Identifier(r.acct, rec.e.ID),
		Status:     se.Status,
		Error:      se.Error(),
		Attempts:   rounds,
		At:         r.s.deps.Clock.Now(),
	}
}

// requeued sends the dead letters an operator requeued with Retry. Each
// is tried once per round; a non-retryable failure puts it back on the
// dead list with its new error.
func (r *round) requeued(ctx context.Context) error {
	s := r.s
	m, err := s.rdb.HGetAll(ctx, retryKey(r.acct)).Result()
	if err != nil {
		return fmt.Errorf("stripesync: requeued: %w", err)
	}
	for id, js := range m {
		if err := ctx.Err(); err != nil {
			return err
		}
		var dl DeadLetter
		if err := json.Unmarshal([]byte(js), &dl); err != nil {
			return fmt.Errorf("stripesync: requeued %s: %w", id, err)
		}
		p, found, err := s.ledger.At(ctx, r.acct, dl.StreamID)
		if err != nil {
			return fmt.Errorf("stripesync: requeued %s: %w", id, err)
		}
		rec := record{streamID: dl.StreamID, e: billing.UsageEntry{ID: id}, bad: "usage ledger entry is gone"}
		if found {
			rec = toRecord(p)
		}
		value, skip, reason := r.plan(rec)
		var serr *SendError
		switch {
		case skip:
			value = 0
		case reason != "":
			serr = notSendable(reason)
		default:
			if serr, err = r.sendRetrying(ctx, r.event(rec.e, value)); err != nil {
				return err
			}
			if serr != nil && !serr.Retryable() && !serr.accountWide() {
				if _, err := r.fail(ctx, serr, ""); err != nil {
					return err
				}
			}
		}
		if serr != nil && (serr.Retryable() || serr.accountWide()) {
			return serr
		}
		outcome, body := "sent", ""
		if skip {
			outcome = "skipped"
		}
		if serr != nil {
			outcome = "dead"
			ndl := r.deadLetter(rec, serr, dl.Attempts+1)
			b, _ := json.Marshal(ndl)
			body = string(b)
		}
		n, err := requeuedScript.Run(context.WithoutCancel(ctx), s.rdb,
			[]string{leaseKey(r.acct), retryKey(r.acct), deadKey(r.acct), stateKey(r.acct)},
			s.owner, id, outcome, body, s.deps.Clock.Now().UnixMilli()).Int()
		if err != nil {
			return fmt.Errorf("stripesync: requeued %s: %w", id, err)
		}
		if n != 1 {
			return ErrLeaseLost
		}
		if serr != nil {
			r.res.DeadLettered++
			s.m.count(ctx, "dead_lettered", 1)
		} else if value != 0 {
			r.res.Sent++
		}
	}
	return nil
}

// lag is the time since the terminated_at of the next entry waiting after
// acct's cursor; 0 when none.
func (s *Syncer) lag(ctx context.Context, acct string) time.Duration {
	cursor, err := s.rdb.Get(ctx, cursorKey(acct)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0
	}
	recs, err := s.readAfter(ctx, acct, cursor, 1)
	if err != nil || len(recs) == 0 {
		return 0
	}
	return max(0, s.deps.Clock.Now().Sub(recs[0].e.TerminatedAt))
}
