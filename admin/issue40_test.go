package admin_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/admin"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/store"
)

// An account name another account has, compared ignoring case and
// surrounding spaces, is 409 conflict naming that account.
func TestAccountNameUnique(t *testing.T) {
	e := newEnv(t)
	var first adminapi.Account
	e.do(adminToken, http.MethodPost, "/accounts", adminapi.CreateAccountRequest{Name: "Acme"}, &first)
	for _, name := range []string{"Acme", " acme ", "ACME"} {
		err := e.client(adminToken).Do(context.Background(), http.MethodPost, "/accounts", adminapi.CreateAccountRequest{Name: name}, nil)
		ae, ok := err.(*adminapi.APIError)
		if !ok || ae.Status != 409 || ae.Code != protocol.Conflict || !strings.Contains(ae.Message, first.ID) {
			t.Errorf("POST /accounts %q = %v; want 409 conflict naming %s", name, err, first.ID)
		}
	}
	e.do(adminToken, http.MethodPost, "/accounts", adminapi.CreateAccountRequest{Name: "Acme Two"}, nil)
}

// A USD card cannot be put on a JPY account (400 naming both); a card
// without a currency is refused; the migration of a card without one is
// an audited admin call allowed once; the account list and billing get
// show free and unconfigured accounts.
func TestRateCardCurrencyAndFree(t *testing.T) {
	e := newEnv(t)
	acct := e.account()
	prices := map[string]string{"small": "0.0001", "standard": "0.0002", "large": "0.0004", "xlarge": "0.0008"}
	if st, code := e.refused(adminToken, http.MethodPost, "/rate-cards", adminapi.RateCardRequest{Name: "usd", Prices: prices}); st != 400 || code != protocol.InvalidRequest {
		t.Errorf("a card without a currency: %d %s; want 400 invalid_request", st, code)
	}
	var rc adminapi.RateCard
	e.do(adminToken, http.MethodPost, "/rate-cards", adminapi.RateCardRequest{Name: "usd", Currency: "USD", Prices: prices}, &rc)
	if rc.Currency != "USD" {
		t.Errorf("card currency = %q; want USD", rc.Currency)
	}
	err := e.client(adminToken).Do(context.Background(), http.MethodPut, "/accounts/"+acct+"/billing", adminapi.BillingSettings{RateCard: "usd", Currency: "JPY"}, nil)
	ae, ok := err.(*adminapi.APIError)
	if !ok || ae.Status != 400 || ae.Code != protocol.InvalidRequest || !strings.Contains(ae.Message, "USD") || !strings.Contains(ae.Message, "JPY") {
		t.Fatalf("USD card on a JPY account = %v; want 400 invalid_request naming USD and JPY", err)
	}
	if st, code := e.refused(adminToken, http.MethodPut, "/rate-cards/usd/currency", adminapi.RateCardCurrencyRequest{Currency: "EUR"}); st != 409 || code != protocol.Conflict {
		t.Errorf("set-currency on a card that has one: %d %s; want 409 conflict", st, code)
	}

	// A card written by an older broker: no currency.
	rdb := e.db.Redis()
	old := `{"name":"legacy","version":0,"prices_micros":{"small":7,"standard":7,"large":7,"xlarge":7},"created_at":"2026-01-01T00:00:00Z"}`
	rdb.HSet(context.Background(), "sg:ratecard:legacy", "latest", 1, "1", old)
	rdb.SAdd(context.Background(), "sg:ratecards", "legacy")
	var cards []adminapi.RateCard
	e.do(financeToken, http.MethodGet, "/rate-cards", nil, &cards)
	if i := slices.IndexFunc(cards, func(c adminapi.RateCard) bool { return c.Name == "legacy" }); i < 0 || cards[i].Currency != "" {
		t.Errorf("rate cards = %+v; want legacy listed without a currency", cards)
	}
	if st, code := e.refused(adminToken, http.MethodPut, "/accounts/"+acct+"/billing", adminapi.BillingSettings{RateCard: "legacy", Currency: "USD"}); st != 400 || code != protocol.InvalidRequest {
		t.Errorf("attaching a card without a currency: %d %s; want 400", st, code)
	}
	if st, _ := e.refused(financeToken, http.MethodPut, "/rate-cards/legacy/currency", adminapi.RateCardCurrencyRequest{Currency: "USD"}); st != 403 {
		t.Errorf("finance migrating a card: %d; want 403", st)
	}
	e.do(adminToken, http.MethodPut, "/rate-cards/legacy/currency", adminapi.RateCardCurrencyRequest{Currency: "USD"}, &rc)
	if rc.Currency != "USD" || rc.PricesMicros["small"] != 7 {
		t.Errorf("migrated card = %+v; want USD, prices unchanged", rc)
	}
	if events, _ := e.audit("?action=rate_card.set_currency"); !slices.ContainsFunc(events, func(ev store.AuditEvent) bool {
		return ev.Action == "rate_card.set_currency" && ev.Target == "rate_card:legacy" && ev.Outcome.Status == 200
	}) {
		t.Errorf("audit log = %+v; want the migration", events)
	}
	e.do(adminToken, http.MethodPut, "/accounts/"+acct+"/billing", adminapi.BillingSettings{RateCard: "legacy", Currency: "USD"}, nil)

	// Free and unconfigured accounts.
	free, none := e.account(), e.account()
	if st, _ := e.refused(adminToken, http.MethodPut, "/accounts/"+free+"/billing", adminapi.BillingSettings{Free: true, RateCard: "usd"}); st != 400 {
		t.Errorf("free with a rate card: %d; want 400", st)
	}
	var bs adminapi.BillingSettings
	e.do(adminToken, http.MethodPut, "/accounts/"+free+"/billing", adminapi.BillingSettings{Free: true}, &bs)
	if !bs.Free || !bs.Configured || bs.Currency != billing.NoCurrency || !bs.Postpaid {
		t.Errorf("free settings = %+v; want free, configured, XXX, postpaid", bs)
	}
	var as []adminapi.Account
	e.do(financeToken, http.MethodGet, "/accounts", nil, &as)
	want := map[string]string{acct: billing.StateConfigured, free: billing.StateFree, none: billing.StateNotConfigured}
	for _, a := range as {
		if w, ok := want[a.ID]; ok && a.Billing != w {
			t.Errorf("account %s billing = %q; want %q", a.ID, a.Billing, w)
		}
	}
	var reps []billing.Report
	e.do(financeToken, http.MethodGet, "/billing/reconcile?account="+none, nil, &reps)
	if len(reps) != 1 || reps[0].Billing != billing.StateNotConfigured {
		t.Errorf("reconcile of an unconfigured account = %+v; want billing not_configured", reps)
	}
}

