package gateway

import (
	"context"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/store"
)

// Controls reads the stop and pause state, from an in-memory cache that
// is trusted only while the Server that holds it is subscribed to the
// store's invalidations (Server.Run). The admission pipeline reads the
// broker-wide stop through it too, so one Controls serves one Server.
type Controls struct {
	db    *store.DB
	clock sandgate.Clock
	cache *cache[store.Controls]
}

// NewControls returns a Controls over db. Until its Server runs, every
// read goes to Redis.
func NewControls(db *store.DB, clock sandgate.Clock) *Controls {
	return &Controls{db: db, clock: clock, cache: newCache[store.Controls]()}
}

// For returns the stop and pause state that applies to an instance, from
// the cache when it is live.
func (c *Controls) For(ctx context.Context, acct, inst string) (store.Controls, error) {
	return c.forKey(ctx, controlsKey(acct, inst), acct, inst)
}

// controlsKey is the cache key of an account's instance's controls.
func controlsKey(acct, inst string) string { return acct + "/" + inst }

// forKey is For with the cache key built already (controlsKey).
func (c *Controls) forKey(ctx context.Context, key, acct, inst string) (store.Controls, error) {
	return c.forKeyAt(ctx, key, acct, inst, c.clock.Now())
}

// forKeyAt is forKey at now, the clock reading of the request's decision.
func (c *Controls) forKeyAt(ctx context.Context, key, acct, inst string, now time.Time) (store.Controls, error) {
	if v, ok, _ := c.cache.get(key, now); ok {
		return v, nil
	}
	_, _, gen := c.cache.get(key, now)
	v, err := c.db.ControlsFor(ctx, acct, inst)
	if err != nil {
		return store.Controls{}, err
	}
	c.cache.put(key, v, gen, now)
	return v, nil
}

// GlobalStop implements admission.StopReader from the cache.
func (c *Controls) GlobalStop(ctx context.Context) (*store.Control, error) {
	now := c.clock.Now()
	if v, ok, _ := c.cache.get("", now); ok {
		return v.GlobalStop, nil
	}
	_, _, gen := c.cache.get("", now)
	stop, err := c.db.GlobalStop(ctx)
	if err != nil {
		return nil, err
	}
	c.cache.put("", store.Controls{GlobalStop: stop}, gen, now)
	return stop, nil
}
