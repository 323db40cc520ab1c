package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/store"
)

// TestAddEgress: a proxy's bytes are added to a starting or running
// workspace's record (twice adds twice), left to a terminating one's end,
// and refused as ended for a terminated workspace or none; the end then
// adds what its process still holds to what the record has.
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
		add := func(w sandgate.Workspace, out, in int64) store.EgressAdd {
			return store.EgressAdd{AccountID: acct, WorkspaceID: w.ID, Egress: store.Egress{Out: out, In: in}}
		}
		adds := []store.EgressAdd{add(running, 10, 100), add(starting, 1, 0), add(ending, 7, 7), add(ended, 5, 5),
			{AccountID: acct, WorkspaceID: sandgate.NewID(sandgate.PrefixWorkspace), Egress: store.Egress{Out: 1, In: 1}},
			add(running, 2, 3)}
		got, err := db.AddEgress(ctx, adds)
		if err != nil {
			t.Fatalf("AddEgress: %v", err)
		}
		want := []int{store.EgressAdded, store.EgressAdded, store.EgressNotAdded, store.EgressEnded, store.EgressEnded, store.EgressAdded}
		if !slices.Equal(got, want) {
			t.Fatalf("AddEgress = %v; want %v", got, want)
		}
		for _, c := range []struct {
			w       sandgate.Workspace
			out, in int64
		}{{running, 12, 103}, {starting, 1, 0}, {ending, 0, 0}, {ended, 0, 0}} {
			r, err := db.Workspace(ctx, acct, c.w.ID)
			if err != nil {
				t.Fatal(err)
			}
			if r.EgressBytesOut != c.out || r.EgressBytesIn != c.in {
				t.Errorf("%s (%s): egress %d out, %d in; want %d, %d", c.w.ID, c.w.State, r.EgressBytesOut, r.EgressBytesIn, c.out, c.in)
			}
		}
		if _, started, err := db.BeginTerminate(ctx, running, sandgate.ReasonReleased, now); err != nil || !started {
			t.Fatalf("BeginTerminate = %v, %v", started, err)
		}
		if err := db.FinishTerminate(ctx, running, now, store.Egress{Out: 1, In: 1}); err != nil {
			t.Fatal(err)
		}
		if r, err := db.Workspace(ctx, acct, running.ID); err != nil || r.EgressBytesOut != 13 || r.EgressBytesIn != 104 {
			t.Errorf("after the end: egress %d out, %d in (%v); want 13, 104 (the record's and the end's)", r.EgressBytesOut, r.EgressBytesIn, err)
		}
		if got, err := db.AddEgress(ctx, nil); err != nil || got != nil {
			t.Errorf("AddEgress of nothing = %v, %v; want nothing, no round trip", got, err)
		}
	})
}
