package sgtest_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
)

// An account whose billing was never configured cannot acquire: 402
// insufficient_funds, not retryable, saying what the operator must do,
// and nothing is created. Marked free, the same instance acquires.
func TestAcquireNeedsBillingOrFree(t *testing.T) {
	h := sgtest.New(t, sgtest.Options{})
	var a adminapi.Account
	h.AdminDo(http.MethodPost, "/accounts", adminapi.CreateAccountRequest{Name: "never configured"}, &a)
	in := h.NewInstanceIn(a.ID, adminapi.Scope{})
	c := h.Client(in.Token)
	ctx := context.Background()
	req := protocol.AcquireRequest{Label: "l", Egress: &protocol.Egress{AllowedDomains: []string{}}}
	_, _, err := c.Acquire(ctx, "k1", req)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != http.StatusPaymentRequired || ce.Code != protocol.InsufficientFunds || ce.Retryable ||
		!strings.Contains(ce.Message, "account "+a.ID+" has no billing settings") || !strings.Contains(ce.Message, "sandgate admin billing set --free") {
		t.Fatalf("acquire of an unconfigured account = %v; want 402 insufficient_funds, not retryable, saying what to do", err)
	}
	if ce.Details["reason"] != "billing_not_configured" {
		t.Errorf("details = %v; want reason billing_not_configured", ce.Details)
	}
	if n := h.LiveCount(in); n != 0 {
		t.Errorf("live workspaces after the refusal = %d; want 0", n)
	}
	if n := len(h.Provider.CreateSpecs()); n != 0 {
		t.Errorf("provider creates after the refusal = %d; want 0", n)
	}
	h.AdminDo(http.MethodPut, "/accounts/"+a.ID+"/billing", adminapi.BillingSettings{Free: true}, nil)
	ws, created, err := c.Acquire(ctx, "k1", req) // the refusal left the key unused
	if err != nil || !created {
		t.Fatalf("acquire of a free account = %v, created %v; want 201", err, created)
	}
	w, err := h.DB.Workspace(ctx, a.ID, ws.WorkspaceID)
	if err != nil || w.Price.Currency != "XXX" || w.Price.UnitMicros != 0 || w.Price.HoldMicros != 0 {
		t.Errorf("free workspace price = %+v, %v; want 0 in XXX, nothing held", w.Price, err)
	}
}
