package console_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/browsertest"
)

// browserBound bounds one step in the browser; generous, for a loaded
// machine.
const browserBound = 60 * time.Second

// run runs browser steps within browserBound and fails the test with
// the step's name and the page it was on.
func runSteps(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, browserBound)
	defer cancel()
	if _, err := chromedp.Run(tctx, chromedp.Steps(steps...)); err != nil {
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		defer dcancel()
		body, _ := chromedp.Run(dctx, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("%s: %v\n%s", what, err, body)
	}
}

// text returns the text content of the first element sel matches (SVG
// text too, which has no innerText).
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, browserBound)
	defer cancel()
	s, err := chromedp.Run(tctx, chromedp.TextContent(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

// screenshots is the directory the browser tests write their pages'
// screenshots to: $SANDGATE_SCREENSHOTS, or a new temporary directory
// kept after the test, for a reviewer to look at.
func screenshots(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("SANDGATE_SCREENSHOTS")
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "sandgate-console-screenshots-"); err != nil {
			t.Fatal(err)
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// shoot writes a full-page screenshot of the current page as name.png
// (quality 100 makes a PNG).
func shoot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, browserBound)
	defer cancel()
	png, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDetailPagesInBrowser drives the detail pages and the usage chart
// in a headless Chromium against a broker with 50 accounts of usage: the
// workspace's and the account's pages show names, balance and
// workspaces; the usage chart has axis labels and says "of 50"; a kill
// from the workspace page ends it and the audit log names the operator.
func TestDetailPagesInBrowser(t *testing.T) {
	e := newBrokerEnv(t, nil, time.Date(2026, 10, 20, 12, 0, 0, 0, time.UTC))
	seedTenants(t, e, 49, func(i int) (day, n int) { return 1 + i%19, 1 + i%7 })
	acct, c := e.tenant("acme corp")
	seedUsage(t, billing.NewLedger(e.b.DB().Redis()), acct.ID, 20, 3)
	ws := e.acquire(c, "pypi.org")
	dir := screenshots(t)
	ctx := browsertest.New(t, 1400, 1000)

	runSteps(t, ctx, "sign in",
		chromedp.Navigate(e.console.URL+"/console/login"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), brokerAdminTok),
		chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(chromedp.ID("who")))

	runSteps(t, ctx, "workspace page", chromedp.Navigate(e.console.URL+"/console/workspaces/"+ws.WorkspaceID), chromedp.WaitVisible(chromedp.ID("history")))
	shoot(t, ctx, dir, "workspace")
	if got := text(t, ctx, "#ws-account"); got != "acme corp" {
		t.Errorf("workspace page's account = %q; want acme corp", got)
	}
	if got := text(t, ctx, "#ws-domains"); got != "pypi.org" {
		t.Errorf("workspace page's egress domains = %q; want pypi.org", got)
	}

	runSteps(t, ctx, "account page from the workspace's", chromedp.Click(chromedp.ID("ws-account")), chromedp.WaitVisible(chromedp.ID("acct-balance")))
	shoot(t, ctx, dir, "account")
	if got := text(t, ctx, "#acct-name"); got != "acme corp" {
		t.Errorf("account page's name = %q; want acme corp", got)
	}
	if got := text(t, ctx, "#acct-balance"); !strings.Contains(got, "0") {
		t.Errorf("account page's balance = %q; want an amount", got)
	}
	if got := text(t, ctx, "#recent-workspaces tbody"); !strings.Contains(got, ws.WorkspaceID) {
		t.Errorf("account page's workspaces = %q; want %s", got, ws.WorkspaceID)
	}

	runSteps(t, ctx, "usage page", chromedp.Navigate(e.console.URL+"/console/usage"), chromedp.WaitVisible(chromedp.CSS(`#days figure[data-unit="EUR"]`)))
	shoot(t, ctx, dir, "usage")
	note := text(t, ctx, `#days figure[data-unit="EUR"] .note`)
	if !strings.Contains(note, "8 of 50 accounts") {
		t.Errorf("usage chart's note = %q; want 8 of 50 accounts", note)
	}
	for _, sel := range []string{`#days figure[data-unit="EUR"] text.y-tick`, `#days figure[data-unit="EUR"] text.x-tick`, `#days figure[data-unit="EUR"] text.y-title`} {
		if got := text(t, ctx, sel); got == "" {
			t.Errorf("usage chart's %s is empty", sel)
		}
	}
	if got := text(t, ctx, `#days figure[data-unit="EUR"] text.y-title`); got != "amount (EUR)" {
		t.Errorf("usage chart's y axis = %q; want amount (EUR)", got)
	}
	hctx, cancel := context.WithTimeout(ctx, browserBound)
	height, err := chromedp.Run(hctx, chromedp.Evaluate[int64](`document.documentElement.scrollHeight`))
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if height > 6000 {
		t.Errorf("usage page is %d px tall at 1400 px; want it bounded", height)
	}

	runSteps(t, ctx, "kill from the workspace page",
		chromedp.Navigate(e.console.URL+"/console/workspaces/"+ws.WorkspaceID),
		chromedp.WaitVisible(chromedp.ID("kill")),
		chromedp.Click(chromedp.ID("kill")),
		chromedp.WaitVisible(chromedp.ID("flash")),
		chromedp.WaitNotPresent(chromedp.ID("kill")))
	if got := text(t, ctx, "#ws-state"); !strings.HasPrefix(got, "terminated") {
		t.Errorf("workspace state after the kill = %q; want terminated", got)
	}
	runSteps(t, ctx, "audit page", chromedp.Navigate(e.console.URL+"/console/audit"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-action="workspace.kill"][data-status="200"]`)))
	shoot(t, ctx, dir, "audit")
	if got := text(t, ctx, `tr[data-action="workspace.kill"] td:nth-child(2)`); got != "ada" {
		t.Errorf("kill's audit entry's actor = %q; want ada", got)
	}
}
