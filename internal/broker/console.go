package broker

import (
	"log/slog"
	"net/http"
	"path"
	"strings"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/console"
	"github.com/sandgate/sandgate/openapi"
)

// withConsole serves the operator console under /console/ and the API
// documents under /openapi/ (package openapi) on the operator
// listener, over the operator API api, and everything else with next
// (whose GET /metrics the overview reads refusals from).
// The console reads and acts only through api, with the signed-in
// operator's token.
func withConsole(next, api http.Handler, clock sandgate.Clock, log *slog.Logger) http.Handler {
	con, err := console.New(console.Config{API: api, Clock: clock, Log: log})
	if err != nil {
		// The templates are embedded: a failure is a build defect, caught by every test.
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle(console.Prefix, con.Handler())
	mux.Handle("GET /console", http.RedirectHandler(console.Prefix, http.StatusSeeOther))
	mux.Handle("GET /{$}", http.RedirectHandler(console.Prefix, http.StatusSeeOther))
	mux.Handle("GET /openapi/", openapi.Handler())
	mux.Handle("/", next)
	return cleanPaths(mux, api)
}

// cleanPaths hands a request whose path is not clean ("..", ".", "//")
// to api, the operator API, which answers it as an unknown route with its
// envelope: the muxes would answer it with a 307 redirect and an HTML
// body, which no client of the API follows or reads.
func cleanPaths(mux, api http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		clean := path.Clean("/" + p)
		if clean != "/" && strings.HasSuffix(p, "/") {
			clean += "/"
		}
		if clean != p {
			api.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}
