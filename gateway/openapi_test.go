package gateway_test

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/openapi"
	"github.com/sandgate/sandgate/openapi/openapitest"
	"github.com/sandgate/sandgate/protocol"
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

// TestOpenAPIOnThePublicListener: GET /openapi/v1.json on the gateway
// answers the embedded protocol document without a token, as JSON.
func TestOpenAPIOnThePublicListener(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	rep := do(t, h, request{Method: http.MethodGet, Path: "/openapi/v1.json"})
	want, err := openapi.Document(openapi.V1)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != http.StatusOK || !bytes.Equal(rep.Body, want) {
		t.Fatalf("GET /openapi/v1.json = %d, %d bytes; want 200 and the document's %d bytes", rep.Status, len(rep.Body), len(want))
	}
	if ct := rep.Header.Get("Content-Type"); ct != "application/json; charset=utf-8" {
		t.Errorf("Content-Type = %q; want application/json; charset=utf-8", ct)
	}
}

// TestOpenAPIRequiredIsWhatTheServerRefuses: for every operation with a
// request body, the document's example is accepted by the gateway, and
// the example without one of its fields (nested objects' fields too) is
// refused exactly when the document marks that field required.
func TestOpenAPIRequiredIsWhatTheServerRefuses(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxConcurrentWorkspaces: 20}})
	ws := acquire(t, h, in.Token, "openapi-required")
	var doc struct {
		Paths      map[string]map[string]map[string]json.RawMessage `json:"paths"`
		Components struct {
			Schemas map[string]*reqSchema `json:"schemas"`
		} `json:"components"`
	}
	b, err := openapi.Document(openapi.V1)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	// Writes first: the read's example reads the file the write's example writes.
	tmpls := slices.SortedFunc(maps.Keys(doc.Paths), func(a, b string) int {
		if wa, wb := strings.HasSuffix(a, "/write"), strings.HasSuffix(b, "/write"); wa != wb {
			return map[bool]int{true: -1, false: 1}[wa]
		}
		return cmp.Compare(a, b)
	})
	n := 0
	for _, tmpl := range tmpls {
		for method, op := range doc.Paths[tmpl] {
			raw, ok := op["requestBody"]
			if !ok {
				continue
			}
			var body struct {
				Content map[string]struct {
					Schema  reqSchema      `json:"schema"`
					Example map[string]any `json:"example"`
				} `json:"content"`
			}
			if err := json.Unmarshal(raw, &body); err != nil {
				t.Fatal(err)
			}
			mt := body.Content["application/json"]
			sc := doc.Components.Schemas[strings.TrimPrefix(mt.Schema.Ref, "#/components/schemas/")]
			if sc == nil {
				t.Fatalf("%s %s: request schema %q not found", method, tmpl, mt.Schema.Ref)
			}
			route := strings.ToUpper(method) + " " + tmpl
			send := func(what string, v map[string]any) reply {
				n++
				path := strings.NewReplacer("{id}", ws.WorkspaceID, "{identity}", fmt.Sprintf("cmd-%d", n)).Replace(tmpl)
				return do(t, h, request{Method: strings.ToUpper(method), Path: path, Token: in.Token, Body: v,
					Header: map[string]string{protocol.HeaderIdempotencyKey: fmt.Sprintf("openapi-%d", n)}})
			}
			if rep := send("the example", mt.Example); rep.Status >= 300 {
				t.Errorf("%s: the document's example is refused: %d %s", route, rep.Status, rep.Body)
				continue
			}
			for _, f := range fieldsOf(sc, mt.Example, "") {
				rep := send("without "+f.path, f.without())
				refused := rep.Status >= 400
				if refused {
					var env protocol.Envelope
					_ = json.Unmarshal(rep.Body, &env)
					if c := env.Error.Code; c != protocol.InvalidRequest && c != protocol.EgressRequired {
						t.Errorf("%s without %s: %d %s; want a success or a refusal of the request's shape", route, f.path, rep.Status, rep.Body)
						continue
					}
				}
				if refused != f.required {
					t.Errorf("%s: without %s the gateway answers %d (%s); the document says required=%v", route, f.path, rep.Status, bytes.TrimSpace(rep.Body), f.required)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no operation with a request body")
	}
}

// reqSchema is the part of a request schema the test reads.
type reqSchema struct {
	Ref        string                `json:"$ref"`
	Required   []string              `json:"required"`
	Properties map[string]*reqSchema `json:"properties"`
}

// field is one field of an example body, and how to drop it.
type field struct {
	path     string
	required bool
	without  func() map[string]any
}

// fieldsOf lists the fields of example (an object of schema sc), its
// nested objects' fields included, each with a copy of the whole example
// lacking it; root is the example's root when nested.
func fieldsOf(sc *reqSchema, example map[string]any, prefix string) []field {
	var out []field
	for k, v := range example {
		out = append(out, field{path: prefix + k, required: slices.Contains(sc.Required, k), without: func() map[string]any {
			c := maps.Clone(example)
			delete(c, k)
			return c
		}})
		if sub, ok := v.(map[string]any); ok && sc.Properties[k] != nil && sc.Properties[k].Properties != nil {
			for _, f := range fieldsOf(sc.Properties[k], sub, prefix+k+".") {
				inner := f.without
				out = append(out, field{path: f.path, required: f.required, without: func() map[string]any {
					c := maps.Clone(example)
					c[k] = inner()
					return c
				}})
			}
		}
	}
	return out
}

// v1Spec is openapi/v1.json, loaded once for checkAnswer.
var v1Spec = sync.OnceValues(func() (*openapitest.Spec, error) { return openapitest.Load(openapi.V1) })

// checkAnswer fails the test when an answer of a documented v1
// operation departs from openapi/v1.json: every raw request of the
// gateway's tests goes through it, so a code a handler sends that the
// document does not list for its operation fails here.
func checkAnswer(t testing.TB, r request, rep reply) {
	t.Helper()
	spec, err := v1Spec()
	if err != nil {
		t.Fatal(err)
	}
	path, _, _ := strings.Cut(r.Path, "?")
	if _, _, ok := spec.Operation(r.Method, path); !ok || r.Plain {
		return // not an operation (a wrong method, an unknown route), or plaintext: refused before routing
	}
	if err := spec.CheckResponse(r.Method, path, rep.Status, rep.Header, rep.Body); err != nil {
		t.Errorf("openapi/v1.json: %v", err)
	}
}
