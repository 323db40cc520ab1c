package billing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
)

// RateCard is one version of a named price list: micro-units per second
// for every standard size. Creating a card under an existing name adds a
// version; an account follows its card's newest version, and a workspace
// keeps the version it was admitted at.
type RateCard struct {
	Name      string           `json:"name"`
	Version   int              `json:"version"`
	Prices    map[string]int64 `json:"prices_micros"` // size → micro-units per second
	CreatedAt time.Time        `json:"created_at"`
}

var cardName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// ErrNoRateCard is returned for a rate card name that was never created.
var ErrNoRateCard = errors.New("billing: no such rate card")

// CreateRateCard stores prices as the next version of the card name. Every
// standard size needs a price (0 is a price).
func (b *Billing) CreateRateCard(ctx context.Context, name string, prices map[string]int64, now time.Time) (RateCard, error) {
	if !cardName.MatchString(name) {
		return RateCard{}, fmt.Errorf("rate card name %q: want lower-case letters, digits, - and _", name)
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
	c := RateCard{Name: name, Prices: prices, CreatedAt: now.UTC().Truncate(time.Millisecond)}
	body, _ := json.Marshal(c)
	v, err := createCardScript.Run(ctx, b.rdb, []string{rateCardKey(name)}, string(body), sandgate.NewID("")).Int()
	if err != nil {
		return RateCard{}, fmt.Errorf("create rate card: %w", err)
	}
	if err := b.rdb.SAdd(ctx, rateCardsKey(), name).Err(); err != nil {
		return RateCard{}, fmt.Errorf("create rate card: list it: %w", err)
	}
	c.Version = v
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
// it answers the version it made rather than adding a copy.
//
// KEYS[1] rate card HASH
// ARGV[1] the card's JSON, ARGV[2] the create's id
// Returns the new version.
var createCardScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'latest_create') == ARGV[2] then
  return tonumber(redis.call('HGET', KEYS[1], 'latest'))
end
local v = redis.call('HINCRBY', KEYS[1], 'latest', 1)
redis.call('HSET', KEYS[1], tostring(v), ARGV[1], 'latest_create', ARGV[2])
return v
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
	raw, err := b.rdb.HGet(ctx, key, strconv.Itoa(version)).Bytes()
	if errors.Is(err, redis.Nil) {
		return RateCard{}, ErrNoRateCard
	}
	if err != nil {
		return RateCard{}, err
	}
	var c RateCard
	if err := json.Unmarshal(raw, &c); err != nil {
		return RateCard{}, err
	}
	c.Name, c.Version = name, version
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
// An account an operator never configured (Configured false) is postpaid
// with no rate card: its workspaces cost 0 in currency XXX, are not held
// against funds, and still get usage entries; budgets still apply. Setting
// billing on an account makes it prepaid unless Postpaid is set: it then
// needs funds (balance 0 at first) before it can acquire.
type Settings struct {
	AccountID         string `json:"account_id"`
	Configured        bool   `json:"configured"`
	RateCard          string `json:"rate_card"`
	Currency          string `json:"currency"`
	CreditLimitMicros int64  `json:"credit_limit_micros"` // how far below 0 available may go; at least 0
	Postpaid          bool   `json:"postpaid"`            // no funds check; budgets still apply
}

// SetSettings configures an account's billing. The rate card must exist.
func (b *Billing) SetSettings(ctx context.Context, s Settings) error {
	if !ValidCurrency(s.Currency) {
		return fmt.Errorf("currency %q: want an ISO 4217 code such as USD", s.Currency)
	}
	if s.CreditLimitMicros < 0 {
		return fmt.Errorf("credit limit: at least 0")
	}
	if s.RateCard != "" {
		if _, err := b.RateCard(ctx, s.RateCard, 0); err != nil {
			return err
		}
	}
	if err := b.rdb.HSet(ctx, settingsKey(s.AccountID), "configured", "1", "rate_card", s.RateCard,
		"currency", s.Currency, "credit_limit", s.CreditLimitMicros, "postpaid", boolField(s.Postpaid)).Err(); err != nil {
		return err
	}
	// Every gateway's price cache drops the account's old settings before
	// this call returns.
	return b.db.Invalidate(ctx)
}

func boolField(v bool) string {
	if v {
		return "1"
	}
	return "0"
}

// Settings returns an account's billing settings; an account never
// configured reads as Configured false, postpaid, currency XXX.
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
		CreditLimitMicros: cl, Postpaid: m["postpaid"] == "1"}, nil
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
	return p, nil
}
