package billing

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNoEntry is returned for an adjustment of an entry not in the ledger.
var ErrNoEntry = errors.New("billing: no such usage ledger entry")

// ErrAdjustmentConflict is returned when an idempotency key was used for
// an adjustment of another entry or amount.
var ErrAdjustmentConflict = errors.New("billing: this idempotency key was used for a different adjustment")

// UsageAdjustment is an operator's correction of a usage ledger entry.
type UsageAdjustment struct {
	Corrects     string    // the id of the entry it corrects
	Key          string    // the operator's idempotency key
	AmountMicros int64     // the correction: negative refunds; never 0
	Reason       string    // why: required, kept on the entry, its export rows and statements
	Actor        string    // who: the audit log's actor (name:prefix)
	At           time.Time // files the adjustment under this time
}

// AdjustUsage corrects an earlier usage entry by appending an adjustment: the
// ledger is never edited. AmountMicros is the correction (negative
// refunds); it moves settled and balance like a charge. The entry's id is
// "adj:" + a hash of the operator's idempotency key, so a retry appends
// nothing; it returns the entry and whether it was appended now. A retry
// returns the entry stored first, and ErrAdjustmentConflict when the key
// was used to correct another entry or by another amount.
func (b *Billing) AdjustUsage(ctx context.Context, acct string, a UsageAdjustment) (UsageEntry, bool, error) {
	if a.Key == "" || a.AmountMicros == 0 {
		return UsageEntry{}, false, fmt.Errorf("adjustment: an idempotency key and a non-zero amount are required")
	}
	if strings.TrimSpace(a.Reason) == "" {
		return UsageEntry{}, false, fmt.Errorf("adjustment: a reason is required: it goes on the ledger entry, the exports and the statement")
	}
	corrects, key, amountMicros, at := a.Corrects, a.Key, a.AmountMicros, a.At
	orig, err := b.ledgerEntry(ctx, acct, corrects)
	if err != nil {
		return UsageEntry{}, false, err
	}
	sum := sha256.Sum256([]byte(acct + "\x00" + key))
	e := orig
	e.ID, e.Kind, e.Final, e.Corrects = "adj:"+hex.EncodeToString(sum[:12]), KindAdjustment, true, orig.ID
	e.Seconds, e.AmountMicros, e.TerminatedAt = 0, amountMicros, at
	e.Reason, e.Actor = a.Reason, a.Actor
	// Egress bytes belong to the final entry alone: an adjustment moves
	// money, and a copy would count the workspace's traffic twice.
	e.EgressBytesOut, e.EgressBytesIn = 0, 0
	e = e.normalized()
	body, _ := json.Marshal(e)
	n, err := adjustUsageScript.Run(ctx, b.rdb, []string{fundsKey(acct), usageKey(acct), usageIDsKey(acct)},
		e.ID, string(body), e.TerminatedAt.UnixMilli(), amountMicros, -amountMicros).Int()
	if err != nil {
		return e, false, fmt.Errorf("adjustment: %w", overflowed(err))
	}
	if n == 1 {
		return e, true, nil
	}
	prev, err := b.ledgerEntry(ctx, acct, e.ID)
	if err != nil {
		return UsageEntry{}, false, fmt.Errorf("adjustment: read the one stored under this key: %w", err)
	}
	if prev.Corrects != e.Corrects || prev.AmountMicros != e.AmountMicros {
		return prev, false, ErrAdjustmentConflict
	}
	return prev, false, nil
}

// ledgerEntry finds the account's usage entry id; ErrNoEntry when none.
func (b *Billing) ledgerEntry(ctx context.Context, acct, id string) (UsageEntry, error) {
	var found *UsageEntry
	err := b.ledger.Scan(ctx, acct, zeroTime, zeroTime, func(e UsageEntry) error {
		if e.ID == id {
			found = &e
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return UsageEntry{}, err
	}
	if found == nil {
		return UsageEntry{}, ErrNoEntry
	}
	return *found, nil
}

var errStop = errors.New("stop")

// adjustUsageScript appends an adjustment and moves settled and balance by
// its amount, once per entry id.
//
// KEYS[1] funds HASH, KEYS[2] usage STREAM, KEYS[3] usage ids SET
// ARGV[1] entry id, ARGV[2] entry JSON, ARGV[3] terminated (unix ms),
// ARGV[4] amount, ARGV[5] −amount
// Returns 1 appended, 0 already there; an error reply, with nothing
// written, when a counter would overflow.
var adjustUsageScript = redis.NewScript(appendLua + add2Lua + `
if redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 1 then return 0 end
local err = add2(KEYS[1], 'settled', ARGV[4], ARGV[5], 'balance', ARGV[5])
if err then return err end
return append_usage(KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3])
`)
