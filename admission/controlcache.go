package admission

import (
	"context"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/livecache"
	"github.com/sandgate/sandgate/store"
)

// ControlCache reads the stop and pause state, from an in-memory cache that
// is trusted only while its owner (the gateway's Server.Run) drives it
// from the store's invalidations (Invalidate, SetLive). The admission
// pipeline reads the broker-wide stop through it too, so one ControlCache
// serves one gateway.
type ControlCache struct {
	db    *store.DB
	clock sandgate.Clock
	cache *livecache.Cache[store.Controls]
}

// NewControlCache returns a ControlCache over db. Until its owner sets it live,
// every read goes to Redis.
func NewControlCache(db *store.DB, clock sandgate.Clock) *ControlCache {
	return &ControlCache{db: db, clock: clock, cache: livecache.New[store.Controls]()}
}

// For returns the stop and pause state that applies to an instance, from
// the cache when it is live.
func (c *ControlCache) For(ctx context.Context, acct, inst string) (store.Controls, error) {
	return c.ForKeyAt(ctx, ControlsKey(acct, inst), acct, inst, c.clock.Now())
}

// ControlsKey is the cache key of an account's instance's controls.
func ControlsKey(acct, inst string) string { return acct + "/" + inst }

// ForKeyAt is For with the cache key built already (ControlsKey), at now,
// the clock reading of the request's decision.
func (c *ControlCache) ForKeyAt(ctx context.Context, key, acct, inst string, now time.Time) (store.Controls, error) {
	if v, ok, _ := c.cache.Get(key, now); ok {
		return v, nil
	}
	_, _, gen := c.cache.Get(key, now)
	v, err := c.db.ControlsFor(ctx, acct, inst)
	if err != nil {
		return store.Controls{}, err
	}
	c.cache.Put(key, v, gen, now)
	return v, nil
}

// GlobalStop implements StopReader from the cache.
func (c *ControlCache) GlobalStop(ctx context.Context) (*store.Control, error) {
	now := c.clock.Now()
	if v, ok, _ := c.cache.Get("", now); ok {
		return v.GlobalStop, nil
	}
	_, _, gen := c.cache.Get("", now)
	stop, err := c.db.GlobalStop(ctx)
	if err != nil {
		return nil, err
	}
	c.cache.Put("", store.Controls{GlobalStop: stop}, gen, now)
	return stop, nil
}

// Generation returns the cache's generation, to pass to Fill: read it
// before a read from Redis whose answer carries controls (a token's).
func (c *ControlCache) Generation(now time.Time) uint64 {
	_, _, gen := c.cache.Get("", now)
	return gen
}

// Fill caches v, read from Redis after Generation returned gen, under key
// (ControlsKey); it is dropped if an invalidation came in between.
func (c *ControlCache) Fill(key string, v store.Controls, gen uint64, now time.Time) {
	c.cache.Put(key, v, gen, now)
}

// Invalidate drops every cached control (an invalidation arrived).
func (c *ControlCache) Invalidate() { c.cache.Invalidate() }

// SetLive marks the invalidation subscription up or down.
func (c *ControlCache) SetLive(live bool) { c.cache.SetLive(live) }
