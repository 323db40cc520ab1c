package gateway_test

import (
	"slices"
	"testing"

	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/openapi"
)

// TestOpenAPIDocumentsEveryRoute: every /v1 route the gateway registers
// is in openapi/v1.json, and every operation there is a route.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	documented, err := openapi.Operations(openapi.V1)
	if err != nil {
		t.Fatal(err)
	}
	routes := h.Gateway.Routes()
	if len(routes) == 0 {
		t.Fatal("the gateway lists no routes")
	}
	for _, r := range routes {
		if !slices.Contains(documented, r) {
			t.Errorf("route %s is not in openapi/v1.json", r)
		}
	}
	for _, d := range documented {
		if !slices.Contains(routes, d) {
			t.Errorf("openapi/v1.json documents %s, which the gateway does not serve", d)
		}
	}
}
