package admin_test

import (
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/internal/fakeprovider"
	"github.com/sandgate/sandgate/protocol"
)

// ids returns the ids of a listing's rows.
func ids(l adminapi.WorkspaceList) []string {
	var out []string
	for _, w := range l.Workspaces {
		out = append(out, w.ID)
	}
	return out
}

func TestWorkspacesListAcrossAccounts(t *testing.T) {
	e := newEnv(t)
	a1, a2 := e.account(), e.account()
	i1, i2 := e.instance(a1), e.instance(a2)
	w1 := e.running(a1, i1, 2)
	e.clock.Add(time.Minute)
	w2 := e.running(a2, i2, 1)
	e.clock.Add(90 * time.Second)
	all := []string{w1[0].ID, w1[1].ID, w2[0].ID}
	slices.Sort(all[:2]) // same created_at: by id

	var l adminapi.WorkspaceList
	e.do(operatorToken, http.MethodGet, "/workspaces", nil, &l)
	if got := ids(l); !slices.Equal(got, all) || l.NextCursor != nil {
		t.Fatalf("GET /workspaces = %v (next %v); want %v, no next page", got, l.NextCursor, all)
	}
	r := l.Workspaces[2]
	if r.AccountID != a2 || r.InstanceID != i2 || r.Provider != "local" || r.Size != "small" || r.State != "running" ||
		r.AgeSeconds != 90 || r.MeteredSeconds != 90 || r.Currency != "XXX" || r.AmountMicros != 0 || r.Amount != "0.00" ||
		r.ExpiresAt != w2[0].ExpiresAt.UTC().Format(time.RFC3339) || r.TerminatedAt != nil || r.TerminationReason != nil {
		t.Errorf("row = %+v; want acct %s inst %s local small running, age and metered 90 s, XXX 0.00", r, a2, i2)
	}

	for _, tt := range []struct {
		query string
		want  []string
	}{
		{"account=" + a1, all[:2]},
		{"instance=" + i2, all[2:]},
		{"account=" + a1 + "&instance=" + i2, nil},
		{"provider=local", all},
		{"provider=modal", nil},
		{"state=running", all},
		{"state=starting", nil},
		{"state=terminated", nil},
		{"created_after=" + url.QueryEscape(w2[0].CreatedAt.UTC().Format(time.RFC3339)), all[2:]},
		{"created_before=" + url.QueryEscape(w2[0].CreatedAt.UTC().Format(time.RFC3339)), all[:2]},
	} {
		var l adminapi.WorkspaceList
		e.do(operatorToken, http.MethodGet, "/workspaces?"+tt.query, nil, &l)
		if got := ids(l); !slices.Equal(got, tt.want) {
			t.Errorf("GET /workspaces?%s = %v; want %v", tt.query, got, tt.want)
		}
	}

	// Paging: one row a page, the cursor naming the last row.
	var walked []string
	cursor := ""
	for range 5 {
		var l adminapi.WorkspaceList
		e.do(adminToken, http.MethodGet, "/workspaces?limit=1&cursor="+cursor, nil, &l)
		walked = append(walked, ids(l)...)
		if l.NextCursor == nil {
			break
		}
		cursor = *l.NextCursor
	}
	if !slices.Equal(walked, all) {
		t.Errorf("paged walk = %v; want %v", walked, all)
	}

	for _, tt := range []struct {
		path   string
		status int
		code   protocol.Code
	}{
		{"/workspaces?state=dead", 400, protocol.InvalidRequest},
		{"/workspaces?limit=0", 400, protocol.InvalidRequest},
		{"/workspaces?limit=501", 400, protocol.InvalidRequest},
		{"/workspaces?cursor=%21%21", 400, protocol.InvalidRequest},
		{"/workspaces?created_after=yesterday", 400, protocol.InvalidRequest},
		{"/workspaces?account=acct_nope", 404, protocol.NotFound},
		{"/workspaces?instance=inst_nope", 404, protocol.NotFound},
		{"/workspaces/ws_nope", 404, protocol.NotFound},
	} {
		if st, code := e.refused(operatorToken, http.MethodGet, tt.path, nil); st != tt.status || code != tt.code {
			t.Errorf("GET %s = %d %s; want %d %s", tt.path, st, code, tt.status, tt.code)
		}
	}
}

