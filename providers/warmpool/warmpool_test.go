package warmpool_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/warmpool"
)

// clock is a clock the test moves.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func waitReady(t *testing.T, pl *warmpool.Pool[string], n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for pl.Stats().Ready[0].Ready != n {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v; want %d ready", pl.Stats(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A take hands out the oldest ready sandbox of its standard size and
// image, each once; the refill replaces it; the pool's seconds count
// every ready sandbox's wait; Close hands the rest to drop.
func TestPool(t *testing.T) {
	c := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	var made atomic.Int64
	cfg := providers.PoolConfig{Per: []providers.PoolEntry{{Size: "small", Count: 2}}}
	pl := warmpool.Start(cfg, "img", c, slog.New(slog.DiscardHandler), func(_ context.Context, k warmpool.Key) (string, error) {
		return fmt.Sprintf("%s/%s/%d", k.Size, k.Image, made.Add(1)), nil
	})
	waitReady(t, pl, 2)
	small, _ := sandgate.LookupSize("small")
	if _, ok := pl.Take(sandgate.Size{Name: "small", CPUCores: 4, MemoryMiB: 512}, ""); ok {
		t.Errorf("a take of a non-standard size named small succeeded; want none")
	}
	if _, ok := pl.Take(small, "other"); ok {
		t.Errorf("a take of another image succeeded; want none")
	}
	c.add(10 * time.Second)
	pl.Pause() // the takes below are all that happens
	var got []string
	for range 2 {
		v, ok := pl.Take(small, "img")
		if !ok {
			t.Fatalf("take %d: none ready", len(got)+1)
		}
		got = append(got, v)
	}
	if want := []string{"small/img/1", "small/img/2"}; !slices.Equal(got, want) {
		t.Errorf("takes = %q; want the oldest first, each once: %q", got, want)
	}
	if _, ok := pl.Take(small, ""); ok {
		t.Errorf("a third take succeeded with the refill paused; want none")
	}
	st := pl.Stats()
	if st.Taken != 2 || st.Seconds != 20 || st.Ready[0] != (providers.PoolReady{Size: "small", Image: "img", Ready: 0, Warm: 20 * time.Second}) {
		t.Errorf("stats %+v; want 2 taken, 20 pool-seconds (20s warm), none ready", st)
	}
	var dropped []string
	pl.Close(func(v string) { dropped = append(dropped, v) })
	if len(dropped) != 0 {
		t.Errorf("Close dropped %q; want nothing (none ready)", dropped)
	}

	var nilPool *warmpool.Pool[string]
	if _, ok := nilPool.Take(small, ""); ok || len(nilPool.Stats().Ready) != 0 {
		t.Errorf("a nil pool took or reported something")
	}
	if warmpool.Start(providers.PoolConfig{}, "img", c, nil, func(context.Context, warmpool.Key) (string, error) { return "", nil }) != nil {
		t.Errorf("Start with no entries returned a pool; want nil (off)")
	}
}

// Close removes what is ready.
func TestCloseDrops(t *testing.T) {
	c := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	var made atomic.Int64
	pl := warmpool.Start(providers.PoolConfig{Per: []providers.PoolEntry{{Size: "small", Count: 3}}}, "img", c,
		slog.New(slog.DiscardHandler), func(context.Context, warmpool.Key) (string, error) { return fmt.Sprint(made.Add(1)), nil })
	waitReady(t, pl, 3)
	var dropped []string
	pl.Close(func(v string) { dropped = append(dropped, v) })
	pl.Close(func(v string) { t.Errorf("second Close dropped %q", v) })
	slices.Sort(dropped)
	if !slices.Equal(dropped, []string{"1", "2", "3"}) {
		t.Errorf("Close dropped %q; want every ready sandbox once", dropped)
	}
}

// The warm time of each (size, image) is a running total: a sandbox taken
// after waiting N adds exactly N, the ready ones count up to now, and
// Close adds the wait of what it drops. Nothing moves it after a take.
func TestWarmTime(t *testing.T) {
	c := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg := providers.PoolConfig{Per: []providers.PoolEntry{{Size: "small", Count: 1}, {Size: "large", Count: 1}}}
	pl := warmpool.Start(cfg, "img", c, slog.New(slog.DiscardHandler), func(_ context.Context, k warmpool.Key) (string, error) {
		return k.Size, nil
	})
	deadline := time.Now().Add(time.Minute)
	for st := pl.Stats(); st.Ready[0].Ready != 1 || st.Ready[1].Ready != 1; st = pl.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v; want one ready of each", st)
		}
		time.Sleep(time.Millisecond)
	}
	pl.Pause()
	warmOf := func() []time.Duration {
		var out []time.Duration
		for _, r := range pl.Stats().Ready {
			out = append(out, r.Warm)
		}
		return out
	}
	c.add(41*time.Second + 500*time.Millisecond)
	small, _ := sandgate.LookupSize("small")
	if _, ok := pl.Take(small, ""); !ok {
		t.Fatal("no small ready")
	}
	want := []time.Duration{41500 * time.Millisecond, 41500 * time.Millisecond}
	if got := warmOf(); !slices.Equal(got, want) {
		t.Errorf("warm after the take = %v; want %v (the taken one's wait, the ready one's up to now)", got, want)
	}
	c.add(10 * time.Second)
	want = []time.Duration{41500 * time.Millisecond, 51500 * time.Millisecond}
	if got := warmOf(); !slices.Equal(got, want) {
		t.Errorf("warm 10s later = %v; want %v: the taken one stopped counting", got, want)
	}
	pl.Close(func(string) {})
	c.add(time.Hour)
	if got := warmOf(); !slices.Equal(got, want) {
		t.Errorf("warm after Close = %v; want %v: the dropped one counted until Close", got, want)
	}
}
