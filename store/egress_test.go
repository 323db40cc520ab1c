package store_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/store"
)

// TestAddEgress: a proxy's count is added to a starting or running
// workspace's record as far as the record lacks it (a count sent again, or
// an older one, adds nothing; another counter's adds to it), left to a
// terminating one's end, and refused as ended for a terminated workspace
// or none; the end then adds what the record lacks of its count.
func TestAddEgress(t *testing.T) {
	eachDB(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		now := time.Now().UTC()
		acct, inst := sandgate.NewID(sandgate.PrefixAccount), sandgate.NewID(sandgate.PrefixInstance)
		running := newRunning(t, db, acct, inst, now)
		starting, _ := newStarting(t, db, acct, inst, now)
		ending := newRunning(t, db, acct, inst, now)
		if _, started, err := db.BeginTerminate(ctx, ending, sandgate.ReasonReleased, now); err != nil || !started {
			t.Fatalf("BeginTerminate = %v, %v", started, err)
		}
		ended := newRunning(t, db, acct, inst, now)
		terminated(t, db, ended, now)
		add := func(w sandgate.Workspace, counter string, out, in int64) store.EgressAdd {
			return store.EgressAdd{AccountID: acct, WorkspaceID: w.ID, Egress: store.Egress{Counter: counter, Out: out, In: in}}
		}
		adds := []store.EgressAdd{add(running, "p.1", 10, 100), add(starting, "p.2", 1, 0), add(ending, "p.3", 7, 7), add(ended, "p.4", 5, 5),
			{AccountID: acct, WorkspaceID: sandgate.NewID(sandgate.PrefixWorkspace), Egress: store.Egress{Counter: "p.5", Out: 1, In: 1}},
			add(running, "p.1", 12, 103), // the same count, later: 2 and 3 more
			add(running, "p.1", 10, 100), // sent again late: nothing
			add(running, "q.1", 5, 5),    // another process's count
		}
		got, err := db.AddEgress(ctx, adds)
		if err != nil {
			t.Fatalf("AddEgress: %v", err)
		}
		want := []int{store.EgressAdded, store.EgressAdded, store.EgressNotAdded, store.EgressEnded, store.EgressEnded, store.EgressAdded, store.EgressAdded, store.EgressAdded}
		if !slices.Equal(got, want) {
			t.Fatalf("AddEgress = %v; want %v", got, want)
		}
		egressIs(t, db, acct, map[sandgate.Workspace][2]int64{running: {17, 108}, starting: {1, 0}, ending: {0, 0}, ended: {0, 0}})
		if got, err := db.AddEgress(ctx, adds[:1]); err != nil || !slices.Equal(got, want[:1]) {
			t.Fatalf("AddEgress again = %v, %v; want %v", got, err, want[:1])
		}
		egressIs(t, db, acct, map[sandgate.Workspace][2]int64{running: {17, 108}})
		if _, started, err := db.BeginTerminate(ctx, running, sandgate.ReasonReleased, now); err != nil || !started {
			t.Fatalf("BeginTerminate = %v, %v", started, err)
		}
		if err := db.FinishTerminate(ctx, running, now, store.Egress{Counter: "p.1", Out: 13, In: 104}); err != nil {
			t.Fatal(err)
		}
		egressIs(t, db, acct, map[sandgate.Workspace][2]int64{running: {18, 109}}) // the end's count less what was recorded of it
		if got, err := db.AddEgress(ctx, nil); err != nil || got != nil {
			t.Errorf("AddEgress of nothing = %v, %v; want nothing, no round trip", got, err)
		}
	})
}

