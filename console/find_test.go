package console_test

import (
	"net/http"
	"strings"
	"testing"
)

// Every page loads live.js from the console itself under a CSP that
// allows no other script, has a viewport and no meta refresh; the live
// table's rows come alone, marked, from the page's own URL.
func TestLiveRowsUnderTheStrictCSP(t *testing.T) {
	srv, _ := newConsole(t)
	resp, page := send(t, srv, http.MethodGet, "/console/workspaces?sort=age", adminTok, nil, nil)
	csp := resp.Header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") || !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy = %q; want script-src 'self' and nothing unsafe", csp)
	}
	for _, want := range []string{`<meta name="viewport"`, `<script src="/console/static/live.js" defer></script>`, `data-live=`} {
		if !strings.Contains(page, want) {
			t.Errorf("workspaces page has no %s", want)
		}
	}
	if strings.Contains(page, `http-equiv="refresh"`) || strings.Contains(page, "<script>") {
		t.Error("workspaces page has a meta refresh or an inline script")
	}
	resp, rows := send(t, srv, http.MethodGet, "/console/workspaces?sort=age&fragment=rows", adminTok, nil, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Console-Fragment") != "rows" || strings.Contains(rows, "<html") ||
		!strings.Contains(rows, `id="no-workspaces"`) {
		t.Errorf("rows fragment = %d %q:\n%s\nwant 200, marked rows, no page around them", resp.StatusCode, resp.Header.Get("X-Console-Fragment"), rows)
	}
	resp, js := send(t, srv, http.MethodGet, "/console/static/live.js", "", nil, nil)
	if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), "javascript") || !strings.Contains(js, "fragment") {
		t.Errorf("GET /console/static/live.js = %d %s; want the script", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}
