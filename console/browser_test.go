package console_test

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/console"
	"github.com/sandgate/sandgate/internal/browsertest"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
)

// tenants is how many accounts the browser test seeds, one workspace each.
const tenants = 50

// browserStep bounds one browser step; generous, for a loaded machine.
const browserStep = 45 * time.Second

// tab is one headless Chromium tab driving the console under test.
type tab struct {
	t    *testing.T
	ctx  context.Context
	base string // the console's URL, ending in /console/
	shot string // the directory screenshots are written to
}

// newTab starts a headless Chromium with a fresh profile; it ends with
// the test.
func newTab(t *testing.T, base string) *tab {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("the console's browser tests need chromium (make deps installs it): %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin), chromedp.UserDataDir(t.TempDir()),
		chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1400, 1000), chromedp.WSURLReadTimeout(browsertest.StartTimeout))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(func(string, ...any) {}))
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if _, err := chromedp.Run(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	shot := os.Getenv("SANDGATE_SCREENSHOTS")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "screenshots")
	}
	if err := os.MkdirAll(shot, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("console screenshots in %s", shot)
	return &tab{t: t, ctx: ctx, base: base, shot: shot}
}

// run runs one browser action within browserStep and returns its value;
// a failure names the step and the page it was on.
func run[T any](tb *tab, what string, a chromedp.Action[T]) T {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, browserStep)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		dctx, dcancel := context.WithTimeout(tb.ctx, 5*time.Second)
		defer dcancel()
		loc, _ := chromedp.Run(dctx, chromedp.Location())
		body, _ := chromedp.Run(dctx, chromedp.OuterHTML(chromedp.CSS("body")))
		tb.t.Fatalf("%s: %v\nat %s:\n%s", what, err, loc, body)
	}
	return v
}

func (tb *tab) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	run(tb, what, chromedp.Steps(steps...))
}

// follow clicks the link or button id, waits until the browser is on the
// page it leads to, then until ready is visible there. Waiting for ready
// alone would not do where the page before has it too: the browser may
// not have left that page yet.
func (tb *tab) follow(what, id, ready string) {
	tb.t.Helper()
	// A mark on the page before, which the page it leads to lacks.
	// DevTools evaluates it with the page's own scripts off too.
	run(tb, what+": mark the page", chromedp.Evaluate[bool](`window.sgLeft = false; true`))
	tb.do(what, chromedp.Click(chromedp.ID(id)))
	// An evaluation while the browser is between the pages fails; that is
	// part of the wait.
	for deadline := time.Now().Add(browserStep); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(tb.ctx, 5*time.Second)
		left, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.sgLeft !== false && document.readyState !== 'loading'`))
		cancel()
		if err == nil && left {
			break
		}
		if time.Now().After(deadline) {
			tb.t.Fatalf("%s: still on the page before after %v (%v)", what, browserStep, err)
		}
	}
	tb.do(what, chromedp.WaitVisible(chromedp.ID(ready)))
}

// screenshot writes the whole page to name.png in the screenshot directory.
func (tb *tab) screenshot(name string) {
	tb.t.Helper()
	png := run(tb, "screenshot "+name, chromedp.FullScreenshot(100))
	if err := os.WriteFile(filepath.Join(tb.shot, name+".png"), png, 0o644); err != nil {
		tb.t.Fatal(err)
	}
}

// rowIDs are the workspace ids of the live table's rows, top to bottom.
func (tb *tab) rowIDs() []string {
	tb.t.Helper()
	return run(tb, "rows", chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('#workspaces tbody tr[id^="ws-"]')).map(r => r.id.slice(3))`))
}

// seeded is what the browser test put in the broker.
type seeded struct {
	globex     string   // the account named "Globex Corporation"
	workspaces []string // in creation order, one second apart
}

// seed creates tenants accounts (one of them Globex Corporation), each
// free of charge with one instance and one running workspace acquired
// through the protocol, one second of the harness clock apart.
func seed(t *testing.T, h *sgtest.Harness) seeded {
	t.Helper()
	var s seeded
	for i := range tenants {
		name := fmt.Sprintf("tenant %02d", i)
		if i == 17 {
			name = "Globex Corporation"
		}
		var a adminapi.Account
		h.AdminDo(http.MethodPost, "/accounts", adminapi.CreateAccountRequest{Name: name}, &a)
		h.AdminDo(http.MethodPut, "/accounts/"+a.ID+"/billing", adminapi.BillingSettings{Free: true}, nil)
		if i == 17 {
			s.globex = a.ID
		}
		in := h.NewInstanceIn(a.ID, adminapi.Scope{})
		ws, _, err := h.Client(in.Token).Acquire(context.Background(), "seed",
			protocol.AcquireRequest{Label: fmt.Sprintf("job-%02d", i), Egress: &protocol.Egress{AllowedDomains: []string{}}})
		if err != nil {
			t.Fatalf("acquire for %s: %v", name, err)
		}
		s.workspaces = append(s.workspaces, ws.WorkspaceID)
		h.Clock.Advance(time.Second)
	}
	return s
}

