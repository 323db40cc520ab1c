package store

import (
	"testing"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/redistest"
)

// TestScriptsTouchOneSlot lists every Lua script of the store with the
// KEYS of each of its call sites, built by the same key builders, and
// checks that each call touches one Redis Cluster hash slot (and that no
// script of the package is missing from the list). A new script needs a
// row here; redistest.CheckSlots checks the scripts tests actually run.
func TestScriptsTouchOneSlot(t *testing.T) {
	for _, acct := range []string{"acct_a", "acct_9zq", "acct_x"} {
		inst, ws, snap, key := "inst_b", "ws_c", "snap_d", "3a7b"
		w := sandgate.Workspace{AccountID: acct, InstanceID: inst, ID: ws}
		s := sandgate.Snapshot{AccountID: acct, InstanceID: inst, ID: snap}
		var db *DB
		redistest.CheckScripts(t, ".", []redistest.Script{
			{Var: "confirmScript", Keys: [][]string{{liveKey(acct, inst), workspaceKey(acct, ws), idempotencyKey(acct, inst, OpAcquire, key), openKey(acct)}}},
			{Var: "abortScript", Keys: [][]string{{liveKey(acct, inst), workspaceKey(acct, ws), idempotencyKey(acct, inst, OpAcquire, key),
				workspaceIndexKey(acct, inst), openKey(acct), velocityKey(acct), liveIndexKey(acct, inst)}}},
			{Var: "terminateScript", Keys: [][]string{{liveKey(acct, inst), workspaceKey(acct, ws), openKey(acct)}}},
			{Var: "finishScript", Keys: [][]string{{workspaceKey(acct, ws), liveIndexKey(acct, inst)}}},
			{Var: "addEgressScript", Keys: [][]string{{workspaceKey(acct, ws)}}},
			{Var: "indexLiveScript", Keys: [][]string{{liveIndexKey(acct, inst), workspaceKey(acct, ws), workspaceKey(acct, "ws_d")}}},
			{Var: "freePendingKeyScript", Keys: [][]string{{idempotencyKey("acct_a", "inst_b", OpAcquire, "3a7b")}}},
			{Var: "freeKeyOfScript", Keys: [][]string{{idempotencyKey(acct, inst, OpAcquire, key)}}},
			{Var: "auditScript", Keys: [][]string{{auditKey()}, {auditKey(), auditOnceKey()}}},
			{Var: "beginSnapshotScript", Keys: [][]string{snapshotKeys(s, key)}},
			{Var: "confirmSnapshotScript", Keys: [][]string{snapshotKeys(s, key)}},
			{Var: "abortSnapshotScript", Keys: [][]string{snapshotKeys(s, key)}},
			{Var: "deleteSnapshotScript", Keys: [][]string{{snapshotKey(acct, snap), snapshotQuotaKey(acct, inst), snapshotExpiryKey(acct),
				snapshotGCKey(acct), snapshotBytesKey(acct, inst)}}},
			{Var: "purgeSnapshotScript", Keys: [][]string{{snapshotKey(acct, snap), snapshotGCKey(acct)}}},
			{Var: "claimCommandScript", Keys: [][]string{db.commandKeys(w, key)}},
			{Var: "launchedCommandScript", Keys: [][]string{{commandKey(acct, ws, key)}}},
			{Var: "unclaimCommandScript", Keys: [][]string{db.commandKeys(w, key)}},
			{Var: "cancelCommandScript", Keys: [][]string{db.commandKeys(w, key)[:2]}},
			{Var: "finishCommandScript", Keys: [][]string{db.commandKeys(w, key)}},
			{Var: "failCreateScript", Keys: [][]string{
				{liveKey(acct, inst), workspaceKey(acct, ws), openKey(acct), idempotencyKey(acct, inst, OpAcquire, key)},
				{liveKey(acct, inst), workspaceKey(acct, ws), openKey(acct), workspaceKey(acct, ws) + ":nokey"},
			}},
			{Var: "freeSlotScript", Keys: [][]string{{openKey(acct), workspaceKey(acct, ws)}, {liveKey(acct, inst), workspaceKey(acct, ws)}}},
			{Var: "execBusyScript", Keys: [][]string{{workspaceKey(acct, ws), busyKey(acct, ws)}}},
			{Var: "execStartScript", Keys: [][]string{{workspaceKey(acct, ws), busyKey(acct, ws)}}},
			{Var: "leaderScript", Keys: [][]string{{reaperLeaderKey(), reaperFenceKey()}}},
			{Var: "releaseLeaderScript", Keys: [][]string{{reaperLeaderKey()}}},
			{Var: "claimNameScript", Keys: [][]string{{accountNamesKey()}}},
			{Var: "releaseNameScript", Keys: [][]string{{accountNamesKey()}}},
		})
		// The admission script's keys (composed by admission/ from these
		// builders) are checked in admission's own slot test.
		k := AdmissionKeys(acct, inst, ws, key)
		if keys := []string{k.Live, k.Workspace, k.Idempotency, k.Index, k.LiveIndex, k.Open, k.Velocity, k.Risk, k.Controls}; !redistest.OneSlot(keys) {
			t.Errorf("AdmissionKeys(%s) span slots: %v", acct, keys)
		}
	}
}
