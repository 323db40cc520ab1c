package broker

import (
	"log/slog"
	"net/http"

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
	con, err := console.New(console.Config{API: api, Clock: clock, Log: log, Metrics: next})
	if err != nil {
		// The templates are embedded: a failure is a build defect, caught by every test.
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle(console.Prefix, con.Handler())
	mux.Handle("GET /console", http.RedirectHandler(console.Prefix, http.StatusSeeOther))
	mux.Handle("GET /openapi/", openapi.Handler())
	mux.Handle("/", next)
	return mux
}
