package gateway_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/providers/noop"
)

// TestRedisWorkPerPair counts the commands Redis runs for an acquire and
// its release on the noop provider (INFO commandstats counts every command
// a script calls): four script calls, and within them no read the pair
// does not need. The confirm of a workspace still starting in its slot
// does not read its Idempotency-Key back (only the admission's claim
// check reads it), and a release's terminate answers the record it read.
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
	const budget = 34 // commands a pair's scripts run, at most
	if inner > budget*pairs {
		t.Errorf("Redis ran %.1f commands a pair inside its scripts, want at most %d: %v", float64(inner)/pairs, budget, calls)
	}
}
