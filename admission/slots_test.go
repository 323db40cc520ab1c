package admission

import (
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/store"
)

// TestScriptsTouchOneSlot lists every Lua script of admission with the
// KEYS of each call site and checks that each touches one Redis Cluster
// hash slot: the rate limiter's, and the admission script composed by
// New from the standard checks (billing's slot test adds its checks).
func TestScriptsTouchOneSlot(t *testing.T) {
	w := sandgate.Workspace{AccountID: "acct_a", InstanceID: "inst_b", ID: "ws_c"}
	r := &Request{Workspace: w, Keys: store.AdmissionKeys(w.AccountID, w.InstanceID, w.ID, "3a7b"), Now: time.Unix(0, 0)}
	var pipeline []string
	for _, c := range Standard(nil, StandardConfig{}) {
		k, _ := c.Bind(r)
		pipeline = append(pipeline, k...)
	}
	redistest.CheckScripts(t, ".", []redistest.Script{
		{Var: "borrowScript", Keys: [][]string{{rateKey("lse_1", ClassAcquire)}}},
		{Var: "Pipeline (New)", Keys: [][]string{pipeline}},
	})
}
