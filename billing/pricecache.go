package billing

import (
	"context"
	"sync"
)

// pricing is what pricing a workspace reads: the account's settings and,
// when it names one, the newest version of its rate card.
type pricing struct {
	settings Settings
	card     *RateCard
}

// PriceCache keeps each account's pricing (its billing settings and its
// rate card's newest version) in memory, so that an Acquire prices its
// workspace without a round trip. Like the gateway's token cache it is
// trusted only while its owner holds a confirmed subscription to the
// store's invalidations (SetLive(true)); every settings or rate-card
// change is announced there (store.DB.Invalidate), and a fill that raced
// with an invalidation is dropped. Only the price comes from it: the funds
// check reads credit limit and postpaid inside the admission script. It is
// safe for concurrent use.
type PriceCache struct {
	mu      sync.Mutex
	live    bool
	gen     uint64
	entries map[string]pricing
}

// maxPriceEntries bounds the cache; past it the cache starts over.
const maxPriceEntries = 100_000

func (c *PriceCache) get(acct string) (pricing, bool, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.entries[acct]
	return p, ok && c.live, c.gen
}

func (c *PriceCache) put(acct string, p pricing, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live || gen != c.gen {
		return
	}
	if c.entries == nil || len(c.entries) >= maxPriceEntries {
		c.entries = map[string]pricing{}
	}
	c.entries[acct] = p
}

// Invalidate drops every entry: a settings or rate card change was announced.
func (c *PriceCache) Invalidate() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	clear(c.entries)
}

// SetLive marks the invalidation subscription up or down. While it is
// down every price is read from Redis; either way the entries are dropped,
// since changes may have been missed.
func (c *PriceCache) SetLive(live bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.live = live
	c.gen++
	clear(c.entries)
}

// Prices returns the cache of account pricing, for the owner of the
// invalidation subscription (the gateway) to drive.
func (b *Billing) Prices() *PriceCache { return b.prices }

// pricing returns acct's pricing, from the cache when it is live.
func (b *Billing) pricing(ctx context.Context, acct string) (pricing, error) {
	p, ok, gen := b.prices.get(acct)
	if ok {
		return p, nil
	}
	s, err := b.Settings(ctx, acct)
	if err != nil {
		return pricing{}, err
	}
	p = pricing{settings: s}
	if s.RateCard != "" {
		c, err := b.RateCard(ctx, s.RateCard, 0)
		if err != nil {
			return pricing{}, err
		}
		p.card = &c
	}
	b.prices.put(acct, p, gen)
	return p, nil
}
