package admin_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/protocol"
)

// named creates an account called name and returns its id.
func (e *env) named(name string) string {
	e.t.Helper()
	var a adminapi.Account
	e.do(adminToken, http.MethodPost, "/accounts", adminapi.CreateAccountRequest{Name: name}, &a)
	return a.ID
}

// namedInstance creates an instance of acct called name and returns its id.
func (e *env) namedInstance(acct, name string) string {
	e.t.Helper()
	var in adminapi.Instance
	e.do(adminToken, http.MethodPost, "/instances", adminapi.CreateInstanceRequest{AccountID: acct, Name: name}, &in)
	return in.ID
}

// list GETs path with tok and decodes the answer into out; it returns
// the Next-Cursor header.
func (e *env) list(tok, path string, out any) string {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.url+"/admin/v1"+path, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("GET %s = %d; want 200", path, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		e.t.Fatalf("GET %s: %v", path, err)
	}
	return resp.Header.Get(adminapi.HeaderNextCursor)
}

func byIDDesc(ids ...string) []string {
	slices.Sort(ids)
	slices.Reverse(ids)
	return ids
}

func accountNames(as []adminapi.Account) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.Name)
	}
	return out
}

// Accounts are found by a prefix of their name, sorted by name or
// creation either way, and walked a page at a time with the cursor the
// Next-Cursor header carries; without those parameters the list is every
// account, as before.
func TestAccountsFindSortAndPage(t *testing.T) {
	e := newEnv(t)
	for _, n := range []string{"initech", "Globex", "globe trotters", "acme"} {
		e.named(n)
		e.clock.Add(time.Second)
	}
	for _, tt := range []struct {
		query string
		want  []string
	}{
		{"q=glob&sort=name", []string{"globe trotters", "Globex"}},
		{"q=GLOBEX", []string{"Globex"}},
		{"q=nobody", nil},
		{"sort=name", []string{"acme", "globe trotters", "Globex", "initech"}},
		{"sort=-name", []string{"initech", "Globex", "globe trotters", "acme"}},
		{"sort=created", []string{"initech", "Globex", "globe trotters", "acme"}},
		{"sort=-created&limit=2", []string{"acme", "globe trotters"}},
	} {
		var as []adminapi.Account
		e.list(financeToken, "/accounts?"+tt.query, &as)
		if got := accountNames(as); !slices.Equal(got, tt.want) {
			t.Errorf("GET /accounts?%s = %q; want %q", tt.query, got, tt.want)
		}
	}
	var all []adminapi.Account
	if next := e.list(adminToken, "/accounts", &all); len(all) != 4 || next != "" {
		t.Errorf("GET /accounts = %d accounts, next %q; want all 4 and no next page", len(all), next)
	}

	var walked []string
	cursor := ""
	for range 6 {
		var as []adminapi.Account
		cursor = e.list(adminToken, "/accounts?sort=name&limit=1&cursor="+url.QueryEscape(cursor), &as)
		walked = append(walked, accountNames(as)...)
		if cursor == "" {
			break
		}
		// An account created during the walk, before the cursor, does
		// not shift the pages.
		if len(walked) == 2 {
			e.named("aardvark")
		}
	}
	if want := []string{"acme", "globe trotters", "Globex", "initech"}; !slices.Equal(walked, want) {
		t.Errorf("paged walk by name = %q; want %q", walked, want)
	}

	var first []adminapi.Account
	next := e.list(adminToken, "/accounts?sort=name&limit=1", &first)
	for _, tt := range []string{"/accounts?sort=balance", "/accounts?limit=0", "/accounts?limit=501",
		"/accounts?cursor=%21", "/accounts?sort=created&cursor=" + url.QueryEscape(next)} {
		if st, code := e.refused(adminToken, http.MethodGet, tt, nil); st != 400 || code != protocol.InvalidRequest {
			t.Errorf("GET %s = %d %s; want 400 invalid_request", tt, st, code)
		}
	}
}

// Instances are found by their name or their account's, and the account
// filter takes the account's name.
func TestInstancesFindByName(t *testing.T) {
	e := newEnv(t)
	globex, initech := e.named("globex"), e.named("initech")
	g1, g2 := e.namedInstance(globex, "ci"), e.namedInstance(globex, "agents")
	i1 := e.namedInstance(initech, "ci")
	instIDs := func(ins []adminapi.Instance) []string {
		var out []string
		for _, in := range ins {
			out = append(out, in.ID)
		}
		return out
	}
	for _, tt := range []struct {
		query string
		want  []string
	}{
		{"account=globex&sort=name", []string{g2, g1}},
		{"account=GLOBEX&sort=-name", []string{g1, g2}},
		{"q=glob&sort=name", []string{g2, g1}},
		{"q=ag", []string{g2}},
		{"q=init", []string{i1}},
		{"q=ci&sort=account", []string{g1, i1}},
	} {
		var ins []adminapi.Instance
		e.list(operatorToken, "/instances?"+tt.query, &ins)
		if got := instIDs(ins); !slices.Equal(got, tt.want) {
			t.Errorf("GET /instances?%s = %v; want %v", tt.query, got, tt.want)
		}
	}
	if st, code := e.refused(operatorToken, http.MethodGet, "/instances?account=umbrella", nil); st != 404 || code != protocol.NotFound {
		t.Errorf("GET /instances?account=umbrella = %d %s; want 404 not_found", st, code)
	}
}

