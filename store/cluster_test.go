package store_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/store"
)

// gatewayClients returns n clients of a fresh Redis of the topology, as n
// gateways would hold: on a cluster each is seeded with a different node.
func gatewayClients(t *testing.T, topology string, n int) []redis.UniversalClient {
	t.Helper()
	var out []redis.UniversalClient
	switch topology {
	case "single":
		s := redistest.Start(t)
		for range n {
			out = append(out, s.Client())
		}
	case "cluster":
		c := redistest.StartCluster(t)
		for i := range n {
			rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{c.Addrs[i%len(c.Addrs)]}, ClusterStateReloadInterval: time.Second})
			t.Cleanup(func() { rdb.Close() })
			out = append(out, rdb)
		}
	}
	return out
}

// TestInvalidateReachesEveryGateway: a broker-wide stop set through one
// gateway's client has dropped the caches of every subscribed gateway
// by the time the call returns, on one Redis and on a cluster (where
// each gateway's client was seeded with another node), and every
// gateway reads the stop beside its account's controls.
func TestInvalidateReachesEveryGateway(t *testing.T) {
	for _, topo := range redistest.Topologies {
		t.Run(topo, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			clients := gatewayClients(t, topo, 4)
			var dropped [3]atomic.Int64
			for i := range dropped {
				db := store.New(store.Config{}, clients[i+1])
				ready := make(chan struct{})
				go db.Subscribe(ctx, func() { close(ready) }, func() { dropped[i].Add(1) })
				select {
				case <-ready:
				case <-ctx.Done():
					t.Fatalf("gateway %d never subscribed", i)
				}
			}
			admin := store.New(store.Config{}, clients[0])
			stop := &store.Control{Reason: "operator", Actor: "ops", Since: time.Now().UnixMilli()}
			if err := admin.SetGlobalStop(ctx, stop); err != nil {
				t.Fatal(err)
			}
			for i := range dropped {
				if got := dropped[i].Load(); got != 1 {
					t.Errorf("gateway %d dropped its caches %d times once the stop was set; want 1", i, got)
				}
				c, err := store.New(store.Config{}, clients[i+1]).ControlsFor(ctx, "acct_x", "inst_y")
				if err != nil {
					t.Fatal(err)
				}
				if c.GlobalStop == nil || c.GlobalStop.Reason != "operator" {
					t.Errorf("gateway %d reads global stop %+v; want the operator's", i, c.GlobalStop)
				}
			}
		})
	}
}
