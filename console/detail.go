package console

import (
	"net/http"
	"net/url"
	"time"

	"github.com/sandgate/sandgate/adminapi"
)

// The detail pages of one workspace and one account, read through the
// operator API's detail routes.

// workspaceDetail is one workspace: its history, where it runs, its
// egress and what it has cost, and the kill button while it lives.
func (c *Console) workspaceDetail(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	var d adminapi.WorkspaceDetail
	if err := c.call(r, s.token, http.MethodGet, "/workspaces/"+url.PathEscape(id)+"/detail", nil, &d); err != nil {
		c.fail(w, r, s, err)
		return
	}
	flash := ""
	if r.URL.Query().Get("killed") != "" {
		flash = "killed " + d.Workspace.ID
	}
	c.renderView(w, s, http.StatusOK, "workspace", view{Title: "workspace " + d.Workspace.ID, Flash: flash, Data: d})
}

type accountData struct {
	adminapi.AccountDetail
	Month    string // the current UTC month, for the statement link
	Instance map[string]string
}

// accountDetail is one account: its balance, holds and budgets, and for
// roles that read them its instances and tokens, limits, recent
// workspaces and refusals, with links to its exports.
func (c *Console) accountDetail(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	d := accountData{Month: c.clock.Now().UTC().Format("2006-01"), Instance: map[string]string{}}
	if err := c.call(r, s.token, http.MethodGet, "/accounts/"+url.PathEscape(id), nil, &d.AccountDetail); err != nil {
		c.fail(w, r, s, err)
		return
	}
	for _, in := range d.Instances {
		d.Instance[in.Instance.ID] = in.Instance.Name
	}
	c.renderView(w, s, http.StatusOK, "account", view{Title: d.Account.Name, Data: d})
}

// accountStatement is the account's statement of a month as JSON, the
// operator API's own answer, downloaded (and audited) as an export.
func (c *Console) accountStatement(w http.ResponseWriter, r *http.Request, s *session) {
	id, m := r.PathValue("id"), r.URL.Query().Get("month")
	if _, err := time.Parse("2006-01", m); err != nil {
		c.fail(w, r, s, badForm("month must be YYYY-MM"))
		return
	}
	req, err := apiRequest(r, s.token, http.MethodGet, "/accounts/"+url.PathEscape(id)+"/statement?month="+m, nil)
	if err != nil {
		c.fail(w, r, s, err)
		return
	}
	w.Header().Set("Content-Disposition", `attachment; filename="statement-`+m+`.json"`)
	c.api.ServeHTTP(w, req)
}
