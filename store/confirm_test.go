package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/store"
)

// TestConfirmSlotDeadlineUnchanged: a workspace whose lifetime ends when
// its pending slot would (expires_at equal to the pending deadline) is
// confirmed, and holds its slot: moving the slot's deadline changes
// nothing then, and the confirm must not read that as a pruned slot.
func TestConfirmSlotDeadlineUnchanged(t *testing.T) {
	eachDB(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Millisecond)
		acct, inst := sandgate.NewID("acct_"), sandgate.NewID("inst_")
		w := sandgate.Workspace{
			ID: sandgate.NewID(sandgate.PrefixWorkspace), AccountID: acct, InstanceID: inst,
			Label: "l", Size: "small", Image: "host", State: sandgate.WorkspaceStarting,
			CreatedAt: now, ExpiresAt: now.Add(time.Minute), LastActivity: now,
		}
		key := sandgate.NewID("k")
		p := unlimitedAdmission(db) // its pending timeout is a minute: the slot's deadline is expires_at
		if err := p.Admit(ctx, &admission.Request{Workspace: w, Scope: sandgate.Scope{Limits: sandgate.Limits{MaxConcurrentWorkspaces: 4}},
			Keys: store.AdmissionKeys(acct, inst, w.ID, key), KeyHash: key, RequestHash: "h", Now: now}); err != nil {
			t.Fatalf("Admit: %v", err)
		}
		ok, err := db.Confirm(ctx, w, "ref", now, key, "h")
		if err != nil || !ok {
			t.Fatalf("Confirm = %v, %v; want true, nil", ok, err)
		}
		got, err := db.Workspace(ctx, acct, w.ID)
		if err != nil || got.State != sandgate.WorkspaceRunning || got.ProviderRef != "ref" {
			t.Fatalf("record after Confirm = %+v, %v; want running with ref", got, err)
		}
		if n, err := db.LiveCount(ctx, acct, inst, now); err != nil || n != 1 {
			t.Fatalf("LiveCount = %d, %v; want 1", n, err)
		}
	})
}