// TestAddEgressDurable: over a Durable client the adds wait for the
// replicas like every script: without one they are in doubt (written on
// the primary, not acknowledged), and sending the same count again once
// they can be acknowledged adds nothing twice. On a cluster the adds of
// workspaces on different primaries are each acknowledged.
func TestAddEgressDurable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now().UTC()
	t.Run("no replica", func(t *testing.T) {
		t.Parallel()
		rdb := redistest.Start(t).Client()
		plain, durable := store.New(store.Config{}, rdb), store.New(store.Config{}, store.Durable(rdb, 1, 20*time.Millisecond))
		acct := sandgate.NewID(sandgate.PrefixAccount)
		w := newRunning(t, plain, acct, sandgate.NewID(sandgate.PrefixInstance), now)
		add := []store.EgressAdd{{AccountID: acct, WorkspaceID: w.ID, Egress: store.Egress{Counter: "p.1", Out: 40, In: 400}}}
		if got, err := durable.AddEgress(ctx, add); !errors.Is(err, store.ErrNotReplicated) {
			t.Fatalf("AddEgress without a replica = %v, %v; want ErrNotReplicated", got, err)
		}
		egressIs(t, plain, acct, map[sandgate.Workspace][2]int64{w: {40, 400}}) // on the primary, in doubt
		if got, err := plain.AddEgress(ctx, add); err != nil || !slices.Equal(got, []int{store.EgressAdded}) {
			t.Fatalf("AddEgress again = %v, %v; want added", got, err)
		}
		egressIs(t, plain, acct, map[sandgate.Workspace][2]int64{w: {40, 400}})
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		c := redistest.StartCluster(t)
		rdb := c.Client()
		defer rdb.Close()
		db := store.New(store.Config{}, store.Durable(rdb, 1, 2*time.Second))
		var adds []store.EgressAdd
		want := map[sandgate.Workspace][2]int64{}
		nodes := map[string]bool{}
		for i := range 12 {
			acct := sandgate.NewID(sandgate.PrefixAccount)
			w := newRunning(t, db, acct, sandgate.NewID(sandgate.PrefixInstance), now)
			adds = append(adds, store.EgressAdd{AccountID: acct, WorkspaceID: w.ID, Egress: store.Egress{Counter: "p.1", Out: int64(i + 1), In: 2}})
			want[w] = [2]int64{int64(i + 1), 2}
			m, err := rdb.MasterForKey(ctx, "sg:{"+acct+"}:x")
			if err != nil {
				t.Fatal(err)
			}
			nodes[m.Options().Addr] = true
		}
		if len(nodes) < 2 {
			t.Fatalf("12 accounts on %d primaries; want several", len(nodes))
		}
		got, err := db.AddEgress(ctx, adds)
		if err != nil || len(got) != len(adds) || slices.ContainsFunc(got, func(n int) bool { return n != store.EgressAdded }) {
			t.Fatalf("AddEgress = %v, %v; want every one added", got, err)
		}
		for w, n := range want {
			egressIs(t, db, w.AccountID, map[sandgate.Workspace][2]int64{w: n})
		}
	})
}

// egressIs checks each workspace's recorded egress bytes, out and in.
func egressIs(t *testing.T, db *store.DB, acct string, want map[sandgate.Workspace][2]int64) {
	t.Helper()
	for w, n := range want {
		r, err := db.Workspace(context.Background(), acct, w.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r.EgressBytesOut != n[0] || r.EgressBytesIn != n[1] {
			t.Errorf("%s (%s): egress %d out, %d in; want %d, %d", w.ID, w.State, r.EgressBytesOut, r.EgressBytesIn, n[0], n[1])
		}
	}
}

// TestEgressKey: every gateway of a store gets the same 32-byte egress
// credential key, made by the first to ask.
func TestEgressKey(t *testing.T) {
	redistest.Each(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		a, err := store.New(store.Config{}, rdb).EgressKey(ctx)
		if err != nil {
			t.Fatalf("EgressKey: %v", err)
		}
		b, err := store.New(store.Config{}, rdb).EgressKey(ctx)
		if err != nil {
			t.Fatalf("EgressKey again: %v", err)
		}
		if len(a) != 32 || !slices.Equal(a, b) {
			t.Errorf("EgressKey = %x, then %x; want the same 32 bytes", a, b)
		}
	})
}
