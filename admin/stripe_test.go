package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/admin"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/stripesync"
)

// withStripe gives the operator API a Stripe sync over the env's Redis.
// Nothing here sends to Stripe: the base URL is never dialled.
func withStripe(t *testing.T) func(*admin.Deps) {
	return func(d *admin.Deps) {
		s, err := stripesync.New(stripesync.Config{BaseURL: "http://127.0.0.1:9"}, stripesync.Deps{Redis: d.DB.Redis(), Clock: d.Clock,
			Getenv: func(string) string { return "sk_test_admin" }})
		if err != nil {
			t.Fatal(err)
		}
		d.Stripe = s
	}
}

// refusal calls the operator API and returns its refusal.
func (e *env) refusal(tok, method, path string, in any) *adminapi.APIError {
	e.t.Helper()
	err := e.client(tok).Do(context.Background(), method, path, in, nil)
	var ae *adminapi.APIError
	if !errors.As(err, &ae) {
		e.t.Fatalf("%s %s = %v; want a refusal", method, path, err)
	}
	return ae
}

func str(s string) *string { return &s }

// TestStripeOff: a broker without the sync answers every Stripe request
// with a message that says so, and billing settings work without it.
func TestStripeOff(t *testing.T) {
	e := newEnv(t)
	acct := e.account()
	for _, r := range []struct {
		method, path string
		in           any
		status       int
	}{
		{http.MethodGet, "/accounts/" + acct + "/billing/stripe", nil, 404},
		{http.MethodPost, "/accounts/" + acct + "/billing/stripe/retry", adminapi.StripeRetryRequest{}, 404},
		{http.MethodPut, "/accounts/" + acct + "/billing", adminapi.BillingSettings{Currency: "USD", Postpaid: true, StripeCustomer: str("cus_1")}, 400},
	} {
		ae := e.refusal(adminToken, r.method, r.path, r.in)
		if ae.Status != r.status || !strings.Contains(ae.Message, "Stripe sync is not configured on this broker") {
			t.Errorf("%s %s = %d %q; want %d, not configured", r.method, r.path, ae.Status, ae.Message, r.status)
		}
	}
	var bs adminapi.BillingSettings
	e.do(adminToken, http.MethodPut, "/accounts/"+acct+"/billing", adminapi.BillingSettings{Currency: "USD", Postpaid: true}, &bs)
	if bs.StripeCustomer != nil {
		t.Errorf("billing settings = %+v; want no Stripe fields", bs)
	}
}

