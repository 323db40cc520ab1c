package billing

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNoEntry is returned for an adjustment of an entry not in the ledger.
var ErrNoEntry = errors.New("billing: no such usage ledger entry")

// AdjustUsage corrects an earlier usage entry by appending an adjustment: the
// ledger is never edited. AmountMicros is the correction (negative
// refunds); it moves settled and balance like a charge. The entry's id is
// "adj:" + a hash of the operator's idempotency key, so a retry appends
// nothing; it returns the entry and whether it was appended now.
func (b *Billing) AdjustUsage(ctx context.Context, acct, corrects, key string, amountMicros int64, at time.Time) (UsageEntry, bool, error) {
	if key == "" || amountMicros == 0 {
		return UsageEntry{}, false, fmt.Errorf("adjustment: an idempotency key and a non-zero amount are required")
	}
	var orig *UsageEntry
	err := b.ledger.Scan(ctx, acct, zeroTime, zeroTime, func(e UsageEntry) error {
		if e.ID == corrects {
			orig = &e
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return UsageEntry{}, false, err
	}
	if orig == nil {
		return UsageEntry{}, false, ErrNoEntry
	}
	sum := sha256.Sum256([]byte(acct + "\x00" + key))
	e := *orig
	e.ID, e.Kind, e.Final, e.Corrects = "adj:"+hex.EncodeToString(sum[:12]), KindAdjustment, true, orig.ID
	e.Seconds, e.AmountMicros, e.TerminatedAt = 0, amountMicros, at
	e = e.normalized()
	body, _ := json.Marshal(e)
	n, err := adjustUsageScript.Run(ctx, b.rdb, []string{fundsKey(acct), usageKey(acct), usageIDsKey(acct)},
		e.ID, string(body), e.TerminatedAt.UnixMilli(), amountMicros, -amountMicros).Int()
	if err != nil {
		return e, false, fmt.Errorf("adjustment: %w", err)
	}
	return e, n == 1, nil
}

var errStop = errors.New("stop")

// adjustUsageScript appends an adjustment and moves settled and balance by
// its amount, once per entry id.
//
// KEYS[1] funds HASH, KEYS[2] usage STREAM, KEYS[3] usage ids SET
// ARGV[1] entry id, ARGV[2] entry JSON, ARGV[3] terminated (unix ms),
// ARGV[4] amount, ARGV[5] −amount
// Returns 1 appended, 0 already there.
var adjustUsageScript = redis.NewScript(appendLua + `
if redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 1 then return 0 end
redis.call('HINCRBY', KEYS[1], 'settled', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'balance', ARGV[5])
return append_usage(KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3])
`)
