package console_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/console"
)

const (
	adminTok   = "sgo_ADMINtoken0123456789abcdefghij"
	financeTok = "sgo_FINAtoken0123456789abcdefghijk"
)

// fakeAPI is an operator API that knows two tokens and records the
// changes it is asked for.
type fakeAPI struct {
	mu    sync.Mutex
	stops []adminapi.StopRequest
	peers []string
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.peers = append(f.peers, r.RemoteAddr)
	f.mu.Unlock()
	role := map[string]adminapi.Role{"Bearer " + adminTok: adminapi.RoleAdmin, "Bearer " + financeTok: adminapi.RoleFinance}[r.Header.Get("Authorization")]
	refuse := func(status int, code string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": "refused", "retryable": false, "details": map[string]any{}}})
	}
	if role == "" {
		refuse(401, "unauthenticated")
		return
	}
	switch r.Method + " " + r.URL.Path {
	case "GET /admin/v1/whoami", "POST /admin/v1/signin", "POST /admin/v1/signout":
		json.NewEncoder(w).Encode(adminapi.Whoami{Name: string(role), Role: role, Actor: string(role) + ":sgo_TEST"})
	case "GET /admin/v1/audit":
		w.Header().Set("Content-Type", "application/x-ndjson")
		for i := range 120 {
			fmt.Fprintf(w, `{"time":"2026-12-01T00:%02d:%02dZ","actor":"a","action":"act.%d","target":"broker","outcome":{"status":200}}`+"\n", i/60, i%60, i)
		}
	case "GET /admin/v1/accounts":
		w.Write([]byte(`[{"id":"acct_paid","name":"paid","billing":"configured"},{"id":"acct_gift","name":"gift","billing":"free"},` +
			`{"id":"acct_forgot","name":"forgot","billing":"not_configured"}]`))
	case "GET /admin/v1/status":
		if role == adminapi.RoleFinance {
			refuse(403, "forbidden")
			return
		}
		w.Write([]byte(`{"broker_stop":null,"controls":[]}`))
	case "POST /admin/v1/stop":
		if role == adminapi.RoleFinance {
			refuse(403, "forbidden")
			return
		}
		var req adminapi.StopRequest
		json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.stops = append(f.stops, req)
		f.mu.Unlock()
		w.Write([]byte(`{"terminated":0,"failed":0}`))
	default:
		refuse(404, "not_found")
	}
}

func (f *fakeAPI) stopCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.stops)
}

func newConsole(t *testing.T) (*httptest.Server, *fakeAPI) {
	t.Helper()
	api := &fakeAPI{}
	c, err := console.New(console.Config{API: api})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	return srv, api
}

