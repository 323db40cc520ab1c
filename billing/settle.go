package billing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/store"
)

// Settle charges a terminated workspace once: it meters the whole seconds
// from the provider-confirmed start to the recorded end (rounded up; never
// past expires_at, which the provider enforces), cuts them into accrual
// periods (see [AccrualPeriod]) and, in one script idempotent by entry id,
// appends and charges every period's entry not already accrued, the last
// one final ("<ws>:final"), at the price it was admitted at, counts them
// against its budgets in their months and frees what is left of the hold.
// Whatever was accrued while it ran plus what settlement adds is exactly
// metered_seconds × price. A workspace with no price (no rate card, or
// admitted before billing) settles at 0 and still gets its entries. A
// workspace not yet terminated is left alone.
//
// It implements termination.Settler: every termination path ends in
// Terminator.Finish, which calls it.
func (b *Billing) Settle(ctx context.Context, w sandgate.Workspace) error {
	cur, err := b.db.Workspace(ctx, w.AccountID, w.ID)
	if errors.Is(err, store.ErrNotFound) {
		return nil // aborted before it ran (its hold is released by Release), or past retention
	}
	if err != nil {
		return fmt.Errorf("settle %s: %w", w.ID, err)
	}
	if cur.State != sandgate.WorkspaceTerminated {
		return nil
	}
	_, end := Metered(cur)
	es, err := b.entries(cur, periods(cur.ID, cur.StartedAt, end, time.Time{}))
	if err != nil {
		return fmt.Errorf("settle %s: %w", w.ID, err)
	}
	if _, err := b.charge(ctx, cur, es, true); err != nil {
		return fmt.Errorf("settle %s: %w", w.ID, err)
	}
	return nil
}

// FinishAndSettle records the provider-confirmed end at at of the
// terminating workspace w and settles it (as [Billing.Settle] would), in
// one script: store's finish_workspace transition ([store.FinishLua])
// followed by the charge, so that a release costs one round trip after
// the provider's terminate. w must be the record as it is now, read after
// its termination began (store.DB.BeginRelease answers it): its start,
// price and creation month decide the entries. When the record is no
// longer terminating (another process recorded the end first) nothing is
// charged by the script and it settles as Settle does, from the record.
// It returns the record as the script left it.
//
// It implements termination.FinishSettler.
func (b *Billing) FinishAndSettle(ctx context.Context, w sandgate.Workspace, at time.Time, eg store.Egress) (sandgate.Workspace, error) {
	fk, finish := b.db.FinishArgs(w, at, eg)
	cur := w
	cur.State, cur.TerminatedAt = sandgate.WorkspaceTerminated, time.UnixMilli(at.UnixMilli()).UTC()
	_, end := Metered(cur)
	es, err := b.entries(cur, periods(cur.ID, cur.StartedAt, end, time.Time{}))
	var keys []string
	var args []any
	if err == nil {
		keys, args, err = chargeBinding(cur, fk[0], es, "settle", finish...)
		keys = append(keys, fk[1]) // the live index, last
	}
	if err != nil { // not reached for a record admission priced; the plain path keeps the end
		if ferr := b.db.FinishTerminate(ctx, w, at, eg); ferr != nil {
			return w, ferr
		}
		return w, fmt.Errorf("settle %s: %w", w.ID, err)
	}
	res, err := finishSettleScript.Run(ctx, b.rdb, keys, args...).Slice()
	if err != nil {
		return w, fmt.Errorf("finish and settle %s: %w", w.ID, err)
	}
	if len(res) < 2 {
		return w, fmt.Errorf("finish and settle %s: unexpected script result %v", w.ID, res)
	}
	n, _ := res[0].(int64)
	queued, _ := res[1].(int64)
	if n < 0 {
		// Not terminating: settled from the record by whoever ended it,
		// or now (idempotent by entry id).
		if len(res) != 3 {
			return w, fmt.Errorf("finish and settle %s: unexpected script result %v", w.ID, res)
		}
		rec, err := store.DecodeWorkspace(res[2])
		if err != nil {
			return w, fmt.Errorf("finish and settle %s: %w", w.ID, err)
		}
		return rec, b.Settle(ctx, rec)
	}
	if queued == 1 {
		b.FlushAlerts(ctx, w.AccountID)
	}
	if n > 0 {
		b.countSettled(ctx, es, int(n))
	}
	// Finished: the record is w as the script's end left it.
	return store.Finished(w, at), nil
}

