package stripesync

import (
	"testing"

	"github.com/sandgate/sandgate/internal/redistest"
)

// TestScriptsTouchOneSlot lists every Lua script of stripesync with the
// KEYS of each call site, built by the same key builders, and checks that
// each touches one Redis Cluster hash slot. A new script needs a row here.
func TestScriptsTouchOneSlot(t *testing.T) {
	for _, a := range []string{"acct_a", "acct_9zq"} {
		redistest.CheckScripts(t, ".", []redistest.Script{
			{Var: "setSettingsScript", Keys: [][]string{{settingsKey(a)}}},
			{Var: "renewScript", Keys: [][]string{{leaseKey(a)}}},
			{Var: "releaseScript", Keys: [][]string{{leaseKey(a)}}},
			{Var: "advanceScript", Keys: [][]string{{leaseKey(a), cursorKey(a), stateKey(a), deadKey(a)}}},
			{Var: "failScript", Keys: [][]string{{stateKey(a)}}},
			{Var: "requeuedScript", Keys: [][]string{{leaseKey(a), retryKey(a), deadKey(a), stateKey(a)}}},
			{Var: "retryScript", Keys: [][]string{{deadKey(a), retryKey(a)}}},
		})
		if !redistest.OneSlot([]string{settingsKey(a), "sg:{" + a + "}:usage", cursorKey(a)}) {
			t.Errorf("%s: the settings, ledger and cursor keys span slots", a)
		}
	}
}
