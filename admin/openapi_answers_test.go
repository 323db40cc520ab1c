package admin_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/sandgate/sandgate/openapi"
	"github.com/sandgate/sandgate/openapi/openapitest"
)

// adminSpec is openapi/admin-v1.json, loaded once for checkedHandler.
var adminSpec = sync.OnceValues(func() (*openapitest.Spec, error) { return openapitest.Load(openapi.Admin) })

// checkedHandler serves h and fails t when an answer of a documented
// operation departs from openapi/admin-v1.json (its status listed, its
// JSON body matching the schema, a refusal's code in the status's enum):
// every test of this package that calls the operator API checks the
// document so.
func checkedHandler(t *testing.T, h http.Handler) http.Handler {
	spec, err := adminSpec()
	if err != nil {
		t.Fatal(err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/admin/v1/usage" || r.URL.Path == "/admin/v1/audit" || r.URL.Path == "/admin/v1/images/pull" {
			h.ServeHTTP(w, r) // streams, cut on a failure midway: not buffered here
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		body := rec.Body.Bytes()
		w.Write(body)
		if _, _, ok := spec.Operation(r.Method, r.URL.Path); !ok {
			return
		}
		if err := spec.CheckResponse(r.Method, r.URL.Path, rec.Code, rec.Header(), bytes.Clone(body)); err != nil {
			t.Errorf("openapi/admin-v1.json: %v", err)
		}
	})
}
