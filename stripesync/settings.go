package stripesync

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Unit is what a meter event's value counts: what the Stripe meter (and
// the price on it) expects.
type Unit string

const (
	// UnitSeconds sends an entry's metered seconds: the default. It is
	// exact, and it leaves the price to Stripe (a per-second price on the
	// meter), so a rate card and a Stripe price are never applied twice.
	// Adjustments move money only (their seconds are 0), so they are not
	// sent in this unit.
	UnitSeconds Unit = "seconds"
	// UnitMicros sends an entry's amount in micro-units of its currency
	// (billing's AmountMicros, exact). The Stripe price must then be one
	// millionth of the currency per unit (unit_amount_decimal 0.0001 in
	// cents for USD). Minor units (cents) are not offered: rounding every
	// entry would drift from the ledger. A negative amount (a refunding
	// adjustment) is dead-lettered at once: a meter event cannot be
	// negative, so the operator credits it in Stripe.
	UnitMicros Unit = "micros"
)

// Account is an account's Stripe sync settings. Syncing is opt-in: an
// account without settings is never sent.
type Account struct {
	// Customer is the account's Stripe customer id, "cus_…". Required.
	Customer string
	// EventName is the event_name of the account's Stripe meter. Required.
	EventName string
	// Unit is what each event's value counts; "" means UnitSeconds.
	Unit Unit
	// Since is when the sync starts: ledger entries filed before it
	// (terminated_at) are never sent. Zero in SetAccount keeps the stored
	// value, or means now for an account not yet synced, so turning the
	// sync on never sends old usage by accident.
	Since time.Time
	// UpdatedAt is when the settings were last set (read only).
	UpdatedAt time.Time
}

// ErrNotConfigured is returned for an account without Stripe sync settings.
var ErrNotConfigured = errors.New("stripesync: account has no stripe sync settings")

// Validate checks the settings' shape (not that Stripe knows them).
func (a Account) Validate() error {
	if len(a.Customer) < 5 || len(a.Customer) > 255 || a.Customer[:4] != "cus_" || !idChars(a.Customer) {
		return errors.New("stripesync: customer must be a Stripe customer id (cus_…)")
	}
	if a.EventName == "" || len(a.EventName) > 100 {
		return errors.New("stripesync: event_name must be 1 to 100 characters")
	}
	switch a.Unit {
	case "", UnitSeconds, UnitMicros:
	default:
		return fmt.Errorf("stripesync: unit must be %q or %q", UnitSeconds, UnitMicros)
	}
	return nil
}

func idChars(s string) bool {
	for i := range len(s) {
		if !isKeyChar(s[i]) || s[i] == '*' {
			return false
		}
	}
	return true
}

// SetAccount turns the sync on for acct with a, or changes its settings.
// The cursor and dead letters stay: a change of customer applies to the
// entries not yet sent.
func (s *Syncer) SetAccount(ctx context.Context, acct string, a Account) error {
	if acct == "" {
		return errors.New("stripesync: account id required")
	}
	if err := a.Validate(); err != nil {
		return err
	}
	if a.Unit == "" {
		a.Unit = UnitSeconds
	}
	now := s.deps.Clock.Now()
	since := ""
	if !a.Since.IsZero() {
		since = strconv.FormatInt(a.Since.UnixMilli(), 10)
	}
	// The set first: an account in it without settings is skipped, while
	// settings outside it would never be synced.
	if err := s.rdb.SAdd(ctx, accountsKey(), acct).Err(); err != nil {
		return fmt.Errorf("stripesync: set account: %w", err)
	}
	err := setSettingsScript.Run(ctx, s.rdb, []string{settingsKey(acct)},
		a.Customer, a.EventName, string(a.Unit), since, now.UnixMilli()).Err()
	if err != nil {
		return fmt.Errorf("stripesync: set account: %w", err)
	}
	return nil
}

// Account returns acct's settings; ErrNotConfigured when it has none.
func (s *Syncer) Account(ctx context.Context, acct string) (Account, error) {
	m, err := s.rdb.HGetAll(ctx, settingsKey(acct)).Result()
	if err != nil {
		return Account{}, fmt.Errorf("stripesync: account: %w", err)
	}
	if m["customer"] == "" {
		return Account{}, ErrNotConfigured
	}
	a := Account{Customer: m["customer"], EventName: m["event_name"], Unit: Unit(m["unit"])}
	if a.Unit == "" {
		a.Unit = UnitSeconds
	}
	a.Since = msTime(m["since"])
	a.UpdatedAt = msTime(m["updated_at"])
	return a, nil
}

// ClearAccount turns the sync off for acct. Its cursor, state and dead
// letters stay, so turning it on again resumes where it stopped.
func (s *Syncer) ClearAccount(ctx context.Context, acct string) error {
	if err := s.rdb.Del(ctx, settingsKey(acct)).Err(); err != nil {
		return fmt.Errorf("stripesync: clear account: %w", err)
	}
	if err := s.rdb.SRem(ctx, accountsKey(), acct).Err(); err != nil {
		return fmt.Errorf("stripesync: clear account: %w", err)
	}
	return nil
}

// msTime reads a unix-ms field; zero for "" or junk.
func msTime(v string) time.Time {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n == 0 {
		return time.Time{}
	}
	return time.UnixMilli(n).UTC()
}

// setSettingsScript writes an account's settings; an empty since keeps
// the stored one, or takes updated_at when there is none.
//
// KEYS[1] settings HASH
// ARGV[1] customer, ARGV[2] event_name, ARGV[3] unit, ARGV[4] since (unix
// ms, or ""), ARGV[5] now (unix ms)
// Returns 1.
var setSettingsScript = redis.NewScript(`
local since = ARGV[4]
if since == '' then
  since = redis.call('HGET', KEYS[1], 'since') or ARGV[5]
end
redis.call('HSET', KEYS[1], 'customer', ARGV[1], 'event_name', ARGV[2], 'unit', ARGV[3],
  'since', since, 'updated_at', ARGV[5])
return 1
`)

// Accounts returns the ids of the accounts with Stripe sync settings,
// sorted: the accounts Run walks.
func (s *Syncer) Accounts(ctx context.Context) ([]string, error) {
	ids, err := s.rdb.SMembers(ctx, accountsKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("stripesync: accounts: %w", err)
	}
	slices.Sort(ids)
	return ids, nil
}
