package billing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/store"
)

// Settle charges a terminated workspace once: it meters the whole seconds
// from the provider-confirmed start to the recorded end (rounded up; never
// past expires_at, which the provider enforces), and
// in one script, idempotent by workspace id, frees the workspace's hold,
// charges the amount at the price it was admitted at, counts it against
// its budgets and appends its usage entry. A workspace with no price (no
// rate card, or admitted before billing) settles at 0 and still gets its
// entry. A workspace not yet terminated is left alone.
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
	e, err := b.entry(cur)
	if err != nil {
		return fmt.Errorf("settle %s: %w", w.ID, err)
	}
	body, _ := json.Marshal(e)
	a, tm := cur.AccountID, month(cur.TerminatedAt)
	keys := []string{fundsKey(a), holdsKey(a), usageKey(a), usageIDsKey(a),
		spendKey(a, month(cur.CreatedAt)), spendKey(a, tm), budgetsKey(a), alertedKey(a, tm), alertsKey(a)}
	args := []any{cur.ID, e.ID, string(body), e.TerminatedAt.UnixMilli(), e.AmountMicros, tm, -e.AmountMicros}
	for _, s := range scopes(cur.InstanceID, cur.Agent) {
		args = append(args, s)
	}
	if err := settleScript.Run(ctx, b.rdb, keys, args...).Err(); err != nil {
		return fmt.Errorf("settle %s: %w", w.ID, err)
	}
	b.FlushAlerts(ctx, a)
	return nil
}

// Metered is a terminated workspace's metered_seconds and the end they
// run to: the whole seconds from the provider-confirmed start to the
// recorded end, rounded up. The provider enforces expires_at
// (providers.CreateSpec), so a workspace recorded late stopped running
// there: the end is never past it, and the hold (price × lifetime) is a
// true worst case. The status's metered_seconds and the usage ledger both
// use it.
func Metered(w sandgate.Workspace) (int64, time.Time) {
	end := w.TerminatedAt
	if !w.ExpiresAt.IsZero() && end.After(w.ExpiresAt) {
		end = w.ExpiresAt
	}
	return MeteredSeconds(w.StartedAt, end), end
}

func (b *Billing) entry(w sandgate.Workspace) (UsageEntry, error) {
	secs, end := Metered(w)
	amt, err := Amount(w.Price.UnitMicros, secs)
	if err != nil {
		return UsageEntry{}, err
	}
	cur := w.Price.Currency
	if cur == "" {
		cur = NoCurrency
	}
	return UsageEntry{
		ID: FinalID(w.ID), Kind: KindUsage, Final: true,
		AccountID: w.AccountID, InstanceID: w.InstanceID, WorkspaceID: w.ID,
		Agent: w.Agent, RunID: w.RunID, Size: w.Size, Image: w.Image, Provider: b.cfg.Provider,
		RateCard: w.Price.RateCard, RateCardVersion: w.Price.RateCardVersion, Currency: cur,
		UnitPriceMicros: w.Price.UnitMicros, Seconds: secs, AmountMicros: amt,
		StartedAt: w.StartedAt, EndedAt: end, TerminatedAt: w.TerminatedAt,
		TerminationReason: string(w.TerminationReason),
	}.normalized(), nil
}

// settleScript settles one workspace, once.
//
// KEYS[1] funds HASH, KEYS[2] holds HASH, KEYS[3] usage STREAM, KEYS[4]
// usage ids SET, KEYS[5] spend HASH of the hold's month, KEYS[6] spend HASH
// of the termination's month, KEYS[7] budgets HASH, KEYS[8] alerted SET
// (termination month), KEYS[9] alerts LIST
// ARGV[1] workspace id, ARGV[2] entry id, ARGV[3] entry JSON, ARGV[4]
// terminated (unix ms), ARGV[5] amount (micros), ARGV[6] termination month,
// ARGV[7] −amount, ARGV[8..] budget scopes
// Returns 1 settled, 0 already settled.
var settleScript = redis.NewScript(appendLua + budgetLua + `
if redis.call('SISMEMBER', KEYS[4], ARGV[2]) == 1 then return 0 end
local hold = redis.call('HGET', KEYS[2], ARGV[1])
local neghold
if hold then
  neghold = string.format('%d', -tonumber(hold))
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('HINCRBY', KEYS[1], 'holds', neghold)
end
redis.call('HINCRBY', KEYS[1], 'settled', ARGV[5])
redis.call('HINCRBY', KEYS[1], 'balance', ARGV[7])
for i = 8, #ARGV do
  if hold then redis.call('HINCRBY', KEYS[5], ARGV[i] .. ':h', neghold) end
  redis.call('HINCRBY', KEYS[6], ARGV[i] .. ':s', ARGV[5])
  budget_alerts(KEYS[7], KEYS[6], KEYS[8], KEYS[9], ARGV[i], ARGV[6], ARGV[4])
end
redis.call('PEXPIRE', KEYS[6], ` + spendTTL + `)
append_usage(KEYS[3], KEYS[4], ARGV[2], ARGV[3], ARGV[4])
return 1
`)

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
