package gateway_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/providers/noop"
)

// TestRedisWorkPerPair counts the commands Redis runs for an acquire and
// its release on the noop provider (INFO commandstats counts every command
// a script calls): four script calls, and within them no read the pair
// does not need. The confirm of a workspace still starting in its slot
// does not read its Idempotency-Key back (only the admission's claim
// check reads it), a release's terminate answers the record it read, and
// settlement claims the final entry's id with the SADD that appends it.
func TestRedisWorkPerPair(t *testing.T) {
	e := rtStart(t, rtOptions{maxConcurrent: 1 << 30, provider: noop.New("bench")})
	e.mustDo(t, http.MethodDelete, "/v1/workspaces/"+e.acquire(t), "", nil, http.StatusOK) // loads the scripts
	rdb := e.db.Redis()
	ctx := context.Background()
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const pairs = 20
	for range pairs {
		e.mustDo(t, http.MethodDelete, "/v1/workspaces/"+e.acquire(t), "", nil, http.StatusOK)
	}
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	inner := 0
	for _, l := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		v, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, _ := strconv.Atoi(v)
		calls[name] = n
		if name != "evalsha" && !strings.HasPrefix(name, "config") && !strings.HasPrefix(name, "info") {
			inner += n
		}
	}
	if got := calls["evalsha"]; got != 4*pairs {
		t.Errorf("%d script calls for %d pairs, want 4 a pair", got, pairs)
	}
	if got := calls["get"]; got != pairs {
		t.Errorf("%d GETs for %d pairs, want 1 a pair (the admission's claim check)", got, pairs)
	}
	if got := calls["sismember"]; got != 0 {
		t.Errorf("%d SISMEMBERs for %d pairs, want none (the final entry's SADD answers whether it was in)", got, pairs)
	}
	if got := calls["sadd"]; got != pairs {
		t.Errorf("%d SADDs for %d pairs, want 1 a pair (the ledger entry's id)", got, pairs)
	}
	const budget = 33 // commands a pair's scripts run, at most
	if inner > budget*pairs {
		t.Errorf("Redis ran %.1f commands a pair inside its scripts, want at most %d: %v", float64(inner)/pairs, budget, calls)
	}
}

// scriptArgs counts what the broker's scripts hand redis-server: the
// scripts' calls, and their keys and arguments (each one is parsed and
// interned into Lua on every call).
type scriptArgs struct {
	mu          sync.Mutex
	calls, args int
}

func (s *scriptArgs) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *scriptArgs) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" || cmd.Name() == "eval" {
			s.mu.Lock()
			s.calls++
			s.args += len(cmd.Args()) - 3 // name, digest, key count
			s.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (s *scriptArgs) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestScriptArgsPerPair bounds the keys and arguments an acquire+release
// pair on the noop provider (a free account, no budgets) hands its four
// scripts: the admission script's offsets, constants (field names, TTL,
// risk defaults, size ranks) and shared values (now, the workspace id)
// live in the script, not in every call.
func TestScriptArgsPerPair(t *testing.T) {
	e := rtStart(t, rtOptions{maxConcurrent: 1 << 30, provider: noop.New("test")})
	e.mustDo(t, http.MethodDelete, "/v1/workspaces/"+e.acquire(t), "", nil, http.StatusOK) // loads the scripts
	var sa scriptArgs
	e.db.Redis().(*redis.Client).AddHook(&sa)
	const pairs = 10
	for range pairs {
		e.mustDo(t, http.MethodDelete, "/v1/workspaces/"+e.acquire(t), "", nil, http.StatusOK)
	}
	sa.mu.Lock()
	defer sa.mu.Unlock()
	if sa.calls != 4*pairs {
		t.Errorf("%d script calls for %d pairs; want 4 a pair", sa.calls, pairs)
	}
	// 129 before the admission script was built straight-line.
	const budget = 104
	if got := sa.args / pairs; got > budget {
		t.Errorf("scripts carried %d keys and arguments a pair; want at most %d", got, budget)
	}
}
