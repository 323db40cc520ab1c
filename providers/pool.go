package providers

import (
	"errors"
	"fmt"
	"time"

	"github.com/sandgate/sandgate"
)

// PoolConfig is the `pool` block of a provider that keeps warm sandboxes:
// sandboxes made before anyone asks for them, each taken whole by one
// create of its size and image and never given back. The zero value (no
// entries) means no pool.
type PoolConfig struct {
	// Per lists how many ready sandboxes to keep of each size and image.
	Per []PoolEntry `yaml:"per"`
	// MaxMemoryMiB caps the memory of the pool's sandboxes together (each
	// counts its size's memory); 0 means 4096. Validate refuses a Per
	// that does not fit.
	MaxMemoryMiB int `yaml:"max_memory_mib"`
}

// PoolEntry is one (size, image) of a pool.
type PoolEntry struct {
	Size  string `yaml:"size"`  // a standard size's name
	Image string `yaml:"image"` // "" means the provider's default image
	Count int    `yaml:"count"` // ready sandboxes kept, 1…MaxPoolCount
}

// MaxPoolCount caps the ready sandboxes of one pool entry.
const MaxPoolCount = 64

// DefaultPoolMemoryMiB is PoolConfig.MaxMemoryMiB's default.
const DefaultPoolMemoryMiB = 4096

// Enabled reports whether c keeps any sandbox.
func (c PoolConfig) Enabled() bool { return len(c.Per) > 0 }

// Validate checks c: known sizes, counts within 1…MaxPoolCount, one entry
// per (size, image), and their memory within MaxMemoryMiB (its default
// when 0).
func (c PoolConfig) Validate() error {
	limit := c.MaxMemoryMiB
	if limit == 0 {
		limit = DefaultPoolMemoryMiB
	}
	if limit < 0 {
		return errors.New("pool: max_memory_mib must not be negative")
	}
	seen := map[PoolEntry]bool{}
	mib := 0
	for _, e := range c.Per {
		size, ok := sandgate.LookupSize(e.Size)
		if !ok {
			return fmt.Errorf("pool: unknown size %q", e.Size)
		}
		if e.Count < 1 || e.Count > MaxPoolCount {
			return fmt.Errorf("pool: count of %s must be 1…%d", e.Size, MaxPoolCount)
		}
		k := PoolEntry{Size: e.Size, Image: e.Image}
		if seen[k] {
			return fmt.Errorf("pool: %s and image %q are listed twice", e.Size, e.Image)
		}
		seen[k] = true
		mib += e.Count * size.MemoryMiB
	}
	if mib > limit {
		return fmt.Errorf("pool: its sandboxes take %d MiB of memory, over max_memory_mib (%d)", mib, limit)
	}
	return nil
}

// PoolStats is what a provider's pool holds and has cost.
type PoolStats struct {
	// Ready is the ready sandboxes of each (size, image) of the config,
	// 0 included.
	Ready []PoolReady
	// Seconds is how long pooled sandboxes have existed unclaimed, summed
	// over all of them since the provider was opened: the pool's own
	// cost, billed to no one.
	Seconds float64
	// Taken counts the creates a pooled sandbox served.
	Taken int64
}

// PoolReady is one (size, image) of a pool: its ready count and its
// warm time.
type PoolReady struct {
	Size, Image string
	Ready       int
	// Warm is how long the pool's sandboxes of this size and image have
	// existed unclaimed, summed since the provider was opened, the ready
	// ones up to now: a running total that only grows, which the broker
	// records durably (billing.PoolMeter).
	Warm time.Duration
}

// Pooler is an optional interface of a Provider that keeps a pool of
// warm sandboxes: the broker reports its stats as metrics.
type Pooler interface {
	// PoolStats returns the pool's stats now; it does not block on the
	// vendor.
	PoolStats() PoolStats
}
