package gateway

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sandgate/sandgate/store"
)

// authCache keeps resolved tokens in memory so an authenticated request
// costs no Redis round trip. It is trusted only while this process holds a
// confirmed subscription to the store's invalidation channel: every token
// or instance change clears it on every gateway at once. A fill that raced
// with an invalidation is dropped (the generation check), so a revoked
// token can never be re-cached from a read that started before the revoke.
type authCache struct {
	mu      sync.Mutex
	live    bool   // subscription confirmed
	gen     uint64 // bumped by every invalidation
	entries map[string]cacheEntry
	maxAge  time.Duration
	max     int
}

type cacheEntry struct {
	auth store.Auth
	at   time.Time
}

func newAuthCache() *authCache {
	return &authCache{entries: map[string]cacheEntry{}, maxAge: time.Minute, max: 100_000}
}

// get returns a cached resolution and the generation to pass to put.
func (c *authCache) get(hash string, now time.Time) (store.Auth, bool, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[hash]
	if !c.live || !ok || now.Sub(e.at) > c.maxAge {
		return store.Auth{}, false, c.gen
	}
	return e.auth, true, c.gen
}

func (c *authCache) put(hash string, a store.Auth, gen uint64, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live || gen != c.gen {
		return
	}
	if len(c.entries) >= c.max {
		clear(c.entries)
	}
	c.entries[hash] = cacheEntry{auth: a, at: now}
}

func (c *authCache) invalidate() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	clear(c.entries)
}

func (c *authCache) setLive(live bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.live = live
	c.gen++
	clear(c.entries)
}

// run keeps the subscription up until ctx ends, resubscribing after a
// failure. While it is down, the cache is bypassed.
func (c *authCache) run(ctx context.Context, db *store.DB, log *slog.Logger) {
	for ctx.Err() == nil {
		err := db.Subscribe(ctx, func() { c.setLive(true) }, c.invalidate)
		c.setLive(false)
		if ctx.Err() != nil {
			return
		}
		log.Warn("auth cache subscription lost; bypassing cache", slog.Any("err", err))
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
