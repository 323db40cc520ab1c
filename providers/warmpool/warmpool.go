// Package warmpool keeps the books of a provider's warm sandboxes
// (providers.PoolConfig): which are ready for each size and image, the
// background refill, and the pool's own warm time and takes. The provider
// says how a warm sandbox is made and how one is removed; what a take
// applies is the provider's too.
package warmpool

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
)

// Retry is how long the refill waits after a warm sandbox could not be
// made (a full disk, a vendor refusal) before it tries again.
const Retry = 5 * time.Second

// Key is one (size, image) of a pool.
type Key struct{ Size, Image string }

// Pool is the ready sandboxes of type T of one provider. Its methods are
// safe for concurrent use.
type Pool[T any] struct {
	cfg      providers.PoolConfig
	defImage string
	clock    sandgate.Clock
	log      *slog.Logger
	mk       func(ctx context.Context, k Key) (T, error)
	kick     chan struct{}
	done     chan struct{} // closed when the refill has ended
	ctx      context.Context
	stop     context.CancelFunc
	once     sync.Once

	mu     sync.Mutex
	ready  map[Key][]entry[T]
	gone   map[Key]time.Duration // warm time of the sandboxes gone (taken or closed)
	taken  int64
	paused bool
}

type entry[T any] struct {
	v    T
	made time.Time
}

// Start returns a pool of cfg whose refill calls make, one sandbox at a
// time, until Close; an entry's image "" is defImage. It returns nil when
// cfg keeps nothing, and a nil *Pool takes nothing and reports no stats.
func Start[T any](cfg providers.PoolConfig, defImage string, clock sandgate.Clock, log *slog.Logger, mk func(ctx context.Context, k Key) (T, error)) *Pool[T] {
	if !cfg.Enabled() {
		return nil
	}
	pl := &Pool[T]{cfg: cfg, defImage: defImage, clock: clock, log: log, mk: mk,
		kick: make(chan struct{}, 1), done: make(chan struct{}), ready: map[Key][]entry[T]{}, gone: map[Key]time.Duration{}}
	pl.ctx, pl.stop = context.WithCancel(context.Background())
	go pl.refill()
	return pl
}

// refill keeps the pool full until Close.
func (pl *Pool[T]) refill() {
	defer close(pl.done)
	for {
		k, ok := pl.want()
		if !ok {
			select {
			case <-pl.ctx.Done():
				return
			case <-pl.kick:
			}
			continue
		}
		v, err := pl.mk(pl.ctx, k)
		if err != nil {
			if pl.ctx.Err() != nil {
				return
			}
			pl.log.Warn("warm sandbox not made", "size", k.Size, sandgate.KeyError, err)
			select {
			case <-pl.ctx.Done():
				return
			case <-time.After(Retry):
			}
			continue
		}
		pl.mu.Lock()
		pl.ready[k] = append(pl.ready[k], entry[T]{v, pl.clock.Now()})
		pl.mu.Unlock()
	}
}

// want returns a Key below its count.
func (pl *Pool[T]) want() (Key, bool) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.paused {
		return Key{}, false
	}
	for _, e := range pl.cfg.Per {
		k := Key{e.Size, cmp.Or(e.Image, pl.defImage)}
		if len(pl.ready[k]) < e.Count {
			return k, true
		}
	}
	return Key{}, false
}

// Take hands out the oldest ready sandbox of size and image ("" means the
// default image), for the caller alone, and wakes the refill. ok is false
// when none is ready, or size is not the standard size of its name.
func (pl *Pool[T]) Take(size sandgate.Size, image string) (v T, ok bool) {
	if pl == nil {
		return v, false
	}
	if std, known := sandgate.LookupSize(size.Name); !known || std.CPUCores != size.CPUCores || std.MemoryMiB != size.MemoryMiB {
		return v, false
	}
	k := Key{size.Name, cmp.Or(image, pl.defImage)}
	pl.mu.Lock()
	es := pl.ready[k]
	if len(es) == 0 {
		pl.mu.Unlock()
		return v, false
	}
	e := es[0]
	pl.ready[k] = es[1:]
	pl.taken++
	pl.gone[k] += warm(e.made, pl.clock.Now())
	pl.mu.Unlock()
	select {
	case pl.kick <- struct{}{}:
	default:
	}
	return e.v, true
}

// Close stops the refill, waits for it, and hands every ready sandbox to
// drop. Later calls do nothing.
func (pl *Pool[T]) Close(drop func(T)) {
	if pl == nil {
		return
	}
	pl.once.Do(func() {
		pl.stop()
		<-pl.done
		pl.mu.Lock()
		defer pl.mu.Unlock()
		now := pl.clock.Now()
		for k, es := range pl.ready {
			for _, e := range es {
				pl.gone[k] += warm(e.made, now)
				drop(e.v)
			}
			delete(pl.ready, k)
		}
	})
}

// Abandon stops the refill and forgets the ready sandboxes without
// removing them, as a crash would: for tests of the reclaim.
func (pl *Pool[T]) Abandon() {
	pl.stop()
	<-pl.done
}

// Pause holds the refill, so that a test sees only the work of its takes.
func (pl *Pool[T]) Pause() {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.paused = true
}

// Stats returns the pool's stats (providers.Pooler).
func (pl *Pool[T]) Stats() providers.PoolStats {
	var st providers.PoolStats
	if pl == nil {
		return st
	}
	now := pl.clock.Now()
	pl.mu.Lock()
	defer pl.mu.Unlock()
	st.Taken = pl.taken
	for _, e := range pl.cfg.Per {
		k := Key{e.Size, cmp.Or(e.Image, pl.defImage)}
		r := providers.PoolReady{Size: k.Size, Image: k.Image, Ready: len(pl.ready[k]), Warm: pl.gone[k]}
		for _, w := range pl.ready[k] {
			r.Warm += warm(w.made, now)
		}
		st.Seconds += r.Warm.Seconds()
		st.Ready = append(st.Ready, r)
	}
	return st
}

// warm is how long a sandbox made at made has been warm at now; never
// negative, so that the running totals only grow when the clock steps
// back.
func warm(made, now time.Time) time.Duration { return max(now.Sub(made), 0) }
