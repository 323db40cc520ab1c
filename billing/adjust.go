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

// ErrRefundExceedsEntry is returned for a refund larger than what the entry
// it corrects still charges, its earlier adjustments counted.
var ErrRefundExceedsEntry = errors.New("billing: the refund is larger than what the entry still charges")

// adjustTries bounds how often AdjustUsage reads the ledger again when
// another adjustment of the account lands between its read and its write.
const adjustTries = 5

// AdjustUsage corrects an earlier usage entry by appending an adjustment: the
// ledger is never edited. AmountMicros is the correction (negative
// refunds); it moves settled and balance like a charge. A refund may take
// back at most what the entry still charges: its amount and every
// adjustment of it (or of one of its adjustments) so far
// (ErrRefundExceedsEntry). The entry's id is "adj:" + a hash of the
// operator's idempotency key, so a retry appends nothing; it returns the
// entry and whether it was appended now. A retry returns the entry stored
// first, and ErrAdjustmentConflict when the key was used to correct
// another entry or by another amount.
func (b *Billing) AdjustUsage(ctx context.Context, acct string, a UsageAdjustment) (UsageEntry, bool, error) {
	if a.Key == "" || a.AmountMicros == 0 {
		return UsageEntry{}, false, fmt.Errorf("adjustment: an idempotency key and a non-zero amount are required")
	}
	if strings.TrimSpace(a.Reason) == "" {
		return UsageEntry{}, false, fmt.Errorf("adjustment: a reason is required: it goes on the ledger entry, the exports and the statement")
	}
	sum := sha256.Sum256([]byte(acct + "\x00" + a.Key))
	id := "adj:" + hex.EncodeToString(sum[:12])
	for range adjustTries {
		// The sequence is read before the ledger: an adjustment appended
		// after this read changes it, and the script then refuses to write.
		seq, err := b.rdb.Get(ctx, adjustSeqKey(acct)).Result()
		if errors.Is(err, redis.Nil) {
			seq, err = "0", nil
		}
		if err != nil {
			return UsageEntry{}, false, fmt.Errorf("adjustment: %w", err)
		}
		t, err := b.adjustTarget(ctx, acct, a.Corrects, id)
		if err != nil {
			return UsageEntry{}, false, err
		}
		if t.prev != nil {
			if t.prev.Corrects != a.Corrects || t.prev.AmountMicros != a.AmountMicros {
				return *t.prev, false, ErrAdjustmentConflict
			}
			return *t.prev, false, nil
		}
		after, ok := add64(t.net, a.AmountMicros)
		if !ok {
			return UsageEntry{}, false, fmt.Errorf("adjustment: %w", ErrAmountOverflow)
		}
		if a.AmountMicros < 0 && after < 0 {
			return UsageEntry{}, false, fmt.Errorf("%w: %s charges %s now, so a refund may take back at most that much",
				ErrRefundExceedsEntry, t.root, FormatAmount(t.net))
		}
		e := t.entry
		e.ID, e.Kind, e.Final, e.Corrects = id, KindAdjustment, true, t.entry.ID
		e.Seconds, e.AmountMicros, e.TerminatedAt = 0, a.AmountMicros, a.At
		e.Reason, e.Actor = a.Reason, a.Actor
		// Egress bytes belong to the final entry alone: an adjustment moves
		// money, and a copy would count the workspace's traffic twice.
		e.EgressBytesOut, e.EgressBytesIn = 0, 0
		e = e.normalized()
		body, _ := json.Marshal(e)
		n, err := adjustUsageScript.Run(ctx, b.rdb, []string{fundsKey(acct), usageKey(acct), usageIDsKey(acct), adjustSeqKey(acct)},
			e.ID, string(body), e.TerminatedAt.UnixMilli(), a.AmountMicros, -a.AmountMicros, seq).Int()
		switch {
		case err != nil:
			return e, false, fmt.Errorf("adjustment: %w", overflowed(err))
		case n == 1:
			return e, true, nil
		case n == 0: // the same key's adjustment landed meanwhile
			prev, err := b.ledgerEntry(ctx, acct, id)
			if err != nil {
				return UsageEntry{}, false, fmt.Errorf("adjustment: read the one stored under this key: %w", err)
			}
			if prev.Corrects != a.Corrects || prev.AmountMicros != a.AmountMicros {
				return prev, false, ErrAdjustmentConflict
			}
			return prev, false, nil
		case n != -1:
			return UsageEntry{}, false, fmt.Errorf("adjustment: unexpected script result %d", n)
		}
		// −1: another adjustment landed meanwhile; read again.
	}
	return UsageEntry{}, false, errors.New("adjustment: other adjustments of this account kept landing meanwhile; retry")
}