func TestWorkspaceGetAndKill(t *testing.T) {
	e := newEnv(t)
	a := e.account()
	i := e.instance(a)
	ws := e.running(a, i, 2)
	e.clock.Add(30 * time.Second)

	var got adminapi.Workspace
	e.do(operatorToken, http.MethodGet, "/workspaces/"+ws[0].ID, nil, &got)
	if got.ID != ws[0].ID || got.AccountID != a || got.State != "running" || got.MeteredSeconds != 30 {
		t.Fatalf("GET /workspaces/%s = %+v; want it running, 30 s metered", ws[0].ID, got)
	}

	for _, tok := range []string{financeToken} {
		for _, m := range []string{http.MethodGet, http.MethodDelete} {
			if st, code := e.refused(tok, m, "/workspaces/"+ws[0].ID, nil); st != 403 || code != protocol.Forbidden {
				t.Errorf("finance %s /workspaces/{id} = %d %s; want 403 forbidden", m, st, code)
			}
		}
		if st, code := e.refused(tok, http.MethodGet, "/workspaces", nil); st != 403 || code != protocol.Forbidden {
			t.Errorf("finance GET /workspaces = %d %s; want 403 forbidden", st, code)
		}
	}
	if st, code := e.refused(operatorToken, http.MethodDelete, "/workspaces/ws_nope", nil); st != 404 || code != protocol.NotFound {
		t.Errorf("DELETE /workspaces/ws_nope = %d %s; want 404 not_found", st, code)
	}

	var killed adminapi.Workspace
	e.do(operatorToken, http.MethodDelete, "/workspaces/"+ws[0].ID, nil, &killed)
	if killed.State != "terminated" || killed.TerminationReason == nil || *killed.TerminationReason != "emergency_stopped" ||
		killed.TerminatedAt == nil || killed.MeteredSeconds != 30 {
		t.Fatalf("kill = %+v; want terminated, emergency_stopped, 30 s", killed)
	}
	e.wantStates("killed", ws[:1], "terminated/emergency_stopped")
	e.wantStates("spared", ws[1:], "running")
	if n := e.prov.Live(); n != 1 {
		t.Errorf("provider sandboxes after the kill = %d; want 1", n)
	}
	// A second kill answers the same end.
	var again adminapi.Workspace
	e.do(operatorToken, http.MethodDelete, "/workspaces/"+ws[0].ID, nil, &again)
	if again.State != "terminated" || *again.TerminationReason != "emergency_stopped" || *again.TerminatedAt != *killed.TerminatedAt {
		t.Errorf("second kill = %+v; want the first kill's end", again)
	}
	var live adminapi.WorkspaceList
	e.do(operatorToken, http.MethodGet, "/workspaces", nil, &live)
	if got := ids(live); !slices.Equal(got, []string{ws[1].ID}) {
		t.Errorf("live after the kill = %v; want %v", got, ws[1].ID)
	}
	e.do(operatorToken, http.MethodGet, "/workspaces?state=terminated", nil, &live)
	if got := ids(live); !slices.Equal(got, []string{ws[0].ID}) {
		t.Errorf("terminated after the kill = %v; want %v", got, ws[0].ID)
	}

	// A provider that does not confirm: 502, the workspace stays terminating.
	e.prov.Set(func(p *fakeprovider.Provider) { p.TerminateErr = errors.New("vendor down") })
	if st, code := e.refused(adminToken, http.MethodDelete, "/workspaces/"+ws[1].ID, nil); st != 502 || code != protocol.UpstreamError {
		t.Errorf("kill with the provider down = %d %s; want 502 upstream_error", st, code)
	}
	e.wantStates("unconfirmed kill", ws[1:], "terminating/emergency_stopped")
	e.prov.Set(func(p *fakeprovider.Provider) { p.TerminateErr = nil })
	e.do(adminToken, http.MethodDelete, "/workspaces/"+ws[1].ID, nil, &killed)
	if killed.State != "terminated" {
		t.Errorf("kill retried = %+v; want terminated", killed)
	}

	evs, _ := e.audit("")
	ev, ok := findEvent(evs, "workspace.kill", 200)
	if !ok || ev.Target != "workspace:"+ws[0].ID || ev.Actor != "oscar:sgo_OPER" || ev.Outcome.Terminated == nil ||
		*ev.Outcome.Terminated != 1 || !strings.Contains(string(ev.Before), `"state":"running"`) ||
		!strings.Contains(string(ev.After), `"termination_reason":"emergency_stopped"`) {
		t.Errorf("workspace.kill entry = %+v (before %s after %s)", ev, ev.Before, ev.After)
	}
	if ev, ok := findEvent(evs, "workspace.kill", 403); !ok || ev.Target != "workspace:"+ws[0].ID || ev.Role != "finance" {
		t.Errorf("refused workspace.kill entry = %+v, %v; want target workspace:%s by finance", ev, ok, ws[0].ID)
	}
	if ev, ok := findEvent(evs, "workspace.kill", 502); !ok || ev.Outcome.Failed == nil || *ev.Outcome.Failed != 1 {
		t.Errorf("failed workspace.kill entry = %+v, %v; want failed=1", ev, ok)
	}
	if _, ok := findEvent(evs, "workspace.get", 200); ok {
		t.Error("a successful workspace read is in the audit log")
	}
}
