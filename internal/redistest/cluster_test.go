package redistest_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/redistest"
)

// TestSlotMatchesCluster checks the CRC16 slot function against the
// cluster's own CLUSTER KEYSLOT, hash tags included.
func TestSlotMatchesCluster(t *testing.T) {
	t.Parallel()
	if got := redistest.Slot("123456789"); got != 0x31C3%16384 {
		t.Fatalf("Slot(123456789) = %d, want %d (the spec's CRC16 check value)", got, 0x31C3%16384)
	}
	c := redistest.StartCluster(t)
	rdb := c.Client()
	defer rdb.Close()
	ctx := context.Background()
	for _, k := range []string{"sg:accounts", "sg:{acct_x}:account", "sg:{acct_x}:inst:i:live", "{}x", "a{}b{c}", "x{y", "sg:{reaper}:fence", "sg:token:9f86"} {
		want, err := rdb.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := redistest.Slot(k); int64(got) != want {
			t.Errorf("Slot(%q) = %d, cluster says %d", k, got, want)
		}
	}
}

// TestClusterFailover kills the primary of a key and checks that its
// replica, promoted, serves the key's last acknowledged write.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t)
	rdb := c.Client()
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	m, err := rdb.MasterForKey(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Wait(ctx, 1, 5000).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.KillPrimaryOf(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitFailover(ctx); err != nil {
		t.Fatal(err)
	}
	var got string
	for {
		got, err = rdb.Get(ctx, "k").Result()
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got != "v" {
		t.Fatalf("after failover GET k = %q, %v; want v", got, err)
	}
}