// send sends one request with tok as the session cookie (none when empty).
func send(t *testing.T, srv *httptest.Server, method, path, tok string, form url.Values, header map[string]string) (*http.Response, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if tok != "" {
		req.AddCookie(&http.Cookie{Name: "sandgate_console", Value: tok})
	}
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

var csrfPattern = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func TestLoginKeepsTheTokenInAStrictCookie(t *testing.T) {
	srv, _ := newConsole(t)
	resp, _ := send(t, srv, http.MethodPost, "/console/login", "", url.Values{"token": {adminTok}}, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/console/" {
		t.Fatalf("POST /console/login = %d to %q; want 303 to /console/", resp.StatusCode, resp.Header.Get("Location"))
	}
	cs := resp.Cookies()
	if len(cs) != 1 || cs[0].Name != "sandgate_console" || cs[0].Value != adminTok || !cs[0].HttpOnly || !cs[0].Secure ||
		cs[0].SameSite != http.SameSiteStrictMode || cs[0].Path != "/console/" {
		t.Fatalf("cookies = %+v; want sandgate_console, HttpOnly, Secure, SameSite=Strict, path /console/", cs)
	}
	resp, body := send(t, srv, http.MethodPost, "/console/login", "", url.Values{"token": {"sgo_nope"}}, nil)
	if resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 || !strings.Contains(body, "unknown operator token") {
		t.Errorf("sign-in with an unknown token = %d, cookies %v; want 401 and no cookie", resp.StatusCode, resp.Cookies())
	}
	resp, _ = send(t, srv, http.MethodGet, "/console/controls", "", nil, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/console/login" {
		t.Errorf("GET /console/controls signed out = %d to %q; want 303 to /console/login", resp.StatusCode, resp.Header.Get("Location"))
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("Content-Security-Policy = %q; want default-src 'none' and frame-ancestors 'none'", csp)
	}
}

func TestChangesNeedCSRFAndConfirmation(t *testing.T) {
	srv, api := newConsole(t)
	resp, page := send(t, srv, http.MethodGet, "/console/controls", adminTok, nil, nil)
	m := csrfPattern.FindStringSubmatch(page)
	if resp.StatusCode != 200 || m == nil {
		t.Fatalf("GET /console/controls = %d, csrf %v; want 200 with a CSRF token", resp.StatusCode, m)
	}
	csrf := m[1]
	stop := func(csrf, confirm string, header map[string]string) int {
		resp, _ := send(t, srv, http.MethodPost, "/console/controls/stop", adminTok,
			url.Values{"csrf": {csrf}, "on": {"true"}, "reason": {"incident"}, "confirm": {confirm}}, header)
		return resp.StatusCode
	}
	for _, tt := range []struct {
		name          string
		csrf, confirm string
		header        map[string]string
		want          int
	}{
		{"no csrf", "", "STOP", nil, 403},
		{"another session's csrf", "bm90LXRoaXMtb25l", "STOP", nil, 403},
		{"cross-origin", csrf, "STOP", map[string]string{"Origin": "http://evil.example"}, 403},
		{"origin null", csrf, "STOP", map[string]string{"Origin": "null"}, 403},
		{"not confirmed", csrf, "stop", nil, 400},
	} {
		if got := stop(tt.csrf, tt.confirm, tt.header); got != tt.want {
			t.Errorf("%s: POST /console/controls/stop = %d; want %d", tt.name, got, tt.want)
		}
	}
	if n := api.stopCalls(); n != 0 {
		t.Fatalf("the API was asked to stop %d times by refused forms; want 0", n)
	}
	if got := stop(csrf, "STOP", map[string]string{"Origin": srv.URL}); got != http.StatusSeeOther {
		t.Fatalf("confirmed POST /console/controls/stop = %d; want 303", got)
	}
	if n := api.stopCalls(); n != 1 || api.stops[0].On == nil || !*api.stops[0].On || api.stops[0].Reason != "incident" {
		t.Fatalf("API stops = %+v; want one stop on, reason incident", api.stops)
	}
	for _, p := range api.peers {
		if !strings.HasPrefix(p, "127.0.0.1:") {
			t.Errorf("API request from %q; want the browser's peer address", p)
		}
	}
}

// The overview lists the accounts marked free and those whose billing was
// never configured (the finance view; operators see the same section).
func TestOverviewListsFreeAndUnconfiguredAccounts(t *testing.T) {
	srv, _ := newConsole(t)
	resp, page := send(t, srv, http.MethodGet, "/console/", financeTok, nil, nil)
	table := func(id string) string {
		_, rest, _ := strings.Cut(page, `id="`+id+`"`)
		tbl, _, _ := strings.Cut(rest, "</table>")
		return tbl
	}
	free, none := table("free-accounts"), table("unconfigured-accounts")
	if resp.StatusCode != 200 || !strings.Contains(free, "acct_gift") || strings.Contains(free, "acct_paid") ||
		!strings.Contains(none, "acct_forgot") || strings.Contains(none, "acct_gift") {
		t.Errorf("overview = %d; want acct_gift under free and acct_forgot under unconfigured:\n%s", resp.StatusCode, page)
	}
}

func TestFinanceSeesNoControls(t *testing.T) {
	srv, api := newConsole(t)
	resp, page := send(t, srv, http.MethodGet, "/console/", financeTok, nil, nil)
	if resp.StatusCode != 200 || strings.Contains(page, "/console/controls") || strings.Contains(page, "/console/workspaces") {
		t.Errorf("finance overview = %d with links to controls or workspaces; want 200 without:\n%s", resp.StatusCode, page)
	}
	resp, page = send(t, srv, http.MethodGet, "/console/controls", financeTok, nil, nil)
	if resp.StatusCode != 403 || strings.Contains(page, `action="/console/controls`) {
		t.Errorf("finance GET /console/controls = %d; want 403 without control forms:\n%s", resp.StatusCode, page)
	}
	csrf := csrfPattern.FindStringSubmatch(page)[1]
	resp, page = send(t, srv, http.MethodPost, "/console/controls/stop", financeTok,
		url.Values{"csrf": {csrf}, "on": {"true"}, "reason": {"x"}, "confirm": {"STOP"}}, nil)
	if resp.StatusCode != 403 || !strings.Contains(page, "forbidden") || api.stopCalls() != 0 {
		t.Errorf("finance POST /console/controls/stop = %d (stops %d); want the API's 403 forbidden", resp.StatusCode, api.stopCalls())
	}
}

func TestAuditPages(t *testing.T) {
	srv, _ := newConsole(t)
	actions := regexp.MustCompile(`data-action="(act\.\d+)"`)
	for _, tt := range []struct {
		page        string
		first, last string
		n           int
	}{{"1", "act.119", "act.70", 50}, {"2", "act.69", "act.20", 50}, {"3", "act.19", "act.0", 20}} {
		resp, page := send(t, srv, http.MethodGet, "/console/audit?page="+tt.page, adminTok, nil, nil)
		got := actions.FindAllStringSubmatch(page, -1)
		if resp.StatusCode != 200 || len(got) != tt.n || got[0][1] != tt.first || got[len(got)-1][1] != tt.last {
			t.Errorf("audit page %s = %d with %d rows; want %d rows, %s first and %s last", tt.page, resp.StatusCode, len(got), tt.n, tt.first, tt.last)
		}
	}
}

// TestCSRFHoldsAcrossProcesses: a form of one broker process is accepted
// by another (or by the same after a restart): the token needs no state.
func TestCSRFHoldsAcrossProcesses(t *testing.T) {
	one, _ := newConsole(t)
	other, api := newConsole(t)
	_, page := send(t, one, http.MethodGet, "/console/controls", adminTok, nil, nil)
	csrf := csrfPattern.FindStringSubmatch(page)[1]
	resp, _ := send(t, other, http.MethodPost, "/console/controls/stop", adminTok,
		url.Values{"csrf": {csrf}, "on": {"false"}}, nil)
	if resp.StatusCode != http.StatusSeeOther || api.stopCalls() != 1 {
		t.Errorf("another process's form = %d with %d stops; want 303 and the stop lifted", resp.StatusCode, api.stopCalls())
	}
	_, fpage := send(t, one, http.MethodGet, "/console/", financeTok, nil, nil)
	if fcsrf := csrfPattern.FindStringSubmatch(fpage)[1]; fcsrf == csrf {
		t.Error("two operator tokens have the same CSRF token")
	}
}
