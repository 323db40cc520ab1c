// Package livecache is an in-memory cache of values read from Redis that
// is trusted only while an invalidation subscription is live.
package livecache

import (
	"sync"
	"time"
)

// Cache keeps values read from Redis in memory (resolved tokens, stop and
// pause state) so that hot requests cost no round trip. It is trusted only
// while this process holds a confirmed subscription to the store's
// invalidation channel: every token, instance or control change clears
// every gateway's caches at once. A fill that raced with an invalidation is
// dropped (the generation check), so a revoked token or a fresh stop can
// never be re-cached from a read that started before the change.
type Cache[V any] struct {
	mu      sync.Mutex
	live    bool   // subscription confirmed
	gen     uint64 // bumped by every invalidation
	entries map[string]entry[V]
	maxAge  time.Duration
	max     int
}

type entry[V any] struct {
	v  V
	at time.Time
}

// New returns an empty Cache, not live until SetLive(true).
func New[V any]() *Cache[V] {
	return &Cache[V]{entries: map[string]entry[V]{}, maxAge: time.Minute, max: 100_000}
}

// Get returns a cached value and the generation to pass to Put.
func (c *Cache[V]) Get(key string, now time.Time) (V, bool, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	return c.hit(e, ok, now)
}

// GetBytes is Get of the key key spells, without making it a string.
func (c *Cache[V]) GetBytes(key []byte, now time.Time) (V, bool, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[string(key)] // no string is made for the lookup
	return c.hit(e, ok, now)
}

// hit answers Get for the entry e found (ok) at now; c.mu is held.
func (c *Cache[V]) hit(e entry[V], ok bool, now time.Time) (V, bool, uint64) {
	if !c.live || !c.fresh(e, ok, now) {
		var zero V
		return zero, false, c.gen
	}
	return e.v, true, c.gen
}

// fresh reports whether e, found (ok), is younger than maxAge at now.
func (c *Cache[V]) fresh(e entry[V], ok bool, now time.Time) bool {
	return ok && now.Sub(e.at) <= c.maxAge && !now.Before(e.at)
}

// Put caches v under key at now, unless the cache is not live or was
// invalidated since the Get that returned gen.
func (c *Cache[V]) Put(key string, v V, gen uint64, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live || gen != c.gen {
		return
	}
	if len(c.entries) >= c.max {
		clear(c.entries)
	}
	c.entries[key] = entry[V]{v: v, at: now}
}

// Invalidate drops every entry and every fill in flight.
func (c *Cache[V]) Invalidate() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	clear(c.entries)
}

// SetLive marks the subscription up or down. Going down keeps the entries
// for stale (nothing can change them while Redis is unreachable); coming
// back up drops them, since changes may have been missed meanwhile.
func (c *Cache[V]) SetLive(live bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.live = live
	c.gen++
	if live {
		clear(c.entries)
	}
}

// Stale returns an entry younger than maxAge whether or not the
// subscription is live. It is only for when Redis cannot be read at all:
// then nobody can revoke a token either, and a request that needs Redis
// fails on its own.
func (c *Cache[V]) Stale(key string, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !c.fresh(e, ok, now) {
		var zero V
		return zero, false
	}
	return e.v, true
}
