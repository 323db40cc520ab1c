package console

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
)

func (c *Console) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /console/{$}", c.signedIn(c.overview))
	m.HandleFunc("GET /console/login", c.loginPage)
	m.HandleFunc("POST /console/login", c.login)
	m.HandleFunc("POST /console/logout", c.logout)
	m.HandleFunc("GET /console/workspaces", c.signedIn(c.workspaces, opsRoles...))
	m.HandleFunc("GET /console/workspaces/{id}/kill", c.signedIn(c.killConfirm))
	m.HandleFunc("POST /console/workspaces/{id}/kill", c.posted(c.kill))
	m.HandleFunc("GET /console/accounts", c.signedIn(c.accounts))
	m.HandleFunc("POST /console/accounts", c.posted(c.createAccount))
	m.HandleFunc("GET /console/usage", c.signedIn(c.usage, financeRoles...))
	m.HandleFunc("GET /console/usage.csv", c.signedIn(c.usageCSV))
	m.HandleFunc("GET /console/controls", c.signedIn(c.controls, opsRoles...))
	m.HandleFunc("POST /console/controls/stop", c.posted(c.stop))
	m.HandleFunc("POST /console/controls/pause", c.posted(c.pause))
	m.HandleFunc("POST /console/controls/resume", c.posted(c.resume))
	m.HandleFunc("GET /console/audit", c.signedIn(c.audit, opsRoles...))
	m.HandleFunc("GET /console/search", c.signedIn(c.search))
	m.Handle("GET /console/static/", http.StripPrefix("/console/", http.FileServerFS(files)))
	// Detail pages (detail.go).
	m.HandleFunc("GET /console/workspaces/{id}", c.signedIn(c.workspaceDetail, opsRoles...))
	m.HandleFunc("GET /console/accounts/{id}", c.signedIn(c.accountDetail))
	m.HandleFunc("GET /console/accounts/{id}/statement", c.signedIn(c.accountStatement, financeRoles...))
	c.mux = m
}

// page serves one console page to a signed-in operator.
type page func(w http.ResponseWriter, r *http.Request, s *session)

// signedIn serves p to a signed-in operator whose role is one of roles
// (any role when none is given); anyone else is sent to sign in, or gets
// the forbidden page.
func (c *Console) signedIn(p page, roles ...adminapi.Role) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := c.session(w, r)
		if s == nil {
			return
		}
		if len(roles) > 0 && !s.may(roles...) {
			c.forbidden(w, r, s)
			return
		}
		p(w, r, s)
	}
}

// posted serves p, a change, to a signed-in operator's POST whose CSRF
// token is right.
func (c *Console) posted(p page) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s := c.change(w, r); s != nil {
			p(w, r, s)
		}
	}
}

// Roles of the pages, as the operator API grants them. The console only
// hides what a role may not use; the API refuses it all the same.
var (
	opsRoles     = []adminapi.Role{adminapi.RoleAdmin, adminapi.RoleOperator}
	financeRoles = []adminapi.Role{adminapi.RoleAdmin, adminapi.RoleFinance}
)

// view is what every page template gets.
type view struct {
	Title    string
	Who      adminapi.Whoami
	CSRF     string
	Ops      bool // may see workspaces, controls and the audit log
	Finance  bool // may see usage
	SignedIn bool
	Query    string // the search box's
	Flash    string
	Data     any
}

var funcs = template.FuncMap{
	"pct": func(used, of int64) int64 {
		if of <= 0 {
			return 0
		}
		return used * 100 / of
	},
	"deref": func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	},
	"dur": func(s int64) string { return (time.Duration(s) * time.Second).String() },
	"inc": func(n int) int { return n + 1 },
	"dec": func(n int) int { return n - 1 },
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, s *session, status int, page string, data any) {
	c.renderView(w, s, status, page, view{Data: data})
}