// An adjustment needs a reason; its reason and the operator are in the
// CSV and JSONL exports.
func TestAdjustmentReasonInExports(t *testing.T) {
	e := newEnv(t)
	acct := e.account()
	if _, err := billing.NewLedger(e.db.Redis()).Append(context.Background(), billing.UsageEntry{ID: "ws_x:final", Kind: billing.KindUsage,
		AccountID: acct, WorkspaceID: "ws_x", Currency: "USD", AmountMicros: 1000, TerminatedAt: e.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	adj := adminapi.AdjustmentRequest{Corrects: "ws_x:final", Amount: "-0.0004", Reason: "  ", IdempotencyKey: "g1"}
	if st, code := e.refused(adminToken, http.MethodPost, "/accounts/"+acct+"/usage/adjustments", adj); st != 400 || code != protocol.InvalidRequest {
		t.Errorf("an adjustment without a reason: %d %s; want 400 invalid_request", st, code)
	}
	adj.Reason = "outage, INC-7"
	var out admin.Adjustment
	e.do(adminToken, http.MethodPost, "/accounts/"+acct+"/usage/adjustments", adj, &out)
	if out.Entry.Reason != adj.Reason || !strings.HasPrefix(out.Entry.Actor, "alice:") {
		t.Fatalf("adjustment entry = %+v; want reason %q and actor alice", out.Entry, adj.Reason)
	}
	from := e.clock.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	csvBody, err := e.export(financeToken, "/usage?account="+acct+"&format=csv&from="+from)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(bytes.NewReader(csvBody)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	reason, actor := slices.Index(recs[0], "reason"), slices.Index(recs[0], "actor")
	if reason != len(billing.Columns)-2 || actor != len(billing.Columns)-1 {
		t.Fatalf("header = %q; want reason and actor last", recs[0])
	}
	var found bool
	for _, r := range recs[1:] {
		if r[1] == billing.KindAdjustment {
			found = r[reason] == adj.Reason && r[actor] == out.Entry.Actor
		}
	}
	if !found {
		t.Errorf("CSV export = %q; want the adjustment's reason and actor", recs)
	}
	jsonl, err := e.export(financeToken, "/usage?account="+acct+"&format=jsonl&from="+from)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(jsonl), `"reason":"outage, INC-7","actor":"`+out.Entry.Actor+`"}`) {
		t.Errorf("JSONL export = %s; want the adjustment's reason and actor", jsonl)
	}
}
