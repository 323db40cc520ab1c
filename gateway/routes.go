package gateway

import (
	"net/http"
	"slices"
	"strings"
)

// Routes returns every route of protocol v1 the gateway serves, as
// "METHOD /v1/path" with path parameters written {name} (OpenAPI's form),
// sorted. The API document's test checks it against the document.
func (s *Server) Routes() []string {
	var out []string
	for _, r := range s.echo.Routes() {
		if !strings.HasPrefix(r.Path, "/v1/") || r.Method == echoRouteNotFound || r.Method == http.MethodHead {
			continue
		}
		parts := strings.Split(r.Path, "/")
		for i, p := range parts {
			if strings.HasPrefix(p, ":") {
				parts[i] = "{" + p[1:] + "}"
			}
		}
		out = append(out, r.Method+" "+strings.Join(parts, "/"))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// echoRouteNotFound is the method echo lists its catch-all routes under.
const echoRouteNotFound = "echo_route_not_found"