func (c *Console) renderView(w http.ResponseWriter, s *session, status int, page string, v view) {
	if s != nil {
		v.Who, v.CSRF, v.SignedIn = s.who, s.csrf, true
		v.Ops, v.Finance = s.may(opsRoles...), s.may(financeRoles...)
	}
	if v.Title == "" {
		v.Title = page
	}
	var b bytes.Buffer
	t := c.pages[page]
	if t == nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	if err := t.Execute(&b, v); err != nil {
		c.log.Error("console page failed", slog.String("page", page), slog.Any(sandgate.KeyError, err))
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write(b.Bytes())
}

// errorPage is the data of the error page.
type errorPage struct {
	Status  int
	Code    string
	Message string
}

// fail answers a failed API call: the API's own refusal (403 for a role
// that may not, 404, …), or 500.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, s *session, err error) {
	var ae *adminapi.APIError
	if errors.As(err, &ae) {
		c.render(w, r, s, ae.Status, "error", errorPage{Status: ae.Status, Code: string(ae.Code), Message: ae.Message})
		return
	}
	c.log.Error("console request failed", slog.String("route", r.Pattern), slog.Any(sandgate.KeyError, err))
	c.render(w, r, s, http.StatusInternalServerError, "error", errorPage{Status: 500, Message: "internal error"})
}

// forbidden answers a page the role may not see, as the API would.
func (c *Console) forbidden(w http.ResponseWriter, r *http.Request, s *session) {
	c.render(w, r, s, http.StatusForbidden, "error", errorPage{Status: 403, Code: "forbidden",
		Message: "this operator token's role does not allow the action"})
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.renderView(w, nil, http.StatusOK, "login", view{Title: "sign in"})
}

// login checks the token against the operator API (POST /signin, audited
// as console.signin; an unknown token is refused, and audited, there) and
// keeps it in the session cookie.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		c.renderView(w, nil, http.StatusBadRequest, "login", view{Title: "sign in", Flash: "the form could not be read"})
		return
	}
	tok := sandgate.Secret(strings.TrimSpace(r.PostForm.Get("token")))
	var who adminapi.Whoami
	if err := c.call(r, tok, http.MethodPost, "/signin", nil, &who); err != nil {
		var ae *adminapi.APIError
		if errors.As(err, &ae) && ae.Status == http.StatusUnauthorized {
			c.renderView(w, nil, http.StatusUnauthorized, "login", view{Title: "sign in", Flash: "unknown operator token"})
			return
		}
		c.fail(w, r, nil, err)
		return
	}
	setCookie(w, tok.Reveal())
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	s := c.change(w, r)
	if s == nil {
		return
	}
	if err := c.call(r, s.token, http.MethodPost, "/signout", nil, nil); err != nil {
		c.log.Warn("console sign-out not audited", slog.Any(sandgate.KeyError, err))
	}
	clearCookie(w)
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}

// liveWorkspaces walks every page of GET /workspaces with query q.
func (c *Console) liveWorkspaces(r *http.Request, s *session, q url.Values) ([]adminapi.Workspace, error) {
	var out []adminapi.Workspace
	q.Set("limit", "500")
	for range 20 { // 10 000 rows at most on one page of the console
		var l adminapi.WorkspaceList
		if err := c.call(r, s.token, http.MethodGet, "/workspaces?"+q.Encode(), nil, &l); err != nil {
			return nil, err
		}
		out = append(out, l.Workspaces...)
		if l.NextCursor == nil {
			break
		}
		q.Set("cursor", *l.NextCursor)
	}
	return out, nil
}

// count is one row of a count by key.
type count struct {
	Key  string
	Name string // what the page shows; Key on hover when they differ
	N    int
}

func countBy(ws []adminapi.Workspace, key, name func(adminapi.Workspace) string) []count {
	m := map[string]int{}
	names := map[string]string{}
	for _, w := range ws {
		m[key(w)]++
		names[key(w)] = cmp.Or(name(w), key(w))
	}
	out := make([]count, 0, len(m))
	for k, n := range m {
		out = append(out, count{k, names[k], n})
	}
	slices.SortFunc(out, func(a, b count) int { return cmp.Or(cmp.Compare(b.N, a.N), cmp.Compare(a.Key, b.Key)) })
	return out
}

