package gateway_test

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/fakeprovider"
	"github.com/sandgate/sandgate/protocol"
)

// TestListPagingUnderChurn: 250 workspaces created over time, paged with
// limit 7 while others are created and released: no duplicates, and no
// misses among those alive for the whole walk (state=live), or among all
// that existed when it began (state=all).
func TestListPagingUnderChurn(t *testing.T) {
	t.Parallel()
	e := snapStart(t, fakeprovider.New(), nil)
	ctx := context.Background()
	var ids []string
	for range 250 {
		ids = append(ids, e.acquire("").WorkspaceID)
		e.clock.Advance(time.Duration(rand.IntN(3)) * time.Millisecond) // some share a millisecond
	}
	rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	stable, volatile := ids[:150], ids[150:]

	for _, state := range []string{"live", "all"} {
		t.Run(state, func(t *testing.T) {
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var mu sync.Mutex
			var released []string
			wg.Go(func() { // churn until the walk ends
				for i := 0; i < 300; i++ {
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
					if _, _, err := e.cl.Acquire(ctx, sandgate.NewID("churn-"), snapAcquireReq("")); err != nil {
						t.Errorf("Acquire: %v", err)
						return
					}
					mu.Lock()
					if len(volatile) > 0 {
						id := volatile[0]
						volatile = volatile[1:]
						released = append(released, id)
						mu.Unlock()
						if _, err := e.cl.Release(ctx, id); err != nil {
							t.Errorf("Release: %v", err)
						}
					} else {
						mu.Unlock()
					}
				}
			})
			seen := map[string]int{}
			cursor, pages := "", 0
			for {
				page, err := e.cl.ListWorkspaces(ctx, state, cursor, 7)
				if err != nil {
					t.Fatalf("ListWorkspaces: %v", err)
				}
				if len(page.Workspaces) > 7 {
					t.Fatalf("page of %d; want at most 7", len(page.Workspaces))
				}
				for _, w := range page.Workspaces {
					seen[w.WorkspaceID]++
				}
				pages++
				if page.NextCursor == nil {
					break
				}
				cursor = *page.NextCursor
			}
			close(stop)
			wg.Wait()
			for id, n := range seen {
				if n != 1 {
					t.Errorf("workspace %s listed %d times", id, n)
				}
			}
			want := stable
			if state == "all" {
				want = append(append([]string{}, stable...), released...)
			}
			for _, id := range want {
				if seen[id] != 1 {
					t.Errorf("workspace %s listed %d times; want once", id, seen[id])
				}
			}
			if pages < 250/7 || len(released) == 0 {
				t.Errorf("%d pages, %d released during the walk; want churn across at least %d pages", pages, len(released), 250/7)
			}
		})
	}
}

// TestStatusTermination: the status object always carries terminated_at
// and termination_reason (null while live), and metered_seconds once the
// end is confirmed.
func TestStatusTermination(t *testing.T) {
	t.Parallel()
	fake := fakeprovider.New()
	e := snapStart(t, fake, nil)
	fake.Set(func(p *fakeprovider.Provider) { p.Clock = e.clock }) // metered time is the test clock's
	ws := e.acquire("").WorkspaceID
	get := func() map[string]any {
		t.Helper()
		st, b := e.do(http.MethodGet, "/v1/workspaces/"+ws, nil, nil)
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil || st != http.StatusOK {
			t.Fatalf("GET = %d %s", st, b)
		}
		return m
	}
	m := get()
	if v, ok := m["terminated_at"]; !ok || v != nil {
		t.Errorf("live terminated_at = %v (present %v); want null", v, ok)
	}
	if v, ok := m["termination_reason"]; !ok || v != nil {
		t.Errorf("live termination_reason = %v (present %v); want null", v, ok)
	}
	if _, ok := m["metered_seconds"]; ok {
		t.Errorf("live status carries metered_seconds")
	}
	e.clock.Advance(90 * time.Second)
	st, b := e.do(http.MethodDelete, "/v1/workspaces/"+ws, nil, nil)
	var rel protocol.Workspace
	json.Unmarshal(b, &rel)
	if st != http.StatusOK || rel.State != string(sandgate.WorkspaceTerminated) || rel.TerminatedAt == nil ||
		rel.TerminationReason == nil || *rel.TerminationReason != "released" || rel.MeteredSeconds == nil {
		t.Fatalf("release = %d %s; want terminated, released, with terminated_at and metered_seconds", st, b)
	}
	m = get()
	if m["termination_reason"] != "released" || m["terminated_at"] == nil || m["metered_seconds"] == nil {
		t.Errorf("status after release = %v; want the termination fields", m)
	}
	if n, _ := m["metered_seconds"].(float64); n != 90 {
		t.Errorf("metered_seconds = %v; want 90", m["metered_seconds"])
	}
}
