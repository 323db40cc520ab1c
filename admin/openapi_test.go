package admin_test

import (
	"slices"
	"testing"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admin"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/fakeprovider"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/openapi"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
)

// TestOpenAPIDocumentsEveryRoute: every route the operator API registers
// is in openapi/admin-v1.json, and every operation there is a route.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	db := store.New(store.Config{}, redistest.Start(t).Client())
	prov := providers.Single(providers.LegacyName, fakeprovider.New())
	srv, err := admin.New(admin.Config{}, admin.Deps{DB: db, Clock: sandgate.SystemClock{}, Providers: prov,
		Terminator: termination.New(termination.Config{}, termination.Deps{DB: db, Providers: prov, Clock: sandgate.SystemClock{}}),
		Billing:    billing.New(billing.Config{}, billing.Deps{DB: db})})
	if err != nil {
		t.Fatal(err)
	}
	documented, err := openapi.Operations(openapi.Admin)
	if err != nil {
		t.Fatal(err)
	}
	routes := srv.Routes()
	for _, r := range routes {
		if !slices.Contains(documented, r) {
			t.Errorf("route %s is not in openapi/admin-v1.json", r)
		}
	}
	for _, d := range documented {
		if !slices.Contains(routes, d) {
			t.Errorf("openapi/admin-v1.json documents %s, which the operator API does not serve", d)
		}
	}
}
