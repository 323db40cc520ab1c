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

// scriptArgs counts what the broker's scripts hand redis-server: every
// EVALSHA's keys and arguments (each one is parsed and interned into Lua
// on every call), and the scripts' calls.
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

// TestRedisWorkPerPair bounds what an acquire+release pair on the noop
// provider (a free account, no budgets) asks of redis-server, the part of
// its CPU per pair (docs/benchmarks.md, "Redis CPU per pair") that does
// not depend on the host: the keys and arguments the four scripts carry,
// and the commands they run inside that an earlier version ran twice over.
func TestRedisWorkPerPair(t *testing.T) {
	e := rtStart(t, rtOptions{maxConcurrent: 1 << 30, provider: noop.New("test")})
	e.mustDo(t, http.MethodDelete, "/v1/workspaces/"+e.acquire(t), "", nil, http.StatusOK) // loads the scripts
	rdb := e.db.Redis().(*redis.Client)
	var sa scriptArgs
	rdb.AddHook(&sa)
	ctx := context.Background()
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const pairs = 10
	for range pairs {
		e.mustDo(t, http.MethodDelete, "/v1/workspaces/"+e.acquire(t), "", nil, http.StatusOK)
	}
	sa.mu.Lock()
	calls, args := sa.calls, sa.args
	sa.mu.Unlock()
	if calls != 4*pairs {
		t.Errorf("%d script calls for %d pairs; want 4 a pair (admit, confirm, begin release, finish and settle)", calls, pairs)
	}
	// The admission script alone carried about 50 before its offsets,
	// constants and shared values moved into the script.
	if perPair := args / pairs; perPair > maxScriptArgsPerPair {
		t.Errorf("scripts carried %d keys and arguments a pair; want at most %d", perPair, maxScriptArgsPerPair)
	}
	stats, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	// Settlement claims the final entry's id with the SADD that appends
	// it; asking SISMEMBER first was a command more per release.
	if n := commandCalls(stats, "sismember"); n != 0 {
		t.Errorf("SISMEMBER ran %d times in %d pairs; want 0", n, pairs)
	}
	if n := commandCalls(stats, "sadd"); n != pairs {
		t.Errorf("SADD ran %d times in %d pairs; want 1 a pair (the ledger entry's id)", n, pairs)
	}
}

// maxScriptArgsPerPair is what an acquire+release pair's four scripts
// carry (keys and arguments): the admission script's 15 keys and its
// arguments (now, workspace id, each check's few, and the record's
// fields), and the other three's.
const maxScriptArgsPerPair = 104

// commandCalls is the calls of cmd in INFO commandstats.
func commandCalls(stats, cmd string) int {
	_, rest, ok := strings.Cut(stats, "cmdstat_"+cmd+":calls=")
	if !ok {
		return 0
	}
	end := strings.IndexByte(rest, ',')
	if end < 0 {
		return 0
	}
	n, _ := strconv.Atoi(rest[:end])
	return n
}