// Workspaces are found by their id, label, account name or instance name
// by prefix, filtered by account and instance names, carry those names,
// sort by age, state and account, and page under any sort.
func TestWorkspacesFindSortAndPage(t *testing.T) {
	e := newEnv(t)
	globex, initech := e.named("globex"), e.named("initech")
	gi, ii := e.namedInstance(globex, "agents"), e.namedInstance(initech, "ci")
	old := e.running(initech, ii, 1)[0]
	e.clock.Add(time.Minute)
	mid := e.running(globex, gi, 1)[0]
	e.clock.Add(time.Minute)
	young := e.running(globex, gi, 1)[0]

	for _, tt := range []struct {
		query string
		want  []string
	}{
		{"account=globex", []string{mid.ID, young.ID}},
		{"account=Globex&instance=agents", []string{mid.ID, young.ID}},
		{"instance=ci", []string{old.ID}},
		{"q=glo", []string{mid.ID, young.ID}},
		{"q=ci", []string{old.ID}},
		{"q=" + young.ID[:len(young.ID)-2], []string{young.ID}},
		{"q=l", []string{old.ID, mid.ID, young.ID}}, // every label is "l"
		{"q=zzz", nil},
		{"sort=age", []string{young.ID, mid.ID, old.ID}},
		{"sort=-age", []string{old.ID, mid.ID, young.ID}},
		{"sort=account", append(slices.Sorted(slices.Values([]string{mid.ID, young.ID})), old.ID)},
		{"sort=-account", append([]string{old.ID}, byIDDesc(mid.ID, young.ID)...)}, // ties: by id, descending too
	} {
		var l adminapi.WorkspaceList
		e.do(operatorToken, http.MethodGet, "/workspaces?"+tt.query, nil, &l)
		if got := ids(l); !slices.Equal(got, tt.want) {
			t.Errorf("GET /workspaces?%s = %v; want %v", tt.query, got, tt.want)
		}
	}

	var l adminapi.WorkspaceList
	e.do(operatorToken, http.MethodGet, "/workspaces?q="+old.ID, nil, &l)
	if len(l.Workspaces) != 1 || l.Workspaces[0].AccountName != "initech" || l.Workspaces[0].InstanceName != "ci" {
		t.Errorf("GET /workspaces?q=%s = %+v; want one row named initech / ci", old.ID, l.Workspaces)
	}
	var one adminapi.Workspace
	e.do(operatorToken, http.MethodGet, "/workspaces/"+mid.ID, nil, &one)
	if one.AccountName != "globex" || one.InstanceName != "agents" {
		t.Errorf("GET /workspaces/%s names %q / %q; want globex / agents", mid.ID, one.AccountName, one.InstanceName)
	}

	var walked []string
	cursor := ""
	for range 5 {
		var l adminapi.WorkspaceList
		e.do(operatorToken, http.MethodGet, "/workspaces?sort=age&limit=1&cursor="+url.QueryEscape(cursor), nil, &l)
		walked = append(walked, ids(l)...)
		if l.NextCursor == nil {
			break
		}
		cursor = *l.NextCursor
	}
	if want := []string{young.ID, mid.ID, old.ID}; !slices.Equal(walked, want) {
		t.Errorf("paged walk by age = %v; want %v", walked, want)
	}

	// A name two instances share needs an account or the id.
	e.namedInstance(initech, "agents")
	codes := map[int]protocol.Code{400: protocol.InvalidRequest, 404: protocol.NotFound}
	for query, status := range map[string]int{"instance=agents": 400, "account=umbrella": 404, "sort=size": 400} {
		if st, code := e.refused(operatorToken, http.MethodGet, "/workspaces?"+query, nil); st != status || code != codes[status] {
			t.Errorf("GET /workspaces?%s = %d %s; want %d %s", query, st, code, status, codes[status])
		}
	}
	e.do(operatorToken, http.MethodGet, "/workspaces?account=globex&instance=agents", nil, &l)
	if got := ids(l); !slices.Equal(got, []string{mid.ID, young.ID}) {
		t.Errorf("GET /workspaces?account=globex&instance=agents = %v; want globex's two", got)
	}
}