// TestConsoleFindsSortsAndStaysLive drives the console in headless
// Chromium over a real operator API with 50 tenants: the search box finds
// an account by part of its name; the workspaces table sorts by age from
// its header, a page at a time; the live table updates itself while an
// operator types into its filter, and what was typed stays; with scripts
// off the pages still work; and no page is wider than a 390 px phone.
func TestConsoleFindsSortsAndStaysLive(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	s := seed(t, h)
	con, err := console.New(console.Config{API: h.Admin.Config.Handler, Clock: h.Clock})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con.Handler())
	t.Cleanup(srv.Close)
	tb := newTab(t, srv.URL+console.Prefix)

	tb.do("sign in",
		chromedp.Navigate(tb.base),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), h.AdminToken.Reveal()))
	tb.follow("sign in", "signin", "who")

	// Find an account by typing part of its name into the search box.
	tb.do("search", chromedp.SendKeys(chromedp.ID("search"), "glob"))
	tb.follow("search", "search-submit", "found-"+s.globex)
	if got := run(tb, "found", chromedp.Text(chromedp.ID("found-accounts"))); !strings.Contains(got, "Globex Corporation") || strings.Contains(got, "tenant") {
		t.Errorf("search for glob found accounts %q; want Globex Corporation alone", got)
	}
	if title := run(tb, "id on hover", chromedp.AttributeValue(chromedp.CSS(`#found-`+s.globex+` a`), "title")); title.Value != s.globex {
		t.Errorf("found account's title = %q; want its id %s", title.Value, s.globex)
	}
	tb.screenshot("search")

	// Account names are unique: a duplicate is refused with the API's
	// message, which names the account that has it.
	tb.do("duplicate name", chromedp.Navigate(tb.base+"accounts"), chromedp.WaitVisible(chromedp.ID("new-account-name")),
		chromedp.SendKeys(chromedp.ID("new-account-name"), " globex corporation"))
	tb.follow("duplicate name", "new-account-submit", "error")
	if msg := run(tb, "refusal", chromedp.Text(chromedp.ID("error"))); !strings.HasPrefix(msg, "409 conflict") || !strings.Contains(msg, s.globex) {
		t.Errorf("creating a duplicate name shows %q; want 409 conflict naming %s", msg, s.globex)
	}
	tb.screenshot("duplicate-name")
	tb.do("new name", chromedp.Navigate(tb.base+"accounts"), chromedp.WaitVisible(chromedp.ID("new-account-name")),
		chromedp.SendKeys(chromedp.ID("new-account-name"), "Initech"))
	tb.follow("new name", "new-account-submit", "flash")
	if names := run(tb, "accounts found", chromedp.Text(chromedp.ID("accounts"))); !strings.Contains(names, "Initech") || strings.Contains(names, "tenant") {
		t.Errorf("accounts after creating Initech = %q; want it found by its name alone", names)
	}

	// Sort the workspaces table by age from its header: youngest first,
	// 50 rows a page, the next page going on where the first stopped.
	tb.do("workspaces", chromedp.Navigate(tb.base+"workspaces"), chromedp.WaitVisible(chromedp.ID("sort-age")))
	if got := tb.rowIDs(); !slices.Equal(got, s.workspaces) {
		t.Errorf("workspaces before sorting = %d rows; want all %d in creation order", len(got), len(s.workspaces))
	}
	tb.follow("sort by age", "sort-age", "sort-age")
	youngest := slices.Clone(s.workspaces)
	slices.Reverse(youngest)
	if got := tb.rowIDs(); !slices.Equal(got, youngest) {
		t.Errorf("sorted by age = %v…; want youngest first %v…", head(got), head(youngest))
	}
	if mark := run(tb, "sort mark", chromedp.Text(chromedp.ID("sort-age"))); !strings.Contains(mark, "▲") {
		t.Errorf("age header = %q; want it marked as the sort", mark)
	}
	tb.follow("oldest first", "sort-age", "workspaces")
	if got := tb.rowIDs(); len(got) == 0 || got[0] != s.workspaces[0] {
		t.Errorf("sorted by age again = %v…; want oldest (%s) first", head(got), s.workspaces[0])
	}
	tb.screenshot("workspaces")
	tb.do("page of 20", chromedp.Navigate(tb.base+"workspaces?sort=age&limit=20"), chromedp.WaitVisible(chromedp.ID("next")))
	first := tb.rowIDs()
	tb.follow("next page", "next", "prev")
	second := tb.rowIDs()
	tb.follow("previous page", "prev", "next")
	if back := tb.rowIDs(); !slices.Equal(first, youngest[:20]) || !slices.Equal(second, youngest[20:40]) || !slices.Equal(back, first) {
		t.Errorf("pages of 20 by age = %v… then %v… then back %v…; want the youngest 20, the next 20, then the first again", head(first), head(second), head(back))
	}

	// Type into the filter while the live table updates: the rows change
	// in place (a workspace acquired meanwhile appears), the page is not
	// reloaded, and what was typed stays.
	tb.do("live table", chromedp.Navigate(tb.base+"workspaces?sort=age"), chromedp.WaitVisible(chromedp.ID("filter-q")))
	run(tb, "mark the page", chromedp.Evaluate[bool](`window.notReloaded = true`))
	tb.do("type", chromedp.SendKeys(chromedp.ID("filter-q"), "tenant 4"))
	in := h.NewInstanceIn(s.globex, adminapi.Scope{})
	late, _, err := h.Client(in.Token).Acquire(context.Background(), "late",
		protocol.AcquireRequest{Label: "late", Egress: &protocol.Egress{AllowedDomains: []string{}}})
	if err != nil {
		t.Fatal(err)
	}
	run(tb, "two refreshes", chromedp.Poll[bool](`Number(document.getElementById('workspaces').dataset.refreshed || 0) >= 2`,
		chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(browserStep-5*time.Second)))
	tb.do("the new row", chromedp.WaitVisible(chromedp.ID("ws-"+late.WorkspaceID)))
	tb.do("type more", chromedp.SendKeys(chromedp.ID("filter-q"), "2"))
	if typed := run(tb, "typed", chromedp.Value(chromedp.ID("filter-q"))); typed != "tenant 42" {
		t.Errorf("filter after the live updates = %q; want tenant 42, as typed", typed)
	}
	if !run(tb, "not reloaded", chromedp.Evaluate[bool](`window.notReloaded === true`)) {
		t.Error("the page was reloaded by the live updates")
	}
	tb.follow("filter", "filter-submit", "workspaces")
	if got := tb.rowIDs(); !slices.Equal(got, s.workspaces[42:43]) {
		t.Errorf("filter tenant 42 = %v; want tenant 42's workspace %s", got, s.workspaces[42])
	}
	tb.do("account filter by name", chromedp.Navigate(tb.base+"workspaces?account=globex+corporation"), chromedp.WaitVisible(chromedp.ID("workspaces")))
	if got := tb.rowIDs(); !slices.Equal(got, []string{s.workspaces[17], late.WorkspaceID}) {
		t.Errorf("?account=globex corporation = %v; want Globex's two workspaces", got)
	}

	// Without scripts: sorting and paging are plain links.
	run(tb, "scripts off", chromedp.Action[struct{}](func(ctx context.Context, tg *chromedp.Target) (struct{}, error) {
		_, err := cdp.Call(ctx, tg, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
		return struct{}{}, err
	}))
	tb.do("no script: page", chromedp.Navigate(tb.base+"workspaces?limit=10"), chromedp.WaitVisible(chromedp.ID("sort-age")))
	tb.follow("no script: sort", "sort-age", "next")
	tb.follow("no script: next", "next", "prev")
	all := append(slices.Clone(s.workspaces), late.WorkspaceID)
	slices.Reverse(all)
	if got := tb.rowIDs(); !slices.Equal(got, all[10:20]) {
		t.Errorf("without scripts, page 2 by age = %v…; want %v…", head(got), head(all[10:20]))
	}

	// At phone width no page, the detail pages included, is wider than the
	// screen (scripts still off): wide tables scroll in their own box. At
	// 1400 px nothing overflows either.
	pages := []string{"", "workspaces", "accounts", "usage", "controls", "audit", "search?q=glob",
		"workspaces/" + late.WorkspaceID, "accounts/" + s.globex, "workspaces/" + late.WorkspaceID + "/kill"}
	for _, width := range []int64{390, 1400} {
		tb.do(fmt.Sprint("viewport ", width), chromedp.EmulateViewport(width, 844))
		for _, p := range pages {
			tb.do("load "+p, chromedp.Navigate(tb.base+p), chromedp.WaitVisible(chromedp.CSS("main h1")))
			wide := run(tb, "width of "+p, chromedp.Evaluate[[]int](`[document.documentElement.scrollWidth, window.innerWidth]`))
			if wide[0] > wide[1] {
				t.Errorf("at %d px, /console/%s is %d px wide; want at most %d", width, p, wide[0], wide[1])
			}
			if width == 390 {
				name := strings.NewReplacer("/", "-", "?", "-", "=", "-").Replace(cmp.Or(p, "overview"))
				tb.screenshot("phone-" + name)
			}
		}
	}
}

// head is the first three of ids, for failure messages.
func head(ids []string) []string { return ids[:min(3, len(ids))] }
