package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/internal/browsertest"
	"github.com/sandgate/sandgate/protocol"
)

// newBrowser starts a headless Chromium at 1400 × 1000 and returns a
// context of one tab in it; both end with the test.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	return browsertest.New(t, 1400, 1000)
}

// do runs browser steps within a bound, failing the test with what step
// failed and the page it was on.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	get(t, ctx, what, chromedp.Steps(steps...))
}

// get runs one browser action within a bound and returns its value.
func get[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, pollTimeout)
	defer cancel()
	v, err := chromedp.Run(tctx, a)
	if err != nil {
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		defer dcancel()
		loc, _ := chromedp.Run(dctx, chromedp.Location())
		body, _ := chromedp.Run(dctx, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("%s: %v\nat %s:\n%s", what, err, loc, body)
	}
	return v
}

func signIn(t *testing.T, ctx context.Context, base, tok string) string {
	t.Helper()
	do(t, ctx, "sign in",
		chromedp.Navigate(base),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), tok),
		chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(chromedp.ID("who")))
	return get(t, ctx, "who", chromedp.Text(chromedp.ID("who")))
}

// TestConsoleInBrowser drives the console in a real headless Chromium
// against `sandgate dev`: sign in; a workspace acquired through the
// protocol appears in the live table; killing it there makes the protocol
// answer 410 workspace_gone; the emergency stop set there makes acquire
// answer 403 emergency_stopped until it is lifted there; the usage page
// charts the day's usage; and a finance token finds no controls and
// cannot call them (the console and the API answer 403).
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	ctx := newBrowser(t)
	base := d.AdminURL + "/console/"
	c := d.Client(t, "")

	if who := signIn(t, ctx, base, d.AdminToken); !strings.HasPrefix(who, "dev:sgo_") || !strings.HasSuffix(who, "(admin)") {
		t.Fatalf("signed in as %q; want dev:sgo_… (admin)", who)
	}
	cookies := get(t, ctx, "read cookies", func(ctx context.Context, tg *chromedp.Target) ([]*network.Cookie, error) {
		res, err := cdp.Call(ctx, tg, network.GetCookies, network.GetCookiesParams{})
		return res.Cookies, err
	})
	if len(cookies) != 1 || cookies[0].Name != "sandgate_console" || !cookies[0].HTTPOnly || !cookies[0].Secure ||
		cookies[0].SameSite != network.CookieSameSiteStrict || cookies[0].Path != "/console/" {
		t.Fatalf("cookies = %+v; want one sandgate_console cookie, HttpOnly, Secure, SameSite=Strict, path /console/", cookies)
	}

	// A workspace acquired through the protocol shows in the live table.
	ws := acquire(t, c, "console-"+randHex(8))
	row := chromedp.ID("ws-" + ws.WorkspaceID)
	do(t, ctx, "live table", chromedp.Navigate(base+"workspaces"), chromedp.WaitVisible(row))

	// Kill it from the console.
	do(t, ctx, "kill",
		chromedp.Click(chromedp.ID("kill-"+ws.WorkspaceID)),
		chromedp.WaitVisible(chromedp.ID("kill-confirm")),
		chromedp.Click(chromedp.ID("kill-confirm")),
		chromedp.WaitVisible(chromedp.ID("flash")),
		chromedp.WaitNotPresent(row))
	if flash := get(t, ctx, "flash", chromedp.Text(chromedp.ID("flash"))); flash != "killed "+ws.WorkspaceID {
		t.Errorf("flash after the kill = %q; want killed %s", flash, ws.WorkspaceID)
	}
	_, err := c.Exec(context.Background(), ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"true"}})
	wantCode(t, "exec after the console's kill", err, 410, protocol.WorkspaceGone)

	// The emergency stop, set and lifted from the console.
	do(t, ctx, "stop on",
		chromedp.Navigate(base+"controls"),
		chromedp.WaitVisible(chromedp.ID("stop-reason")),
		chromedp.SendKeys(chromedp.ID("stop-reason"), "incident"),
		chromedp.SendKeys(chromedp.ID("stop-confirm"), "STOP"),
		chromedp.Click(chromedp.ID("stop-submit")),
		chromedp.WaitVisible(chromedp.ID("broker-stop")))
	if flash := get(t, ctx, "flash", chromedp.Text(chromedp.ID("flash"))); flash != "emergency stop set on the broker: terminated=0 failed=0" {
		t.Errorf("flash after stop on = %q", flash)
	}
	_, _, err = c.Acquire(context.Background(), "console-stopped-"+randHex(8), protocol.AcquireRequest{Label: "e2e", Egress: noEgress()})
	wantCode(t, "acquire while the console's stop is on", err, 403, protocol.EmergencyStopped)
	do(t, ctx, "stop off", chromedp.Click(chromedp.ID("stop-lift")), chromedp.WaitVisible(chromedp.ID("nothing-stopped")))
	// The overview counts the refusal (this process's request counter).
	do(t, ctx, "overview refusals", chromedp.Navigate(base), chromedp.WaitVisible(chromedp.ID("refusals")))
	if n := get(t, ctx, "refusal count", chromedp.Text(chromedp.CSS(`#refusals tr[data-code="emergency_stopped"] td.num`))); n != "1" {
		t.Errorf("overview's emergency_stopped refusals = %q; want 1", n)
	}
	again := acquire(t, c, "console-after-"+randHex(8))
	if _, err := c.Release(context.Background(), again.WorkspaceID); err != nil {
		t.Fatal(err)
	}

	// The usage page charts today's metered seconds (the killed and the
	// released workspace settled today).
	today := time.Now().UTC().Format("2006-01-02")
	do(t, ctx, "usage page", chromedp.Navigate(base+"usage"), chromedp.WaitVisible(chromedp.CSS(`#days figure[data-metric="seconds"]`)))
	bar := get(t, ctx, "usage chart", chromedp.AttributeValue(chromedp.CSS(`#days figure[data-metric="seconds"] rect[data-day="`+today+`"]`), "data-value"))
	if n, err := strconv.Atoi(bar.Value); !bar.Exists || err != nil || n < 2 {
		t.Errorf("usage chart's bar for %s = %+v; want at least 2 seconds", today, bar)
	}
	if sz := get(t, ctx, "size chart", chromedp.AttributeValue(chromedp.CSS(`#size-charts figure[data-metric="seconds"] rect[data-day="standard"]`), "data-value")); !sz.Exists || sz.Value == "0" {
		t.Errorf("usage chart's bar for size standard = %+v; want seconds", sz)
	}
	if sd := get(t, ctx, "size-day chart", chromedp.AttributeValue(chromedp.CSS(`#size-charts rect[data-day="`+today+`"]`), "data-value")); !sd.Exists || sd.Value == "0" {
		t.Errorf("per-size chart's bar for %s = %+v; want seconds", today, sd)
	}
	if href := get(t, ctx, "csv link", chromedp.AttributeValue(chromedp.ID("csv"), "href")); href.Value != "/console/usage.csv?month="+today[:7] {
		t.Errorf("CSV link = %q; want /console/usage.csv?month=%s", href.Value, today[:7])
	}

	// The sign-in, the kill and the stop are in the audit log.
	do(t, ctx, "audit page",
		chromedp.Navigate(base+"audit"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-action="workspace.kill"][data-status="200"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-action="stop.on"][data-status="200"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-action="console.signin"][data-status="200"]`)))

	// Finance: no controls to find, and no way to call them.
	do(t, ctx, "sign out", chromedp.Click(chromedp.ID("signout")), chromedp.WaitVisible(chromedp.ID("token")))
	if who := signIn(t, ctx, base, d.env["FINANCE_TOKEN"]); !strings.HasSuffix(who, "(finance)") {
		t.Fatalf("signed in as %q; want a finance token", who)
	}
	nav := get(t, ctx, "finance nav", chromedp.Text(chromedp.CSS("nav")))
	for _, hidden := range []string{"controls", "workspaces", "audit"} {
		if strings.Contains(nav, hidden) {
			t.Errorf("finance nav = %q; want no %s", nav, hidden)
		}
	}
	if !strings.Contains(nav, "usage") {
		t.Errorf("finance nav = %q; want usage", nav)
	}
	do(t, ctx, "finance controls page", chromedp.Navigate(base+"controls"), chromedp.WaitVisible(chromedp.ID("error-status")))
	status := get(t, ctx, "error status", chromedp.Text(chromedp.ID("error-status")))
	forms := get(t, ctx, "control forms", chromedp.Evaluate[int](`document.querySelectorAll('form[action^="/console/controls"]').length`))
	if status != "403" || forms != 0 {
		t.Errorf("finance /console/controls = %s with %d control forms; want 403 and none", status, forms)
	}
	// A hand-made form post with the finance session's own cookie and
	// CSRF token (the page's CSP lets no script post it) reaches the
	// operator API, which refuses it.
	csrf := get(t, ctx, "finance csrf", chromedp.Value(chromedp.CSS(`input[name="csrf"]`)))
	form := url.Values{"csrf": {csrf}, "on": {"true"}, "reason": {"finance"}, "confirm": {"STOP"}}
	req, err := http.NewRequest(http.MethodPost, base+"controls/stop", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(&http.Cookie{Name: "sandgate_console", Value: d.env["FINANCE_TOKEN"]})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || !strings.Contains(string(page), `<code id="error-code">forbidden</code>`) {
		t.Errorf("finance POST /console/controls/stop = %d\n%s\nwant 403 forbidden from the API", resp.StatusCode, page)
	}
	var st adminapi.Status
	if err := newAdminClient(t, d.AdminURL, d.AdminToken).Do(context.Background(), http.MethodGet, "/status", nil, &st); err != nil || st.BrokerStop != nil {
		t.Errorf("status after finance's attempts = %+v, %v; want no stop", st, err)
	}
	on := true
	err = newAdminClient(t, d.AdminURL, d.env["FINANCE_TOKEN"]).Do(context.Background(), http.MethodPost, "/stop",
		adminapi.StopRequest{On: &on, Reason: "finance"}, nil)
	var ae *adminapi.APIError
	if !errors.As(err, &ae) || ae.Status != 403 || ae.Code != protocol.Forbidden {
		t.Errorf("finance POST /admin/v1/stop = %v; want 403 forbidden", err)
	}
	// No operator token in any log line (stdout is dev.env, which holds them
	// by design; the logs are on stderr).
	logs := d.stderr.String()
	for _, tok := range []string{d.AdminToken, d.env["FINANCE_TOKEN"]} {
		if strings.Contains(logs, tok) || strings.Contains(logs, tok[12:]) {
			t.Errorf("an operator token is in the broker's logs")
		}
	}
}
