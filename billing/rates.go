package billing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
)

// RateCard is one version of a named price list: micro-units per second
// of its currency for every standard size. Creating a card under an
// existing name adds a version; an account follows its card's newest
// version, and a workspace keeps the version it was admitted at.
//
// The currency belongs to the card (every version has it) and an account
// may use the card only when its billing is in that currency. A card
// created before cards had currencies has none ("") until an operator
// sets it once ([Billing.SetRateCardCurrency]): accounts already on it
// keep their prices, but no account can be put on it meanwhile.
type RateCard struct {
	Name      string           `json:"name"`
	Version   int              `json:"version"`
	Currency  string           `json:"currency"`      // ISO 4217; "" for a card created before cards had one
	Prices    map[string]int64 `json:"prices_micros"` // size → micro-units per second
	CreatedAt time.Time        `json:"created_at"`
}

var cardName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// ErrNoRateCard is returned for a rate card name that was never created.
var ErrNoRateCard = errors.New("billing: no such rate card")

// ErrCardCurrency is returned when a rate card's currency forbids the
// change: a new version in another currency than the card's, a currency
// set on a card that has one, or an account put on a card of another
// currency or of none. Its text names the currencies and what to do.
var ErrCardCurrency = errors.New("billing: rate card currency")

// cardCurrencyError wraps ErrCardCurrency with a message an operator can act on.
type cardCurrencyError struct{ msg string }

func (e *cardCurrencyError) Error() string        { return e.msg }
func (e *cardCurrencyError) Is(target error) bool { return target == ErrCardCurrency }

// CreateRateCard stores prices, in micro-units of currency, as the next
// version of the card name. Every standard size needs a price (0 is a
// price). A card keeps one currency: a version in another is refused
// (ErrCardCurrency), as is a new version of a card created without one
// until its currency is set.
func (b *Billing) CreateRateCard(ctx context.Context, name, currency string, prices map[string]int64, now time.Time) (RateCard, error) {
	if !cardName.MatchString(name) {
		return RateCard{}, fmt.Errorf("rate card name %q: want lower-case letters, digits, - and _", name)
	}
	if currency == "" {
		return RateCard{}, fmt.Errorf("rate card %s: a currency is required (an ISO 4217 code such as USD): its prices are in it", name)
	}
	if !ValidCurrency(currency) || currency == NoCurrency {
		return RateCard{}, fmt.Errorf("rate card %s: currency %q: want an ISO 4217 code such as USD", name, currency)
	}
	for _, s := range sandgate.StandardSizes {
		p, ok := prices[s.Name]
		if !ok || p < 0 {
			return RateCard{}, fmt.Errorf("rate card: size %s needs a price of at least 0", s.Name)
		}
	}
	for size := range prices {
		if _, ok := sandgate.LookupSize(size); !ok {
			return RateCard{}, fmt.Errorf("rate card: unknown size %q", size)
		}
	}
	c := RateCard{Name: name, Currency: currency, Prices: prices, CreatedAt: now.UTC().Truncate(time.Millisecond)}
	body, _ := json.Marshal(c)
	res, err := createCardScript.Run(ctx, b.rdb, []string{rateCardKey(name)}, string(body), sandgate.NewID(""), currency).Slice()
	if err != nil {
		return RateCard{}, fmt.Errorf("create rate card: %w", err)
	}
	if len(res) != 2 {
		return RateCard{}, fmt.Errorf("create rate card: unexpected script result %v", res)
	}
	v, _ := res[0].(int64)
	switch had, _ := res[1].(string); {
	case v > 0:
	case had == "":
		return RateCard{}, &cardCurrencyError{fmt.Sprintf("rate card %s has versions without a currency: set it first "+
			"(sandgate admin rate-card set-currency %s --currency %s), then add the version", name, name, currency)}
	default:
		return RateCard{}, &cardCurrencyError{fmt.Sprintf("rate card %s is in %s, not %s: a card keeps one currency; "+
			"create a card under another name for %s", name, had, currency, currency)}
	}
	if err := b.rdb.SAdd(ctx, rateCardsKey(), name).Err(); err != nil {
		return RateCard{}, fmt.Errorf("create rate card: list it: %w", err)
	}
	c.Version = int(v)
	// Accounts on this card follow its newest version: every gateway's
	// price cache drops the old one before this call returns.
	if err := b.db.Invalidate(ctx); err != nil {
		return c, fmt.Errorf("create rate card: announce: %w", err)
	}
	return c, nil
}

