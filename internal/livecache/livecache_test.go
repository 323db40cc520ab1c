package livecache_test

import (
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/livecache"
)

// t0 is when the tests' entries are put.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestCache(t *testing.T) {
	tests := []struct {
		name string
		// run acts on a live cache holding "k" = 1 put at t0, and
		// returns when to Get "k".
		run  func(c *livecache.Cache[int]) time.Time
		want bool // whether Get finds "k"
	}{
		{"fresh", func(*livecache.Cache[int]) time.Time { return t0.Add(time.Second) }, true},
		{"older than a minute", func(*livecache.Cache[int]) time.Time { return t0.Add(61 * time.Second) }, false},
		{"clock went back", func(*livecache.Cache[int]) time.Time { return t0.Add(-time.Second) }, false},
		{"invalidated", func(c *livecache.Cache[int]) time.Time { c.Invalidate(); return t0 }, false},
		{"subscription down", func(c *livecache.Cache[int]) time.Time { c.SetLive(false); return t0 }, false},
		{"subscription back", func(c *livecache.Cache[int]) time.Time { c.SetLive(false); c.SetLive(true); return t0 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := livecache.New[int]()
			c.SetLive(true)
			_, _, gen := c.Get("k", t0)
			c.Put("k", 1, gen, t0)
			at := tt.run(c)
			v, ok, _ := c.Get("k", at)
			if ok != tt.want || (ok && v != 1) {
				t.Errorf("Get = %d, %v; want found %v", v, ok, tt.want)
			}
			if v, ok, _ := c.GetBytes([]byte("k"), at); ok != tt.want || (ok && v != 1) {
				t.Errorf("GetBytes = %d, %v; want found %v", v, ok, tt.want)
			}
		})
	}
}

func TestCachePutAfterInvalidation(t *testing.T) {
	c := livecache.New[int]()
	_, _, gen := c.Get("k", t0)
	c.Put("k", 1, gen, t0) // not live yet: dropped
	if _, ok, _ := c.Get("k", t0); ok {
		t.Fatal("Get found a value put before the cache went live")
	}
	c.SetLive(true)
	_, _, gen = c.Get("k", t0)
	c.Invalidate() // a change raced with the read
	c.Put("k", 1, gen, t0)
	if _, ok, _ := c.Get("k", t0); ok {
		t.Fatal("Get found a fill that raced with an invalidation")
	}
}

func TestCacheStale(t *testing.T) {
	c := livecache.New[int]()
	c.SetLive(true)
	_, _, gen := c.Get("k", t0)
	c.Put("k", 7, gen, t0)
	c.SetLive(false) // Redis unreachable: the entries stay for Stale
	if _, ok, _ := c.Get("k", t0); ok {
		t.Error("Get trusted the cache without a live subscription")
	}
	if v, ok := c.Stale("k", t0.Add(time.Second)); !ok || v != 7 {
		t.Errorf("Stale = %d, %v; want 7, true", v, ok)
	}
	if _, ok := c.Stale("k", t0.Add(2*time.Minute)); ok {
		t.Error("Stale returned an entry older than a minute")
	}
}