// TestStripeSettingsStatusRetry: the Stripe customer and meter event are
// set, kept and cleared through the billing settings, validated by
// stripesync; finance and admins read the status, only admins retry.
func TestStripeSettingsStatusRetry(t *testing.T) {
	e := newEnv(t, withStripe(t))
	acct := e.account()
	path := "/accounts/" + acct + "/billing"
	base := adminapi.BillingSettings{Currency: "USD", Postpaid: true}

	bad := base
	bad.StripeCustomer, bad.StripeMeterEvent = str("acme"), str("sandgate_seconds")
	if ae := e.refusal(adminToken, http.MethodPut, path, bad); ae.Status != 400 || !strings.Contains(ae.Message, "customer must be a Stripe customer id") {
		t.Fatalf("PUT customer acme = %d %q; want 400 with stripesync's message", ae.Status, ae.Message)
	}
	bad.StripeCustomer, bad.StripeUnit = str("cus_1"), str("cents")
	if ae := e.refusal(adminToken, http.MethodPut, path, bad); ae.Status != 400 || !strings.Contains(ae.Message, "unit must be") {
		t.Fatalf("PUT unit cents = %d %q; want 400", ae.Status, ae.Message)
	}
	var st adminapi.StripeStatus
	e.do(adminToken, http.MethodGet, path+"/stripe", nil, &st)
	if st.Enabled {
		t.Fatalf("a refused PUT turned the sync on: %+v", st)
	}

	on := base
	on.StripeCustomer, on.StripeMeterEvent = str("cus_1"), str("sandgate_seconds")
	var bs adminapi.BillingSettings
	e.do(adminToken, http.MethodPut, path, on, &bs)
	if bs.StripeCustomer == nil || *bs.StripeCustomer != "cus_1" || *bs.StripeMeterEvent != "sandgate_seconds" || *bs.StripeUnit != "seconds" {
		t.Fatalf("PUT answer = %+v; want cus_1, sandgate_seconds, seconds", bs)
	}
	// A PUT without Stripe fields keeps them.
	base.CreditLimit = "5"
	e.do(adminToken, http.MethodPut, path, base, &bs)
	e.do(financeToken, http.MethodGet, path, nil, &bs)
	if bs.StripeCustomer == nil || *bs.StripeCustomer != "cus_1" || bs.CreditLimit != "5.00" {
		t.Fatalf("GET after a PUT without Stripe fields = %+v; want cus_1 kept", bs)
	}

	// A dead letter, as the sync leaves one.
	dl, _ := json.Marshal(stripesync.DeadLetter{EntryID: "ws_1:final", StreamID: "1-0", Identifier: stripesync.Identifier(acct, "ws_1:final"),
		Status: 400, Error: "no such customer", Attempts: 3, At: time.Now()})
	if err := e.db.Redis().HSet(context.Background(), "sg:{"+acct+"}:stripe:dead", "ws_1:final", dl).Err(); err != nil {
		t.Fatal(err)
	}
	if ae := e.refusal(operatorToken, http.MethodGet, path+"/stripe", nil); ae.Status != 403 {
		t.Errorf("operator reading the Stripe status: %d; want 403", ae.Status)
	}
	e.do(financeToken, http.MethodGet, path+"/stripe", nil, &st)
	if !st.Enabled || st.Customer != "cus_1" || len(st.DeadLetters) != 1 || st.DeadLetters[0].EntryID != "ws_1:final" || st.DeadLetters[0].Status != 400 {
		t.Fatalf("status = %+v; want enabled, cus_1, one dead letter", st)
	}
	if ae := e.refusal(financeToken, http.MethodPost, path+"/stripe/retry", adminapi.StripeRetryRequest{}); ae.Status != 403 {
		t.Errorf("finance retrying: %d; want 403", ae.Status)
	}
	var rr adminapi.StripeRetryResult
	e.do(adminToken, http.MethodPost, path+"/stripe/retry", adminapi.StripeRetryRequest{EntryIDs: []string{"ws_2:final"}}, &rr)
	if rr.Requeued != 0 {
		t.Errorf("retry of an id that is no dead letter requeued %d; want 0", rr.Requeued)
	}
	e.do(adminToken, http.MethodPost, path+"/stripe/retry", adminapi.StripeRetryRequest{}, &rr)
	e.do(adminToken, http.MethodGet, path+"/stripe", nil, &st)
	if rr.Requeued != 1 || len(st.DeadLetters) != 0 || len(st.Requeued) != 1 {
		t.Fatalf("retry all = %+v, status %+v; want 1 requeued", rr, st)
	}

	// "" for both turns the sync off.
	off := base
	off.StripeCustomer, off.StripeMeterEvent = str(""), str("")
	var offAnswer adminapi.BillingSettings
	e.do(adminToken, http.MethodPut, path, off, &offAnswer)
	e.do(adminToken, http.MethodGet, path+"/stripe", nil, &st)
	if offAnswer.StripeCustomer != nil || st.Enabled {
		t.Fatalf("after turning off: settings %+v, status enabled %v; want off", offAnswer, st.Enabled)
	}
	if ae := e.refusal(adminToken, http.MethodGet, "/accounts/acct_nope/billing/stripe", nil); ae.Status != 404 {
		t.Errorf("status of an unknown account: %d; want 404", ae.Status)
	}
}
