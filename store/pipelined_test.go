package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/store"
)

// countScript adds ARGV[1] to a counter and answers the new total, or
// refuses (a script error) when ARGV[1] is negative.
var countScript = redis.NewScript(`
if tonumber(ARGV[1]) < 0 then return redis.error_reply('negative ' .. ARGV[1]) end
return redis.call('INCRBY', KEYS[1], ARGV[1])
`)

// TestPipelinedScripts runs many requests' scripts at once through one
// pipelined client: each call gets its own reply or its own error, and
// every script ran once.
func TestPipelinedScripts(t *testing.T) {
	rdb := redistest.Start(t).Client()
	p, err := store.Pipelined(rdb)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := countScript.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 64
	var wg sync.WaitGroup
	totals := make([]int64, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			by := i + 1 // distinct and positive: every total differs
			if i%4 == 3 {
				by = -i
			}
			totals[i], errs[i] = countScript.Run(ctx, p, []string{"count"}, by).Int64()
		})
	}
	wg.Wait()
	seen := map[int64]bool{}
	var want int64
	for i := range n {
		if i%4 == 3 {
			if errs[i] == nil || !strings.Contains(errs[i].Error(), fmt.Sprintf("negative %d", -i)) {
				t.Errorf("call %d: error %v; want its own refusal", i, errs[i])
			}
			continue
		}
		want += int64(i + 1)
		if errs[i] != nil {
			t.Errorf("call %d: %v", i, errs[i])
		}
		if seen[totals[i]] {
			t.Errorf("call %d: total %d answered twice", i, totals[i])
		}
		seen[totals[i]] = true
	}
	if got, err := rdb.Get(ctx, "count").Int64(); err != nil || got != want {
		t.Errorf("counter = %d, %v; want %d (every script once)", got, err, want)
	}
}

// TestPipelinedContext: a call whose context ends returns the context's
// error while its script still runs, and the shared connection goes on
// answering each later call with its own reply.
func TestPipelinedContext(t *testing.T) {
	rdb := redistest.Start(t).Client()
	p, err := store.Pipelined(rdb)
	if err != nil {
		t.Fatal(err)
	}
	// Holds redis-server for ARGV[1] µs, then answers OK.
	busy := redis.NewScript(`
local t0 = redis.call('TIME')
repeat local t = redis.call('TIME') until (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) >= tonumber(ARGV[1])
return 'busy done'
`)
	ctx := context.Background()
	for _, s := range []*redis.Script{busy, countScript} {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			t.Fatal(err)
		}
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := busy.Run(canceled, p, []string{"k"}, 300_000).Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("script with its context canceled: %v; want context.Canceled", err)
	}
	for i := 1; i <= 3; i++ {
		if got, err := countScript.Run(ctx, p, []string{"after"}, 1).Int64(); err != nil || got != int64(i) {
			t.Fatalf("call %d after the canceled one = %d, %v; want %d", i, got, err, i)
		}
	}
}
