package console

import (
	"net/http"
	"net/url"

	"github.com/sandgate/sandgate/adminapi"
)

// The overview's refusals by code are read from the operator API's
// GET /refusals: counts that every gateway process writes to the store
// as it refuses, so they cover every process and every time, not only
// what this process saw since the page was first opened.

// refusalWindowNames are the windows the refusal counts may be read over.
var refusalWindowNames = []string{"1h", "24h", "7d"}

type refusalsData struct {
	adminapi.RefusalCounts
	Windows []string
}

// refusals reads the refusals by code over the request's ?window= (24h
// by default), from the counts every gateway process keeps in the store.
func (c *Console) refusals(r *http.Request, s *session) (refusalsData, error) {
	d := refusalsData{Windows: refusalWindowNames}
	win := r.URL.Query().Get("window")
	if win == "" {
		win = "24h"
	}
	err := c.call(r, s.token, http.MethodGet, "/refusals?window="+url.QueryEscape(win), nil, &d.RefusalCounts)
	return d, err
}
