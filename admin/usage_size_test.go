package admin_test

import (
	"net/http"
	"testing"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/protocol"
)

// TestUsageSizeFilter: ?size= keeps the entries of one size, in summaries
// and exports; an unknown size is refused.
func TestUsageSizeFilter(t *testing.T) {
	e := newEnv(t)
	a := e.account()
	i := e.instance(a)
	e.seedUsage(a, i, 4) // small 1 s, large 2 s, small 3 s, large 4 s
	var sum adminapi.UsageSummary
	e.do(financeToken, http.MethodGet, "/usage/summary?group_by=size&size=small&"+monthQuery, nil, &sum)
	if len(sum.Groups) != 1 || sum.Groups[0].Key != "small" || sum.Groups[0].Seconds != 4 || sum.Groups[0].Workspaces != 2 {
		t.Errorf("summary of size small = %+v; want one group of 2 workspaces, 4 s", sum.Groups)
	}
	b, err := e.export(financeToken, "/usage?format=csv&size=large&"+monthQuery)
	if err != nil {
		t.Fatal(err)
	}
	if rows, micros := sumCSV(t, b); rows != 2 || micros != 123*(2+4) {
		t.Errorf("export of size large = %d rows, %d micros; want 2 rows, %d", rows, micros, 123*6)
	}
	if st, code := e.refused(financeToken, http.MethodGet, "/usage/summary?group_by=day&size=huge", nil); st != 400 || code != protocol.InvalidRequest {
		t.Errorf("size=huge = %d %s; want 400 invalid_request", st, code)
	}
}