type overviewData struct {
	Live       int
	ByProvider []count
	ByAccount  []count
	Status     *adminapi.Status
	Accounts   int
	// Free are the accounts marked free on purpose, Unconfigured those
	// whose billing was never set (their acquires are refused).
	Free, Unconfigured []adminapi.Account
	Refusals           refusalsData
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request, s *session) {
	var d overviewData
	if s.may(opsRoles...) {
		ws, err := c.liveWorkspaces(r, s, url.Values{})
		if err != nil {
			c.fail(w, r, s, err)
			return
		}
		d.Live = len(ws)
		provider := func(w adminapi.Workspace) string { return w.Provider }
		d.ByProvider = countBy(ws, provider, provider)
		d.ByAccount = countBy(ws, func(w adminapi.Workspace) string { return w.AccountID },
			func(w adminapi.Workspace) string { return w.AccountName })
		if d.Refusals, err = c.refusals(r, s); err != nil {
			c.fail(w, r, s, err)
			return
		}
		d.Status = &adminapi.Status{}
		if err := c.call(r, s.token, http.MethodGet, "/status", nil, d.Status); err != nil {
			c.fail(w, r, s, err)
			return
		}
	}
	var as []adminapi.Account
	if err := c.call(r, s.token, http.MethodGet, "/accounts", nil, &as); err != nil {
		c.fail(w, r, s, err)
		return
	}
	d.Accounts = len(as)
	for _, a := range as {
		switch a.Billing {
		case "free":
			d.Free = append(d.Free, a)
		case "not_configured":
			d.Unconfigured = append(d.Unconfigured, a)
		}
	}
	c.renderView(w, s, http.StatusOK, "overview", view{Title: "overview", Data: d})
}

type workspacesData struct {
	Filter     url.Values
	States     []string
	Workspaces []adminapi.Workspace
	Sort       map[string]sortLink
	Pages      pager
	Refused    string // the API's refusal of the filters, shown above the table
}

// workspaceCols are the live table's sortable columns (the operator
// API's sort names).
var workspaceCols = []string{"id", "account", "instance", "provider", "state", "age", "expires"}

// workspaces is the live table: one page of the operator API's list,
// with filters, sortable columns, next and previous links, and a kill
// link per row. With ?fragment=rows it answers the table's rows alone,
// which live.js puts in place every few seconds.
func (c *Console) workspaces(w http.ResponseWriter, r *http.Request, s *session) {
	const path = Prefix + "workspaces"
	f := filters(r, "q", "account", "instance", "provider", "state", "sort", "limit")
	d := workspacesData{Filter: f, States: []string{"live", "all", "starting", "running", "terminating", "terminated"},
		Sort: sortLinks(path, f, workspaceCols...)}
	var l adminapi.WorkspaceList
	err := c.call(r, s.token, http.MethodGet, "/workspaces?"+pageParams(f, r, "50").Encode(), nil, &l)
	var ae *adminapi.APIError
	switch {
	case errors.As(err, &ae) && (ae.Status == http.StatusBadRequest || ae.Status == http.StatusNotFound):
		d.Refused = ae.Message // a filter naming nothing: the form stays to fix it
	case err != nil:
		c.fail(w, r, s, err)
		return
	}
	d.Workspaces = l.Workspaces
	if l.NextCursor != nil {
		d.Pages = pagesOf(path, f, r, *l.NextCursor)
	} else {
		d.Pages = pagesOf(path, f, r, "")
	}
	if r.URL.Query().Get("fragment") == "rows" {
		c.fragment(w, "workspaces", "rows", d)
		return
	}
	flash := ""
	if id := r.URL.Query().Get("killed"); id != "" {
		flash = "killed " + id
	}
	c.renderView(w, s, http.StatusOK, "workspaces", view{Title: "workspaces", Flash: flash, Query: f.Get("q"), Data: d})
}

