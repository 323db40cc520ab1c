package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/store"
)

// TestScriptsSentTwice: go-redis sends a command again when its reply is
// lost (a read timeout, a reset connection) although Redis may have run
// it. The admission, the confirm of a create, and a snapshot's begin and
// confirm each answer their own second run as the first: admitted,
// confirmed, begun, live; never a replay of themselves or a refusal that
// would make the caller end a healthy sandbox or delete a live snapshot.
// Another request with the same key is still a replay.
func TestScriptsSentTwice(t *testing.T) {
	eachDB(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Millisecond)
		acct, inst := sandgate.NewID(sandgate.PrefixAccount), sandgate.NewID(sandgate.PrefixInstance)

		p := unlimitedAdmission(db)
		key := sandgate.NewID("k")
		request := func(w sandgate.Workspace) *admission.Request {
			return &admission.Request{Workspace: w, Scope: sandgate.Scope{Limits: sandgate.Limits{MaxConcurrentWorkspaces: 1 << 20}},
				Keys: store.AdmissionKeys(acct, inst, w.ID, key), KeyHash: key, RequestHash: "h", Now: now}
		}
		w := sandgate.Workspace{ID: sandgate.NewID(sandgate.PrefixWorkspace), AccountID: acct, InstanceID: inst,
			Label: "l", Size: "small", Image: "host", State: sandgate.WorkspaceStarting,
			CreatedAt: now, ExpiresAt: now.Add(time.Hour), IdleTimeout: time.Minute, LastActivity: now}
		for i := range 2 {
			if err := p.Admit(ctx, request(w)); err != nil {
				t.Fatalf("admit, run %d: %v; want admitted", i+1, err)
			}
		}
		other := w
		other.ID = sandgate.NewID(sandgate.PrefixWorkspace)
		if rec, ok := admission.IsReplay(p.Admit(ctx, request(other))); !ok || rec.WorkspaceID != w.ID {
			t.Fatalf("another request with the key = %+v, %v; want a replay of %s", rec, ok, w.ID)
		}
		for i := range 2 {
			got, ok, err := db.ConfirmRecord(ctx, w, "ref-1", now, key, "h")
			if err != nil || !ok || got.State != sandgate.WorkspaceRunning || got.ProviderRef != "ref-1" {
				t.Fatalf("confirm, run %d = %s %q, %v, %v; want confirmed, running", i+1, got.State, got.ProviderRef, ok, err)
			}
		}
		if got, err := db.Workspace(ctx, acct, w.ID); err != nil || got.State != sandgate.WorkspaceRunning {
			t.Fatalf("record after two confirms = %s, %v; want running", got.State, err)
		}
		// A confirm of another create (another ref) is still refused.
		if _, ok, err := db.ConfirmRecord(ctx, w, "ref-2", now.Add(time.Second), key, "h"); err != nil || ok {
			t.Errorf("confirm with another ref = %v, %v; want refused", ok, err)
		}

		s := newSnapshot(acct, inst, now)
		for i := range 2 {
			if err := db.BeginSnapshot(ctx, s, 3, 0, now.Add(time.Minute), "snapkey", "h", now); err != nil {
				t.Fatalf("begin snapshot, run %d: %v; want begun", i+1, err)
			}
		}
		var replay *store.SnapshotReplay
		if err := db.BeginSnapshot(ctx, newSnapshot(acct, inst, now), 3, 0, now.Add(time.Minute), "snapkey", "h", now); !errors.As(err, &replay) || replay.Record.SnapshotID != s.ID {
			t.Fatalf("another snapshot with the key = %v; want a replay of %s", err, s.ID)
		}
		for i := range 2 {
			if err := db.ConfirmSnapshot(ctx, s, "sref", "/workspace/d", "snapkey", "h", 0, now); err != nil {
				t.Fatalf("confirm snapshot, run %d: %v; want live", i+1, err)
			}
		}
		if got, err := db.Snapshot(ctx, acct, s.ID); err != nil || got.State != sandgate.SnapshotLive {
			t.Fatalf("snapshot after two confirms = %s, %v; want live", got.State, err)
		}

		// A durable command's claim, sent twice: claimed once, both runs
		// answered as the claim; another call's claim is refused.
		for i := range 2 {
			if err := store.ClaimCommandNonce(db, ctx, readWorkspace(t, db, acct, w.ID), "cmd", now, now.Add(time.Minute), now.Add(time.Hour), "nonce-1"); err != nil {
				t.Fatalf("claim, run %d: %v; want claimed", i+1, err)
			}
		}
		var claimed *store.CommandClaimed
		if err := db.ClaimCommand(ctx, readWorkspace(t, db, acct, w.ID), "cmd", now, now.Add(time.Minute), now.Add(time.Hour)); !errors.As(err, &claimed) || claimed.State != sandgate.CommandStarting {
			t.Fatalf("another claim = %v; want claimed before, starting", err)
		}
	})
}

// readWorkspace reads workspace id's record.
func readWorkspace(t *testing.T, db *store.DB, acct, id string) sandgate.Workspace {
	t.Helper()
	w, err := db.Workspace(context.Background(), acct, id)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestCreateAccountSentTwice: an account's create sent again unchanged
// (its reply lost) stores and lists it once; another create of the same id
// is refused.
func TestCreateAccountSentTwice(t *testing.T) {
	eachDB(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		a := sandgate.Account{ID: sandgate.NewID(sandgate.PrefixAccount), Name: "twice", CreatedAt: time.Now().UTC()}
		for i := range 2 {
			if err := db.CreateAccount(ctx, a); err != nil {
				t.Fatalf("create, run %d: %v", i+1, err)
			}
		}
		b := a
		b.Name = "another"
		if err := db.CreateAccount(ctx, b); !errors.Is(err, store.ErrExists) {
			t.Fatalf("another create of %s = %v; want ErrExists", a.ID, err)
		}
		all, err := db.Accounts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, x := range all {
			if x.ID == a.ID {
				n++
				if x.Name != "twice" {
					t.Errorf("account %s named %q; want the first create's", a.ID, x.Name)
				}
			}
		}
		if n != 1 {
			t.Errorf("account %s listed %d times; want once", a.ID, n)
		}
	})
}
