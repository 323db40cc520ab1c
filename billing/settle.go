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