// finishSettleScript records a workspace's end and settles it: the
// finish_workspace transition of [store.FinishLua], then chargeLua in
// settle mode. KEYS as chargeScript's followed by one more, the last,
// the instance's live index; ARGV as chargeScript's with six more after
// ARGV[3], store.DB.FinishArgs's: ARGV[4] the workspace id, ARGV[5]
// terminated (unix ms), ARGV[6] the record's retention (ms), ARGV[7] the
// egress counter and ARGV[8] and ARGV[9] its bytes out and in, which the
// end adds as far as the record lacks them. Returns {appended,
// queued} once finished, or {-1, 0, record} when the record was
// not terminating (nothing changed); once finished the record is the
// caller's as finish_workspace changes it (store.Finished), so it is not
// answered.
var finishSettleScript = redis.NewScript(store.FinishLua + appendLua + budgetLua + "local off = 6\nlocal function charge()\n" + chargeLua + `end
if not finish_workspace(KEYS[8], KEYS[#KEYS], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]) then return {-1, 0, redis.call('HGETALL', KEYS[8])} end
return charge()
`)

// Metered is a terminated workspace's metered_seconds and the end they
// run to: the whole seconds from the provider-confirmed start to the
// recorded end, rounded up. The provider enforces expires_at
// (providers.CreateSpec), so a workspace recorded late stopped running
// there: the end is never past it, and the hold (price × lifetime) is a
// true worst case. The status's metered_seconds and the usage ledger both
// use it: the seconds of a workspace's usage entries add up to it.
func Metered(w sandgate.Workspace) (int64, time.Time) {
	end := w.TerminatedAt
	if !w.ExpiresAt.IsZero() && end.After(w.ExpiresAt) {
		end = w.ExpiresAt
	}
	return MeteredSeconds(w.StartedAt, end), end
}

// releaseHold frees a hold whose workspace record is gone; its budget
// counters are left as they are (the month and scopes died with the record).
func (b *Billing) releaseHold(ctx context.Context, acct, id string) error {
	return releaseScript.Run(ctx, b.rdb, []string{fundsKey(acct), holdsKey(acct), spendKey(acct, "none")}, id).Err()
}

// Release frees the hold of a workspace whose create failed before
// anything ran (the gateway's abort): no usage, no charge. It is a no-op
// for a workspace without a hold.
func (b *Billing) Release(ctx context.Context, w sandgate.Workspace) error {
	a := w.AccountID
	if err := releaseScript.Run(ctx, b.rdb, []string{fundsKey(a), holdsKey(a), spendKey(a, month(w.CreatedAt))},
		append([]any{w.ID}, anys(scopes(w.InstanceID, w.Agent))...)...).Err(); err != nil {
		return fmt.Errorf("release hold %s: %w", w.ID, err)
	}
	return nil
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// releaseScript frees a hold without charging.
//
// KEYS[1] funds HASH, KEYS[2] holds HASH, KEYS[3] spend HASH of the hold's month
// ARGV[1] workspace id, ARGV[2..] budget scopes
// Returns 1 released, 0 no hold.
var releaseScript = redis.NewScript(`
local hold = redis.call('HGET', KEYS[2], ARGV[1])
if not hold then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
local neg = string.format('%d', -tonumber(hold))
redis.call('HINCRBY', KEYS[1], 'holds', neg)
for i = 2, #ARGV do redis.call('HINCRBY', KEYS[3], ARGV[i] .. ':h', neg) end
return 1
`)
