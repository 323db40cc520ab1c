package billing

import (
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/store"
)

// TestScriptsTouchOneSlot lists every Lua script of billing with the KEYS
// of each call site, built by the same key builders, and checks that each
// call touches one Redis Cluster hash slot (and that no script of the
// package is missing). It also checks the whole admission script as the
// broker composes it, billing's checks included. A new script needs a row
// here.
func TestScriptsTouchOneSlot(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, a := range []string{"acct_a", "acct_9zq"} {
		w := sandgate.Workspace{AccountID: a, InstanceID: "inst_b", ID: "ws_c", Agent: "bot", CreatedAt: now}
		m, next := month(now), month(now.AddDate(0, 1, 0))
		charge := []string{fundsKey(a), holdsKey(a), usageKey(a), usageIDsKey(a), spendKey(a, m), budgetsKey(a), alertsKey(a),
			store.AdmissionKeys(a, "", w.ID, "").Workspace, spendKey(a, m), alertedKey(a, m), spendKey(a, next), alertedKey(a, next)}
		redistest.CheckScripts(t, ".", []redistest.Script{
			{Var: "releaseScript", Keys: [][]string{{fundsKey(a), holdsKey(a), spendKey(a, "none")}, {fundsKey(a), holdsKey(a), spendKey(a, m)}}},
			{Var: "adjustUsageScript", Keys: [][]string{{fundsKey(a), usageKey(a), usageIDsKey(a)}}},
			{Var: "adjustScript", Keys: [][]string{{fundsKey(a), fundsLedgerKey(a), fundsIDsKey(a)}}},
			{Var: "appendScript", Keys: [][]string{{usageKey(a), usageIDsKey(a)}}},
			{Var: "chargeScript", Keys: [][]string{charge}},
			{Var: "finishSettleScript", Keys: [][]string{append(charge, store.AdmissionKeys(a, w.InstanceID, w.ID, "").LiveIndex)}},
			{Var: "enqueueScript", Keys: [][]string{{webhookDeliveriesKey(), webhookDueKey(), webhookDoneKey("ev_1")}}},
			{Var: "claimScript", Keys: [][]string{{webhookDueKey(), webhookDeliveriesKey()}}},
			{Var: "finishScript", Keys: [][]string{{webhookDueKey(), webhookDeliveriesKey(), webhookDoneKey("ev_1"), webhookDeadKey()}}},
			{Var: "createCardScript", Keys: [][]string{{rateCardKey("std")}}},
			{Var: "setCardCurrencyScript", Keys: [][]string{{rateCardKey("std")}}},
			{Var: "dequeueAlertsScript", Keys: [][]string{{alertsKey(a)}}},
		})
		r := &admission.Request{Workspace: w, Keys: store.AdmissionKeys(a, w.InstanceID, w.ID, "3a7b"), KeyHash: "3a7b", Now: now}
		var keys []string
		for _, c := range admission.Standard(nil, admission.StandardConfig{Billing: []admission.Check{FundsCheck{}, BudgetCheck{}}}) {
			k, _ := c.Bind(r)
			keys = append(keys, k...)
		}
		if !redistest.OneSlot(keys) {
			t.Errorf("the admission script's keys span slots: %v", keys)
		}
	}
}
