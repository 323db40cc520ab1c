// Package openapi holds the OpenAPI 3.1 documents of sandgate's two HTTP
// APIs, protocol v1 (/v1, the public listener) and the operator API
// (/admin/v1), embedded in the binary: the operator listener serves both,
// the public listener serves v1.json. Tests check that every route the
// servers register is documented and the reverse, that the schemas name the
// fields of the wire types the servers encode and decode, and, through
// package openapitest, that real answers of the e2e suite match the document.
package openapi

import (
	"embed"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

//go:embed v1.json admin-v1.json
var files embed.FS

// Documents by the name they are served under, /openapi/NAME.
const (
	V1    = "v1.json"       // protocol v1
	Admin = "admin-v1.json" // the operator API
)

// Document returns the embedded document name (V1 or Admin).
func Document(name string) ([]byte, error) { return files.ReadFile(name) }

// Handler serves GET /openapi/v1.json and GET /openapi/admin-v1.json.
// They take no token: they describe the APIs, they do not call them.
func Handler() http.Handler {
	mux := http.NewServeMux()
	for _, n := range []string{V1, Admin} {
		mux.HandleFunc("GET /openapi/"+n, func(w http.ResponseWriter, r *http.Request) {
			b, err := files.ReadFile(n)
			if err != nil {
				http.Error(w, "internal error", http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			w.Header().Set("Cache-Control", "no-cache")
			w.Write(b)
		})
	}
	return mux
}

// Operations returns the operations of the document name as "METHOD
// /path" ({name} path parameters), sorted: what the route tests compare
// with the servers' own lists.
func Operations(name string) ([]string, error) {
	b, err := files.ReadFile(name)
	if err != nil {
		return nil, err
	}
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("openapi: %s: %w", name, err)
	}
	if doc.OpenAPI != "3.1.0" {
		return nil, fmt.Errorf("openapi: %s: openapi %q, want 3.1.0", name, doc.OpenAPI)
	}
	var out []string
	for p, ops := range doc.Paths {
		for m := range ops {
			out = append(out, strings.ToUpper(m)+" "+p)
		}
	}
	slices.Sort(out)
	return out, nil
}
