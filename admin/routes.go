package admin

import (
	"slices"
	"strings"
)

// Routes returns every route the operator API serves, as "METHOD
// /admin/v1/path" with path parameters written {name} (OpenAPI's form),
// sorted. The API document's test checks it against the document.
func (s *Server) Routes() []string {
	out := make([]string, 0, len(s.actions))
	for r := range s.actions {
		out = append(out, openAPIPath(r))
	}
	slices.Sort(out)
	return out
}

// openAPIPath rewrites echo's :name path parameters as {name}.
func openAPIPath(route string) string {
	parts := strings.Split(route, "/")
	for i, p := range parts {
		if strings.HasPrefix(p, ":") {
			parts[i] = "{" + p[1:] + "}"
		}
	}
	return strings.Join(parts, "/")
}
