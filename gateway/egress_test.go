package gateway_test

import (
	"net/http"
	"testing"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
)

// An instance set while its provider filtered egress by domain promises,
// and admits, only [] once the provider enforces nothing else (Modal's
// domain allowlist given up, a vendor listener removed): the lease says
// so, and an Acquire with domains is refused before anything is created.
func TestCeilingIsWhatTheProviderEnforces(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	ceiling := []string{"example.com"}
	in := h.NewInstance(adminapi.Scope{EgressCeiling: &ceiling})
	withDomains := acquireBody("domains")
	withDomains.Egress = &protocol.Egress{AllowedDomains: []string{"example.com"}}

	wantOK(t, "acquire with domains", do(t, h, acquireReq(in.Token, "before", withDomains)), http.StatusCreated, nil)

	// The lease is read only now: a provider's capabilities are fixed once
	// it is open, so the gateway keeps the lease's answer per token.
	h.Provider.SetEgress(providers.EgressNoneOnly)
	var lease protocol.LeaseResponse
	wantOK(t, "lease", do(t, h, request{Method: http.MethodGet, Path: "/v1/lease", Token: in.Token}), http.StatusOK, &lease)
	if got := lease.Egress.Ceiling; got == nil || len(got) != 0 {
		t.Errorf("lease ceiling = %q on a provider that enforces only no network; want []", got)
	}
	creates := len(h.Provider.CreateSpecs())
	wantError(t, "acquire with domains", do(t, h, acquireReq(in.Token, "after", withDomains)), http.StatusUnprocessableEntity, protocol.EgressNotAllowed)
	if n := len(h.Provider.CreateSpecs()); n != creates {
		t.Errorf("the refused acquire reached the provider (%d creates, want %d)", n, creates)
	}
	acquire(t, h, in.Token, "none")
}
