package billing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Funds entry kinds.
const (
	KindCredit = "credit"
	KindDebit  = "debit"
)

// FundsEntry is one operator credit or debit: the only way a balance
// changes other than settlement. Entries are appended, never edited.
type FundsEntry struct {
	Key          string    `json:"key"` // the operator's idempotency key
	Kind         string    `json:"kind"`
	AmountMicros int64     `json:"amount_micros"` // positive
	Currency     string    `json:"currency"`
	Reason       string    `json:"reason"`
	Actor        string    `json:"actor"`
	At           time.Time `json:"at"`
}

// ErrFundsConflict is returned when an idempotency key was used for a
// different credit or debit.
var ErrFundsConflict = errors.New("billing: this idempotency key was used for a different credit or debit")

// Adjust applies a credit or debit once per idempotency key. A replay of
// the same entry returns the original with applied false.
func (b *Billing) Adjust(ctx context.Context, acct string, e FundsEntry) (FundsEntry, bool, error) {
	if e.Kind != KindCredit && e.Kind != KindDebit {
		return e, false, fmt.Errorf("funds: kind %q: want credit or debit", e.Kind)
	}
	if e.AmountMicros <= 0 {
		return e, false, fmt.Errorf("funds: amount must be positive")
	}
	if e.Key == "" || len(e.Key) > 200 {
		return e, false, fmt.Errorf("funds: an idempotency key is required (at most 200 characters)")
	}
	s, err := b.Settings(ctx, acct)
	if err != nil {
		return e, false, err
	}
	if e.At.IsZero() {
		e.At = b.clock.Now()
	}
	e.Currency, e.At = s.Currency, e.At.UTC().Truncate(time.Millisecond)
	body, _ := json.Marshal(e)
	delta := e.AmountMicros
	if e.Kind == KindDebit {
		delta = -delta
	}
	res, err := adjustScript.Run(ctx, b.rdb, []string{fundsKey(acct), fundsLedgerKey(acct), fundsIDsKey(acct)},
		e.Key, string(body), e.Kind+"s", e.AmountMicros, delta, -e.AmountMicros).Slice()
	if err != nil {
		return e, false, fmt.Errorf("funds: %w", overflowed(err))
	}
	if n, _ := res[0].(int64); n == 1 {
		return e, true, nil
	}
	var prev FundsEntry
	raw, _ := res[1].(string)
	if err := json.Unmarshal([]byte(raw), &prev); err != nil {
		return e, false, err
	}
	if prev.Kind != e.Kind || prev.AmountMicros != e.AmountMicros {
		return prev, false, ErrFundsConflict
	}
	return prev, false, nil
}

// adjustScript applies one credit or debit once per idempotency key.
//
// KEYS[1] funds HASH, KEYS[2] funds ledger STREAM, KEYS[3] funds ids HASH
// ARGV[1] idempotency key, ARGV[2] entry JSON, ARGV[3] counter ("credits"
// or "debits"), ARGV[4] amount, ARGV[5] balance delta, ARGV[6] −amount
// Returns {1} applied, {0, previous entry JSON} a replay; an error reply,
// with nothing written, when a counter would overflow.
var adjustScript = redis.NewScript(add2Lua + `
local prev = redis.call('HGET', KEYS[3], ARGV[1])
if prev then return {0, prev} end
local err = add2(KEYS[1], ARGV[3], ARGV[4], ARGV[6], 'balance', ARGV[5])
if err then return err end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('XADD', KEYS[2], '*', 'e', ARGV[2])
return {1}
`)

// add2Lua defines add2(key, f1, d1, u1, f2, d2): it adds d1 to field f1
// and d2 to field f2 of the hash key, or neither, and returns nil, or
// the error reply of the one that failed (a sum past int64) with the
// hash as it was (u1 is −d1). Redis keeps what a script wrote before an
// error, so a script calls it before anything else it writes.
const add2Lua = `
local function add2(key, f1, d1, u1, f2, d2)
  local r = redis.pcall('HINCRBY', key, f1, d1)
  if type(r) == 'table' then return r end
  r = redis.pcall('HINCRBY', key, f2, d2)
  if type(r) == 'table' then
    redis.call('HINCRBY', key, f1, u1)
    return r
  end
  return nil
end
`

// ErrAmountOverflow is returned when an amount would take an account's
// counters past what int64 micro-units hold; nothing was written.
var ErrAmountOverflow = errors.New("billing: the amount would take the account's totals past the largest amount sandgate holds (9223372036854.775807)")

// overflowed maps Redis's refusal of an HINCRBY past int64 to
// ErrAmountOverflow.
func overflowed(err error) error {
	if err != nil && strings.Contains(err.Error(), "increment or decrement would overflow") {
		return ErrAmountOverflow
	}
	return err
}

// Balance is an account's funds. Balance = credits − debits − settled;
// Available = Balance − Holds, what the account has that no open
// workspace reserves (it may go as low as −CreditLimit).
type Balance struct {
	AccountID         string `json:"account_id"`
	Currency          string `json:"currency"`
	Postpaid          bool   `json:"postpaid"`
	AvailableMicros   int64  `json:"available_micros"`
	BalanceMicros     int64  `json:"balance_micros"`
	HoldsMicros       int64  `json:"holds_micros"`
	SettledMicros     int64  `json:"settled_micros"`
	CreditsMicros     int64  `json:"credits_micros"`
	DebitsMicros      int64  `json:"debits_micros"`
	CreditLimitMicros int64  `json:"credit_limit_micros"`
}

// Balance reads an account's funds.
func (b *Billing) Balance(ctx context.Context, acct string) (Balance, error) {
	s, err := b.Settings(ctx, acct)
	if err != nil {
		return Balance{}, err
	}
	m, err := b.rdb.HGetAll(ctx, fundsKey(acct)).Result()
	if err != nil {
		return Balance{}, err
	}
	n := func(k string) int64 {
		v, _ := strconv.ParseInt(m[k], 10, 64)
		return v
	}
	out := Balance{AccountID: acct, Currency: s.Currency, Postpaid: s.Postpaid, CreditLimitMicros: s.CreditLimitMicros,
		BalanceMicros: n("balance"), HoldsMicros: n("holds"), SettledMicros: n("settled"),
		CreditsMicros: n("credits"), DebitsMicros: n("debits")}
	out.AvailableMicros = out.BalanceMicros - out.HoldsMicros
	return out, nil
}