// createCardScript adds a version to a rate card. Each create names
// itself with a random id, kept beside the newest version: the same id
// again is this create sent again (a reply lost, go-redis's resend), and
// it answers the version it made rather than adding a copy. The card's
// currency is its field "currency", set by its first version: a version
// in another currency, or a version of a card whose versions have none,
// adds nothing.
//
// KEYS[1] rate card HASH
// ARGV[1] the card's JSON, ARGV[2] the create's id, ARGV[3] its currency
// Returns {new version, ""}, or {0, the card's currency} when refused.
var createCardScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'latest_create') == ARGV[2] then
  return {tonumber(redis.call('HGET', KEYS[1], 'latest')), ''}
end
local cur = redis.call('HGET', KEYS[1], 'currency')
local latest = redis.call('HGET', KEYS[1], 'latest')
if (cur and cur ~= ARGV[3]) or (not cur and latest) then return {0, cur or ''} end
local v = redis.call('HINCRBY', KEYS[1], 'latest', 1)
redis.call('HSET', KEYS[1], tostring(v), ARGV[1], 'latest_create', ARGV[2], 'currency', ARGV[3])
return {v, ''}
`)

// SetRateCardCurrency is the one-time migration of a card created before
// cards had currencies: it states the currency its prices were written
// in, for every version. Accounts already on the card keep its prices;
// afterwards accounts of that currency may be put on it. Returns
// ErrNoRateCard, and ErrCardCurrency when the card has a currency already.
func (b *Billing) SetRateCardCurrency(ctx context.Context, name, currency string) (RateCard, error) {
	if !ValidCurrency(currency) || currency == NoCurrency {
		return RateCard{}, fmt.Errorf("currency %q: want an ISO 4217 code such as USD", currency)
	}
	had, err := setCardCurrencyScript.Run(ctx, b.rdb, []string{rateCardKey(name)}, currency).Text()
	if err != nil {
		return RateCard{}, fmt.Errorf("set rate card currency: %w", err)
	}
	switch had {
	case "":
	case "-":
		return RateCard{}, ErrNoRateCard
	default:
		return RateCard{}, &cardCurrencyError{fmt.Sprintf("rate card %s is already in %s: a card's currency is set once", name, had)}
	}
	if err := b.db.Invalidate(ctx); err != nil {
		return RateCard{}, fmt.Errorf("set rate card currency: announce: %w", err)
	}
	return b.RateCard(ctx, name, 0)
}

// setCardCurrencyScript sets the currency of a card that has none.
//
// KEYS[1] rate card HASH
// ARGV[1] the currency
// Returns "" set now, "-" no such card, or the card's currency (unchanged).
var setCardCurrencyScript = redis.NewScript(`
if not redis.call('HGET', KEYS[1], 'latest') then return '-' end
local cur = redis.call('HGET', KEYS[1], 'currency')
if cur then return cur end
redis.call('HSET', KEYS[1], 'currency', ARGV[1])
return ''
`)

// RateCard returns a version of a card; version 0 means the newest.
// Returns ErrNoRateCard.
func (b *Billing) RateCard(ctx context.Context, name string, version int) (RateCard, error) {
	key := rateCardKey(name)
	if version == 0 {
		v, err := b.rdb.HGet(ctx, key, "latest").Int()
		if errors.Is(err, redis.Nil) {
			return RateCard{}, ErrNoRateCard
		}
		if err != nil {
			return RateCard{}, err
		}
		version = v
	}
	vals, err := b.rdb.HMGet(ctx, key, strconv.Itoa(version), "currency").Result()
	if err != nil {
		return RateCard{}, err
	}
	raw, ok := vals[0].(string)
	if !ok {
		return RateCard{}, ErrNoRateCard
	}
	var c RateCard
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		return RateCard{}, err
	}
	// The card's currency, not the version's: set once for every version.
	cur, _ := vals[1].(string)
	c.Name, c.Version, c.Currency = name, version, cur
	return c, nil
}

// RateCards returns the newest version of every card, by name.
func (b *Billing) RateCards(ctx context.Context) ([]RateCard, error) {
	names, err := b.rdb.SMembers(ctx, rateCardsKey()).Result()
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([]RateCard, 0, len(names))
	for _, n := range names {
		c, err := b.RateCard(ctx, n, 0)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// Settings are an account's billing settings.
//
// An account an operator never configured (Configured false) cannot
// acquire: [FundsCheck] refuses it, so no account runs free by accident.
// An operator marks an account free on purpose (Free): postpaid with no
// rate card, its workspaces cost 0 in currency XXX, are not held against
// funds, and still get usage entries; budgets still apply. Setting billing
// on an account makes it prepaid unless Postpaid is set: it then needs
// funds (balance 0 at first) before it can acquire.
type Settings struct {
	AccountID         string `json:"account_id"`
	Configured        bool   `json:"configured"`
	RateCard          string `json:"rate_card"`
	Currency          string `json:"currency"`
	CreditLimitMicros int64  `json:"credit_limit_micros"` // how far below 0 available may go; at least 0
	Postpaid          bool   `json:"postpaid"`            // no funds check; budgets still apply
	Free              bool   `json:"free"`                // marked free on purpose: no rate card, XXX, postpaid
}

// SetSettings configures an account's billing. The rate card must exist
// and be in the account's currency (ErrCardCurrency otherwise). A free
// account (Free) takes no rate card, currency or credit limit: it is
// stored postpaid in XXX.
func (b *Billing) SetSettings(ctx context.Context, s Settings) error {
	if s.Free {
		if s.RateCard != "" || (s.Currency != "" && s.Currency != NoCurrency) || s.CreditLimitMicros != 0 {
			return fmt.Errorf("a free account has no rate card, currency or credit limit: its workspaces cost 0 (currency %s)", NoCurrency)
		}
		s.Currency, s.Postpaid = NoCurrency, true
	}
	if !ValidCurrency(s.Currency) {
		return fmt.Errorf("currency %q: want an ISO 4217 code such as USD", s.Currency)
	}
	if s.CreditLimitMicros < 0 {
		return fmt.Errorf("credit limit: at least 0")
	}
	if s.RateCard != "" {
		c, err := b.RateCard(ctx, s.RateCard, 0)
		if err != nil {
			return err
		}
		switch {
		case c.Currency == "":
			return &cardCurrencyError{fmt.Sprintf("rate card %s has no currency (it was created before cards had one): "+
				"an operator must state the currency its prices are in (sandgate admin rate-card set-currency %s --currency CODE) "+
				"before an account is put on it", c.Name, c.Name)}
		case c.Currency != s.Currency:
			return &cardCurrencyError{fmt.Sprintf("rate card %s is priced in %s but the account's billing currency is %s: "+
				"use a rate card in %s", c.Name, c.Currency, s.Currency, s.Currency)}
		}
	}
	if err := b.checkCurrencyChange(ctx, s.AccountID, s.Currency); err != nil {
		return err
	}
	if err := b.rdb.HSet(ctx, settingsKey(s.AccountID), "configured", "1", "rate_card", s.RateCard,
		"currency", s.Currency, "credit_limit", s.CreditLimitMicros, "postpaid", boolField(s.Postpaid), "free", boolField(s.Free)).Err(); err != nil {
		return err
	}
	// Every gateway's price cache drops the account's old settings before
	// this call returns.
	return b.db.Invalidate(ctx)
}

// ErrCurrencyInUse is returned for a change of an account's currency once
// money has moved in the old one.
var ErrCurrencyInUse = errors.New("billing: the account's currency is in use")

// checkCurrencyChange refuses to give account acct currency to once it
// has money in another: its funds counters carry no currency of their
// own, so they would be read in the new one, and its statements would
// meet ledger entries in the old one. Free usage (NoCurrency, 0) fits any
// currency, so a free account may become a paying one; an account never
// configured had no currency to keep.
func (b *Billing) checkCurrencyChange(ctx context.Context, acct, to string) error {
	cur, err := b.Settings(ctx, acct)
	if err != nil {
		return err
	}
	if !cur.Configured || strings.EqualFold(cur.Currency, to) {
		return nil
	}
	inUse := func(what string) error {
		return fmt.Errorf("%w: it has %s in %s, and balances and statements would read them as %s; "+
			"keep %s, or bill in %s on another account", ErrCurrencyInUse, what, cur.Currency, to, cur.Currency, to)
	}
	funds, err := b.rdb.HGetAll(ctx, fundsKey(acct)).Result()
	if err != nil {
		return err
	}
	for _, v := range funds {
		if v != "0" {
			return inUse("funds")
		}
	}
	err = b.ledger.Scan(ctx, acct, zeroTime, zeroTime, func(e UsageEntry) error {
		if !strings.EqualFold(e.Currency, to) && (e.Currency != NoCurrency || e.AmountMicros != 0) {
			return errStop
		}
		return nil
	})
	switch {
	case errors.Is(err, errStop):
		return inUse("usage")
	case err != nil:
		return err
	}
	return nil
}

func boolField(v bool) string {
	if v {
		return "1"
	}
	return "0"
}

// Settings returns an account's billing settings; an account never
// configured reads as Configured false, postpaid, currency XXX (and cannot
// acquire).
func (b *Billing) Settings(ctx context.Context, acct string) (Settings, error) {
	m, err := b.rdb.HGetAll(ctx, settingsKey(acct)).Result()
	if err != nil {
		return Settings{}, err
	}
	if m["configured"] != "1" {
		return Settings{AccountID: acct, Currency: NoCurrency, Postpaid: true}, nil
	}
	cl, _ := strconv.ParseInt(m["credit_limit"], 10, 64)
	return Settings{AccountID: acct, Configured: true, RateCard: m["rate_card"], Currency: m["currency"],
		CreditLimitMicros: cl, Postpaid: m["postpaid"] == "1", Free: m["free"] == "1"}, nil
}

// Price returns the price a workspace of size admitted now for acct gets,
// its worst case included.
//
// The settings and the rate card come from the price cache when it is
// live (see [PriceCache]).
func (b *Billing) Price(ctx context.Context, acct, size string, created, expires time.Time) (sandgate.Price, error) {
	pr, err := b.pricing(ctx, acct)
	if err != nil {
		return sandgate.Price{}, err
	}
	return pr.price(size, created, expires)
}

// price is the price of a workspace of size living from created to
// expires under pr.
func (pr pricing) price(size string, created, expires time.Time) (sandgate.Price, error) {
	var err error
	p := sandgate.Price{Currency: pr.settings.Currency}
	if pr.card == nil {
		return p, nil
	}
	c := *pr.card
	unit, ok := c.Prices[size]
	if !ok {
		return p, fmt.Errorf("rate card %s v%d has no price for size %q", c.Name, c.Version, size)
	}
	p.RateCard, p.RateCardVersion, p.UnitMicros = c.Name, c.Version, unit
	if p.HoldMicros, err = WorstCase(unit, created, expires); err != nil {
		return p, err
	}
	if p.HoldMicros > maxExactMicros {
		// The scripts that accrue and settle a hold read it as a Lua
		// number: past 2^53 it would be rounded, and holds would drift.
		return p, fmt.Errorf("worst case %d micro-units at rate card %s v%d: %w", p.HoldMicros, c.Name, c.Version, ErrOverflow)
	}
	return p, nil
}

// maxExactMicros is the largest amount a Redis Lua number holds exactly.
const maxExactMicros = 1 << 53
