package admin_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/admin"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/protocol"
)

// TestBillingRolesAndIdempotentFunds: admins write billing, finance and
// operators read it; a credit retried with its key applies once, and a
// key reused for another amount is a conflict.
func TestBillingRolesAndIdempotentFunds(t *testing.T) {
	e := newEnv(t)
	acct := e.account()
	card := adminapi.RateCardRequest{Name: "std", Currency: "EUR", Prices: map[string]string{"small": "0.0001", "standard": "0.0002", "large": "0.0004", "xlarge": "0.0008"}}
	if st, code := e.refused(financeToken, http.MethodPost, "/rate-cards", card); st != 403 || code != protocol.Forbidden {
		t.Fatalf("finance creating a rate card: %d %s; want 403 forbidden", st, code)
	}
	var rc adminapi.RateCard
	e.do(adminToken, http.MethodPost, "/rate-cards", card, &rc)
	if rc.Version != 1 || rc.PricesMicros["standard"] != 200 {
		t.Fatalf("rate card = %+v", rc)
	}
	e.do(adminToken, http.MethodPost, "/rate-cards", card, &rc)
	if rc.Version != 2 {
		t.Fatalf("second create: version %d, want 2", rc.Version)
	}
	if st, _ := e.refused(adminToken, http.MethodPut, "/accounts/"+acct+"/billing", adminapi.BillingSettings{RateCard: "nope", Currency: "USD"}); st != 404 {
		t.Fatalf("unknown rate card: %d, want 404", st)
	}
	if st, _ := e.refused(adminToken, http.MethodPut, "/accounts/"+acct+"/billing", adminapi.BillingSettings{RateCard: "std", Currency: "usd"}); st != 400 {
		t.Fatalf("bad currency: %d, want 400", st)
	}
	if st, code := e.refused(adminToken, http.MethodPut, "/accounts/"+acct+"/billing", adminapi.BillingSettings{RateCard: "std", Currency: "ABC"}); st != 400 || code != protocol.InvalidRequest {
		t.Fatalf("currency ABC (not ISO 4217): %d %s, want 400 invalid_request", st, code)
	}
	e.do(adminToken, http.MethodPut, "/accounts/"+acct+"/billing", adminapi.BillingSettings{RateCard: "std", Currency: "EUR", CreditLimit: "10"}, nil)

	credit := adminapi.FundsRequest{Amount: "25.00", Reason: "wire 123", IdempotencyKey: "w123"}
	if st, _ := e.refused(financeToken, http.MethodPost, "/accounts/"+acct+"/funds/credit", credit); st != 403 {
		t.Fatalf("finance crediting: %d, want 403", st)
	}
	var fe adminapi.FundsEntry
	e.do(adminToken, http.MethodPost, "/accounts/"+acct+"/funds/credit", credit, &fe)
	e.do(adminToken, http.MethodPost, "/accounts/"+acct+"/funds/credit", credit, &fe)
	if !fe.Replayed || fe.Balance.Available != "25.00" || fe.Balance.Currency != "EUR" || fe.Actor == "" {
		t.Fatalf("credit replay: %+v; want replayed, available 25.00 EUR, an actor", fe)
	}
	credit.Amount = "30.00"
	if st, code := e.refused(adminToken, http.MethodPost, "/accounts/"+acct+"/funds/credit", credit); st != 409 || code != protocol.IdempotencyConflict {
		t.Fatalf("key reused for another amount: %d %s; want 409", st, code)
	}
	e.do(adminToken, http.MethodPost, "/accounts/"+acct+"/funds/debit", adminapi.FundsRequest{Amount: "5.5", Reason: "fee", IdempotencyKey: "d1"}, nil)
	var b adminapi.Balance
	e.do(financeToken, http.MethodGet, "/accounts/"+acct+"/funds", nil, &b)
	if b.Available != "19.50" || b.Credits != "25.00" || b.Debits != "5.50" || b.CreditLimit != "10.00" {
		t.Fatalf("balance = %+v", b)
	}

	inst := e.instance(acct)
	e.do(adminToken, http.MethodPut, "/accounts/"+acct+"/budgets", adminapi.BudgetRequest{Monthly: "100.00"}, nil)
	if st, _ := e.refused(adminToken, http.MethodPut, "/accounts/"+acct+"/budgets", adminapi.BudgetRequest{InstanceID: inst, Monthly: "100.01"}); st != 400 {
		t.Fatalf("instance budget above the account's: %d, want 400", st)
	}
	var bs []adminapi.Budget
	e.do(adminToken, http.MethodPut, "/accounts/"+acct+"/budgets", adminapi.BudgetRequest{InstanceID: inst, Agent: "coder", Monthly: "10", Soft: true}, &bs)
	if len(bs) != 2 {
		t.Fatalf("budgets = %+v; want the account's and the agent's", bs)
	}
	e.do(financeToken, http.MethodGet, "/accounts/"+acct+"/budgets", nil, &bs)

	if _, err := billing.NewLedger(e.db.Redis()).Append(context.Background(), billing.UsageEntry{ID: "ws_x:final", Kind: billing.KindUsage,
		AccountID: acct, WorkspaceID: "ws_x", AmountMicros: 1000, TerminatedAt: e.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	adj := adminapi.AdjustmentRequest{Corrects: "ws_x:final", Amount: "-0.0004", Reason: "goodwill", IdempotencyKey: "g1"}
	if st, _ := e.refused(financeToken, http.MethodPost, "/accounts/"+acct+"/usage/adjustments", adj); st != 403 {
		t.Fatalf("finance adjusting: %d, want 403", st)
	}
	var out admin.Adjustment
	e.do(adminToken, http.MethodPost, "/accounts/"+acct+"/usage/adjustments", adj, &out)
	if out.Entry.Kind != billing.KindAdjustment || out.Entry.Corrects != "ws_x:final" || out.Entry.AmountMicros != -400 || out.Replayed {
		t.Fatalf("adjustment = %+v", out)
	}
	e.do(adminToken, http.MethodPost, "/accounts/"+acct+"/usage/adjustments", adj, &out)
	if !out.Replayed || out.Entry.AmountMicros != -400 {
		t.Fatalf("the adjustment retried = %+v; want replayed, -400", out)
	}
	reused := adj
	reused.Amount = "-0.0009"
	if st, code := e.refused(adminToken, http.MethodPost, "/accounts/"+acct+"/usage/adjustments", reused); st != 409 || code != protocol.IdempotencyConflict {
		t.Fatalf("the key reused for another amount: %d %s, want 409 %s", st, code, protocol.IdempotencyConflict)
	}
	tooMuch := adminapi.AdjustmentRequest{Corrects: "ws_x:final", Amount: "-0.000601", Reason: "goodwill", IdempotencyKey: "g2"}
	err := e.client(adminToken).Do(context.Background(), http.MethodPost, "/accounts/"+acct+"/usage/adjustments", tooMuch, nil)
	var ae *adminapi.APIError
	if !errors.As(err, &ae) || ae.Status != 400 || ae.Code != protocol.InvalidRequest || !strings.Contains(ae.Message, "charges 0.0006 now") || !strings.Contains(ae.Message, "nothing was applied") {
		t.Fatalf("a refund past what the entry still charges (0.0006): %v; want 400 %s naming 0.0006 and that nothing was applied", err, protocol.InvalidRequest)
	}
	adj.Corrects = "ws_y:final"
	if st, _ := e.refused(adminToken, http.MethodPost, "/accounts/"+acct+"/usage/adjustments", adj); st != 409 {
		t.Fatalf("the key reused for a missing entry: %d, want 409", st)
	}
	adj.IdempotencyKey = "g3"
	if st, _ := e.refused(adminToken, http.MethodPost, "/accounts/"+acct+"/usage/adjustments", adj); st != 404 {
		t.Fatalf("adjusting a missing entry: %d, want 404", st)
	}
}
