package gateway

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sandgate/sandgate/store"
)

// cache keeps values read from Redis in memory (resolved tokens, stop and
// pause state) so that hot requests cost no round trip. It is trusted only
// while this process holds a confirmed subscription to the store's
// invalidation channel: every token, instance or control change clears
// every gateway's caches at once. A fill that raced with an invalidation is
// dropped (the generation check), so a revoked token or a fresh stop can
// never be re-cached from a read that started before the change.
type cache[V any] struct {
	mu      sync.Mutex
	live    bool   // subscription confirmed
	gen     uint64 // bumped by every invalidation
	entries map[string]cacheEntry[V]
	maxAge  time.Duration
	max     int
}

type cacheEntry[V any] struct {
	v  V
	at time.Time
}

func newCache[V any]() *cache[V] {
	return &cache[V]{entries: map[string]cacheEntry[V]{}, maxAge: time.Minute, max: 100_000}
}

// get returns a cached value and the generation to pass to put.
func (c *cache[V]) get(key string, now time.Time) (V, bool, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !c.live || !ok || now.Sub(e.at) > c.maxAge || now.Before(e.at) {
		var zero V
		return zero, false, c.gen
	}
	return e.v, true, c.gen
}

// getBytes is get of the key key spells, without making it a string.
func (c *cache[V]) getBytes(key []byte, now time.Time) (V, bool, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[string(key)]
	if !c.live || !ok || now.Sub(e.at) > c.maxAge || now.Before(e.at) {
		var zero V
		return zero, false, c.gen
	}
	return e.v, true, c.gen
}

func (c *cache[V]) put(key string, v V, gen uint64, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live || gen != c.gen {
		return
	}
	if len(c.entries) >= c.max {
		clear(c.entries)
	}
	c.entries[key] = cacheEntry[V]{v: v, at: now}
}

func (c *cache[V]) invalidate() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	clear(c.entries)
}

// setLive marks the subscription up or down. Going down keeps the entries
// for stale (nothing can change them while Redis is unreachable); coming
// back up drops them, since changes may have been missed meanwhile.
func (c *cache[V]) setLive(live bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.live = live
	c.gen++
	if live {
		clear(c.entries)
	}
}

// stale returns an entry younger than maxAge whether or not the
// subscription is live. It is only for when Redis cannot be read at all:
// then nobody can revoke a token either, and a request that needs Redis
// fails on its own.
func (c *cache[V]) stale(key string, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok || now.Sub(e.at) > c.maxAge || now.Before(e.at) {
		var zero V
		return zero, false
	}
	return e.v, true
}

// invalidator is what the subscription loop drives.
type invalidator interface {
	invalidate()
	setLive(bool)
}

// subscribe keeps the invalidation subscription up until ctx ends,
// resubscribing after a failure. While it is down, the caches are bypassed.
func subscribe(ctx context.Context, db *store.DB, log *slog.Logger, caches ...invalidator) {
	setLive := func(live bool) {
		for _, c := range caches {
			c.setLive(live)
		}
	}
	invalidate := func() {
		for _, c := range caches {
			c.invalidate()
		}
	}
	for ctx.Err() == nil {
		err := db.Subscribe(ctx, func() { setLive(true) }, invalidate)
		setLive(false)
		if ctx.Err() != nil {
			return
		}
		log.Warn("cache invalidation subscription lost; bypassing caches", slog.Any("err", err))
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