// fragment answers one named template of page alone (a live table's
// rows), marked so live.js can tell it from a sign-in page.
func (c *Console) fragment(w http.ResponseWriter, page, name string, data any) {
	var b bytes.Buffer
	if err := c.pages[page].ExecuteTemplate(&b, name, data); err != nil {
		c.log.Error("console fragment failed", slog.String("page", page), slog.Any(sandgate.KeyError, err))
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("X-Console-Fragment", name)
	w.Write(b.Bytes())
}

func cloneValues(v url.Values) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = slices.Clone(vs)
	}
	return out
}

func (c *Console) killConfirm(w http.ResponseWriter, r *http.Request, s *session) {
	var ws adminapi.Workspace
	if err := c.call(r, s.token, http.MethodGet, "/workspaces/"+url.PathEscape(r.PathValue("id")), nil, &ws); err != nil {
		c.fail(w, r, s, err)
		return
	}
	c.renderView(w, s, http.StatusOK, "kill", view{Title: "kill " + ws.ID, Data: ws})
}

// kill ends one workspace through DELETE /admin/v1/workspaces/{id}.
func (c *Console) kill(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	var ws adminapi.Workspace
	if err := c.call(r, s.token, http.MethodDelete, "/workspaces/"+url.PathEscape(id), nil, &ws); err != nil {
		c.fail(w, r, s, err)
		return
	}
	if r.PostForm.Get("from") == "detail" {
		http.Redirect(w, r, Prefix+"workspaces/"+url.PathEscape(id)+"?killed=1", http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, Prefix+"workspaces?killed="+url.QueryEscape(id), http.StatusSeeOther)
}

// accountRow is one account with its funds and budgets.
type accountRow struct {
	Account adminapi.Account
	Balance *adminapi.Balance
	Budgets []adminapi.Budget
}

type accountsData struct {
	Filter url.Values
	Rows   []accountRow
	Sort   map[string]sortLink
	Pages  pager
}

// accounts is one page of the accounts, found by a prefix of their name
// and sorted by name, creation or id, with each one's funds and budgets.
func (c *Console) accounts(w http.ResponseWriter, r *http.Request, s *session) {
	const path = Prefix + "accounts"
	f := filters(r, "q", "sort", "limit")
	if f.Get("sort") == "" {
		f.Set("sort", "name")
	}
	var as []adminapi.Account
	h, err := c.callHeader(r, s.token, http.MethodGet, "/accounts?"+pageParams(f, r, "50").Encode(), nil, &as)
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	d := accountsData{Filter: f, Sort: sortLinks(path, f, "name", "created", "id"),
		Pages: pagesOf(path, f, r, h.Get(adminapi.HeaderNextCursor)), Rows: make([]accountRow, 0, len(as))}
	for _, a := range as {
		row := accountRow{Account: a, Balance: &adminapi.Balance{}}
		if err := c.call(r, s.token, http.MethodGet, "/accounts/"+url.PathEscape(a.ID)+"/funds", nil, row.Balance); err != nil {
			c.fail(w, r, s, err)
			return
		}
		if err := c.call(r, s.token, http.MethodGet, "/accounts/"+url.PathEscape(a.ID)+"/budgets", nil, &row.Budgets); err != nil {
			c.fail(w, r, s, err)
			return
		}
		d.Rows = append(d.Rows, row)
	}
	flash := ""
	if id := r.URL.Query().Get("created"); id != "" {
		flash = "created account " + id
	}
	c.renderView(w, s, http.StatusOK, "accounts", view{Title: "accounts", Query: f.Get("q"), Flash: flash, Data: d})
}

// createAccount creates an account through POST /admin/v1/accounts; a
// name another account has is the API's 409, shown with its message.
func (c *Console) createAccount(w http.ResponseWriter, r *http.Request, s *session) {
	var a adminapi.Account
	req := adminapi.CreateAccountRequest{Name: strings.TrimSpace(r.PostForm.Get("name"))}
	if err := c.call(r, s.token, http.MethodPost, "/accounts", req, &a); err != nil {
		c.fail(w, r, s, err)
		return
	}
	http.Redirect(w, r, Prefix+"accounts?"+url.Values{"q": {a.Name}, "created": {a.ID}}.Encode(), http.StatusSeeOther)
}

// month parses ?month=YYYY-MM (default: the current UTC month) into its
// half-open range.
func (c *Console) month(r *http.Request) (string, time.Time, time.Time, error) {
	m := r.URL.Query().Get("month")
	if m == "" {
		m = c.clock.Now().UTC().Format("2006-01")
	}
	from, err := time.Parse("2006-01", m)
	if err != nil {
		return "", time.Time{}, time.Time{}, &adminapi.APIError{Status: http.StatusBadRequest, Code: "invalid_request", Message: "month must be YYYY-MM"}
	}
	return m, from, from.AddDate(0, 1, 0), nil
}

// summaryOf is GET /usage/summary grouped by by over [from, to), with the
// non-empty filters of f (account, size).
func (c *Console) summaryOf(r *http.Request, s *session, by string, from, to time.Time, f url.Values) ([]adminapi.SummaryGroup, error) {
	sum, err := c.summary(r, s, by, from, to, f)
	return sum.Groups, err
}

// summary is summaryOf's whole answer, the warm pools' lines included.
func (c *Console) summary(r *http.Request, s *session, by string, from, to time.Time, f url.Values) (adminapi.UsageSummary, error) {
	q := url.Values{"group_by": {by}, "from": {from.Format(time.RFC3339)}, "to": {to.Format(time.RFC3339)}}
	for k := range f {
		if v := f.Get(k); v != "" {
			q.Set(k, v)
		}
	}
	var sum adminapi.UsageSummary
	err := c.call(r, s.token, http.MethodGet, "/usage/summary?"+q.Encode(), nil, &sum)
	return sum, err
}

// usageCSV is the month's export as finance downloads it: the operator
// API's GET /usage?format=csv itself, streamed through.
func (c *Console) usageCSV(w http.ResponseWriter, r *http.Request, s *session) {
	m, from, to, err := c.month(r)
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	q := url.Values{"format": {"csv"}, "from": {from.Format(time.RFC3339)}, "to": {to.Format(time.RFC3339)}}
	req, err := apiRequest(r, s.token, http.MethodGet, "/usage?"+q.Encode(), nil)
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	if !s.may(financeRoles...) {
		c.forbidden(w, r, s)
		return
	}
	w.Header().Set("Content-Disposition", `attachment; filename="usage-`+m+`.csv"`)
	c.api.ServeHTTP(w, req)
}

type controlsData struct {
	Status adminapi.Status
	Names  nameBook
}

func (c *Console) controls(w http.ResponseWriter, r *http.Request, s *session) {
	var d controlsData
	if err := c.call(r, s.token, http.MethodGet, "/status", nil, &d.Status); err != nil {
		c.fail(w, r, s, err)
		return
	}
	d.Names = c.names(r, s)
	c.renderView(w, s, http.StatusOK, "controls", view{Title: "controls", Flash: r.URL.Query().Get("done"), Data: d})
}

// until turns the form's "for" (a duration such as 30m) into an RFC 3339
// time; empty means until lifted.
func (c *Console) until(f url.Values) (string, error) {
	v := strings.TrimSpace(f.Get("for"))
	if v == "" {
		return "", nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return "", &adminapi.APIError{Status: http.StatusBadRequest, Code: "invalid_request", Message: "for must be a positive duration such as 30m or 2h"}
	}
	return c.clock.Now().Add(d).UTC().Format(time.RFC3339), nil
}

func badForm(msg string) error {
	return &adminapi.APIError{Status: http.StatusBadRequest, Code: "invalid_request", Message: msg}
}

func doneRedirect(w http.ResponseWriter, r *http.Request, msg string) {
	http.Redirect(w, r, Prefix+"controls?done="+url.QueryEscape(msg), http.StatusSeeOther)
}

// stop sets or lifts an emergency stop. Setting one needs the word STOP
// typed into the confirmation field.
func (c *Console) stop(w http.ResponseWriter, r *http.Request, s *session) {
	f := r.PostForm
	on := f.Get("on") == "true"
	req := adminapi.StopRequest{On: &on, AccountID: strings.TrimSpace(f.Get("account"))}
	scope := "the broker"
	if req.AccountID != "" {
		scope = "account " + req.AccountID
	}
	if on {
		if f.Get("confirm") != "STOP" {
			c.fail(w, r, s, badForm("type STOP to confirm the emergency stop"))
			return
		}
		until, err := c.until(f)
		if err != nil {
			c.fail(w, r, s, err)
			return
		}
		req.Reason, req.Note, req.Until = strings.TrimSpace(f.Get("reason")), f.Get("note"), until
	}
	var out adminapi.Swept
	if err := c.call(r, s.token, http.MethodPost, "/stop", req, &out); err != nil {
		c.fail(w, r, s, err)
		return
	}
	if on {
		doneRedirect(w, r, fmt.Sprintf("emergency stop set on %s: terminated=%d failed=%d", scope, out.Terminated, out.Failed))
		return
	}
	doneRedirect(w, r, "emergency stop lifted on "+scope)
}

// target reads a pause or resume form's one target: an account or an
// instance id.
func target(f url.Values) (acct, inst, id string, err error) {
	acct, inst = strings.TrimSpace(f.Get("account")), strings.TrimSpace(f.Get("instance"))
	if (acct == "") == (inst == "") {
		return "", "", "", badForm("give exactly one of account and instance")
	}
	return acct, inst, acct + inst, nil
}

// pause pauses an account or an instance; the confirmation field must
// repeat its id.
func (c *Console) pause(w http.ResponseWriter, r *http.Request, s *session) {
	f := r.PostForm
	acct, inst, id, err := target(f)
	if err == nil && strings.TrimSpace(f.Get("confirm")) != id {
		err = badForm("type the id of the account or instance again to confirm the pause")
	}
	var until string
	if err == nil {
		until, err = c.until(f)
	}
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	var out adminapi.Swept
	req := adminapi.PauseRequest{AccountID: acct, InstanceID: inst, Reason: strings.TrimSpace(f.Get("reason")), Note: f.Get("note"), Until: until}
	if err := c.call(r, s.token, http.MethodPost, "/pause", req, &out); err != nil {
		c.fail(w, r, s, err)
		return
	}
	doneRedirect(w, r, fmt.Sprintf("paused %s: terminated=%d failed=%d", id, out.Terminated, out.Failed))
}

func (c *Console) resume(w http.ResponseWriter, r *http.Request, s *session) {
	acct, inst, id, err := target(r.PostForm)
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	if err := c.call(r, s.token, http.MethodPost, "/resume", adminapi.ResumeRequest{AccountID: acct, InstanceID: inst}, nil); err != nil {
		c.fail(w, r, s, err)
		return
	}
	doneRedirect(w, r, "resumed "+id)
}

// auditEntry is one line of the audit export, as the page shows it.
type auditEntry struct {
	Time    time.Time `json:"time"`
	Actor   string    `json:"actor"`
	Role    string    `json:"role"`
	Action  string    `json:"action"`
	Target  string    `json:"target"`
	Outcome struct {
		Status     int    `json:"status"`
		Code       string `json:"code"`
		Terminated *int   `json:"terminated"`
		Failed     *int   `json:"failed"`
	} `json:"outcome"`
	SourceIP  string `json:"source_ip"`
	RequestID string `json:"request_id"`
}

type auditData struct {
	Days, Page, Pages int
	Entries           []auditEntry
	Total             int // entries in the range
	Shown             int // the newest of them that can be paged (at most auditKeep)
	Names             nameBook
}

// auditPageSize is the audit page's rows; auditKeep bounds how many of
// the newest entries of a range the console pages through (the full
// range is `sandgate admin audit`'s).
const (
	auditPageSize = 50
	auditKeep     = 5000
)

// audit pages through the audit log of the last days (1 by default),
// newest first, through the audit export (which audits its own reading).
func (c *Console) audit(w http.ResponseWriter, r *http.Request, s *session) {
	days, _ := strconv.Atoi(r.URL.Query().Get("days"))
	days = min(max(days, 1), 400)
	page, _ := strconv.Atoi(r.URL.Query().Get("page"))
	page = max(page, 1)
	from := c.clock.Now().Add(-time.Duration(days) * 24 * time.Hour).UTC().Format(time.RFC3339)
	// Only the newest auditKeep entries are kept while the export streams.
	var all []auditEntry
	total := 0
	err := c.streamLines(r, s.token, "/audit?from="+url.QueryEscape(from), func(line []byte) {
		var e auditEntry
		if json.Unmarshal(line, &e) != nil {
			return
		}
		total++
		if len(all) == auditKeep {
			all = append(all[:0:0], all[auditKeep/2:]...)
		}
		all = append(all, e)
	})
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	slices.Reverse(all)
	d := auditData{Days: days, Page: page, Total: total, Shown: len(all), Pages: max(1, (len(all)+auditPageSize-1)/auditPageSize)}
	d.Names = c.names(r, s)
	lo := min((page-1)*auditPageSize, len(all))
	d.Entries = all[lo:min(lo+auditPageSize, len(all))]
	c.renderView(w, s, http.StatusOK, "audit", view{Title: "audit log", Data: d})
}

type searchData struct {
	Q          string
	Accounts   []adminapi.Account
	Instances  []adminapi.Instance
	Workspaces []adminapi.Workspace
	Names      nameBook
	More       bool // some list had more matches than it shows
}

// searchLimit is how many matches of each kind the search page shows.
const searchLimit = 20

// search finds accounts, instances and workspaces (ended ones too) by a
// prefix of their names, ids or labels: the layout's search box. Each
// role sees the kinds the operator API lets it list.
func (c *Console) search(w http.ResponseWriter, r *http.Request, s *session) {
	d := searchData{Q: strings.TrimSpace(r.URL.Query().Get("q"))}
	if d.Q == "" {
		c.renderView(w, s, http.StatusOK, "search", view{Title: "search", Data: d})
		return
	}
	q := url.Values{"q": {d.Q}, "limit": {strconv.Itoa(searchLimit)}, "sort": {"name"}}
	h, err := c.callHeader(r, s.token, http.MethodGet, "/accounts?"+q.Encode(), nil, &d.Accounts)
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	d.More = h.Get(adminapi.HeaderNextCursor) != ""
	if s.may(opsRoles...) {
		h, err := c.callHeader(r, s.token, http.MethodGet, "/instances?"+q.Encode(), nil, &d.Instances)
		if err != nil {
			c.fail(w, r, s, err)
			return
		}
		d.More = d.More || h.Get(adminapi.HeaderNextCursor) != ""
		var l adminapi.WorkspaceList
		wq := url.Values{"q": {d.Q}, "limit": {strconv.Itoa(searchLimit)}, "sort": {"age"}, "state": {"all"}}
		if err := c.call(r, s.token, http.MethodGet, "/workspaces?"+wq.Encode(), nil, &l); err != nil {
			c.fail(w, r, s, err)
			return
		}
		d.Workspaces = l.Workspaces
		d.More = d.More || l.NextCursor != nil
		d.Names = c.names(r, s)
	}
	c.renderView(w, s, http.StatusOK, "search", view{Title: "search", Query: d.Q, Data: d})
}