// adjustTarget is what an adjustment id of entry corrects finds in the
// ledger.
type adjustTarget struct {
	entry UsageEntry  // the entry corrected
	prev  *UsageEntry // the adjustment id itself, when already appended
	root  string      // the usage entry at the end of entry's corrects chain
	net   int64       // what root charges now, its adjustments counted
}

// adjustTarget reads the account's ledger for an adjustment id of the
// entry corrects: ErrNoEntry when the ledger has no such entry.
func (b *Billing) adjustTarget(ctx context.Context, acct, corrects, id string) (adjustTarget, error) {
	var t adjustTarget
	var found bool
	adjs := map[string]UsageEntry{} // every adjustment, by id
	err := b.ledger.Scan(ctx, acct, zeroTime, zeroTime, func(e UsageEntry) error {
		if e.ID == corrects {
			t.entry, found = e, true
		}
		if e.ID == id {
			t.prev = &e
		}
		if e.Kind == KindAdjustment {
			adjs[e.ID] = e
		}
		return nil
	})
	if err != nil {
		return t, err
	}
	if t.prev != nil {
		return t, nil // a retry: answered by what was stored, whatever corrects says now
	}
	if !found {
		return t, ErrNoEntry
	}
	// rootOf follows an adjustment's corrects to the usage entry it ends
	// at (the ledger holds no cycle: an adjustment corrects an entry
	// already there; the bound only guards a corrupted one).
	rootOf := func(id string) string {
		for range len(adjs) + 1 {
			a, ok := adjs[id]
			if !ok {
				break
			}
			id = a.Corrects
		}
		return id
	}
	t.root = rootOf(corrects)
	root := t.entry
	if root.ID != t.root {
		if root, err = b.ledgerEntry(ctx, acct, t.root); err != nil {
			return t, fmt.Errorf("adjustment: the entry %s corrects: %w", corrects, err)
		}
	}
	t.net = root.AmountMicros
	for _, a := range adjs {
		if rootOf(a.ID) != t.root {
			continue
		}
		var ok bool
		if t.net, ok = add64(t.net, a.AmountMicros); !ok {
			return t, fmt.Errorf("adjustment: %w", ErrAmountOverflow)
		}
	}
	return t, nil
}

// add64 returns x+y, and false when that is past int64.
func add64(x, y int64) (int64, bool) {
	s := x + y
	return s, (s > x) == (y > 0)
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
// its amount, once per entry id, if no other adjustment of the account
// was appended since the caller read the ledger.
//
// KEYS[1] funds HASH, KEYS[2] usage STREAM, KEYS[3] usage ids SET,
// KEYS[4] adjustment sequence STRING
// ARGV[1] entry id, ARGV[2] entry JSON, ARGV[3] terminated (unix ms),
// ARGV[4] amount, ARGV[5] −amount, ARGV[6] the sequence as read
// Returns 1 appended, 0 already there, −1 the sequence moved; an error
// reply, with nothing written, when a counter would overflow.
var adjustUsageScript = redis.NewScript(appendLua + add2Lua + `
if redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 1 then return 0 end
if (redis.call('GET', KEYS[4]) or '0') ~= ARGV[6] then return -1 end
local err = add2(KEYS[1], 'settled', ARGV[4], ARGV[5], 'balance', ARGV[5])
if err then return err end
redis.call('INCR', KEYS[4])
return append_usage(KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3])
`)
