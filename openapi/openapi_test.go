package openapi_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/openapi"
)

// TestDocumentsAreWellFormed: each document is OpenAPI 3.1, every
// operation has an operationId (unique), a summary and responses, and every
// $ref names a component the document has.
func TestDocumentsAreWellFormed(t *testing.T) {
	for _, name := range []string{openapi.V1, openapi.Admin} {
		t.Run(name, func(t *testing.T) {
			b, err := openapi.Document(name)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := openapi.Operations(name); err != nil {
				t.Fatal(err)
			}
			var doc struct {
				Paths      map[string]map[string]map[string]any `json:"paths"`
				Components struct {
					Schemas map[string]any `json:"schemas"`
				} `json:"components"`
			}
			if err := json.Unmarshal(b, &doc); err != nil {
				t.Fatal(err)
			}
			ids := map[string]bool{}
			for p, ops := range doc.Paths {
				for m, op := range ops {
					id, _ := op["operationId"].(string)
					if id == "" || ids[id] {
						t.Errorf("%s %s: operationId %q missing or repeated", m, p, id)
					}
					ids[id] = true
					if s, _ := op["summary"].(string); s == "" {
						t.Errorf("%s %s: no summary", m, p)
					}
					if rs, _ := op["responses"].(map[string]any); len(rs) < 2 {
						t.Errorf("%s %s: responses %v; want a success and the error envelope", m, p, rs)
					}
				}
			}
			for _, m := range regexp.MustCompile(`"\$ref": "#/components/schemas/([^"]+)"`).FindAllStringSubmatch(string(b), -1) {
				if _, ok := doc.Components.Schemas[m[1]]; !ok {
					t.Errorf("$ref %s names no schema", m[1])
				}
			}
			if !strings.Contains(string(b), `"bearer"`) {
				t.Error("no bearer security scheme")
			}
		})
	}
}
