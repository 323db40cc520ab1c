//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/broker"
	"github.com/sandgate/sandgate/protocol"
)

// TestPromtool runs Prometheus's own checks on the shipped files: the
// config (with the alert rules it loads), the rules, and the rules' unit
// tests (alerts_test.yml). promtool comes with Debian's prometheus
// package, which `make deps` installs.
func TestPromtool(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool: %v (make deps installs Debian's prometheus package)", err)
	}
	dir := filepath.Join("..", "..", promDir)
	for _, args := range [][]string{
		{"check", "config", "prometheus.yml"},
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// Every alert has a unit test.
	tests, err := os.ReadFile(filepath.Join(dir, "alerts_test.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range alertRules(t) {
		if !strings.Contains(string(tests), "alertname: "+r.Alert+"\n") {
			t.Errorf("alert %s has no unit test in alerts_test.yml", r.Alert)
		}
	}
}

// alertRule is the part of a rule the tests read.
type alertRule struct {
	Alert string `yaml:"alert"`
	Expr  string `yaml:"expr"`
}

func alertRules(t *testing.T) []alertRule {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", alertsFile))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	var out []alertRule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) == 0 {
		t.Fatalf("%s has no rules", alertsFile)
	}
	return out
}

// dashboardQueries are the PromQL of every panel of the dashboard, by
// panel title.
func dashboardQueries(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			Type       string `json:"type"`
			Title      string `json:"title"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	out := map[string][]string{}
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != grafanaDatasourceUID || len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q: datasource %q, %d queries; want the provisioned %q and a query", p.Title, p.Datasource.UID, len(p.Targets), grafanaDatasourceUID)
		}
		for _, tg := range p.Targets {
			out[p.Title] = append(out[p.Title], tg.Expr)
		}
	}
	if d.UID == "" || len(out) == 0 {
		t.Fatalf("%s: uid %q, %d panels with queries", dashboardFile, d.UID, len(out))
	}
	return out
}

var (
	// promStrings, promMatchers, promRanges and promGrouping are what of
	// PromQL names no metric: string literals, label matchers, range and
	// subquery durations, and grouping label lists.
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	// promIdent is an identifier (or the tail of a number's exponent or a
	// $variable, which metricNames skips).
	promIdent = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	// promKeywords are PromQL's keywords and aggregation modifiers.
	promKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true, "without": true,
		"on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true, "Inf": true, "NaN": true}
)

// metricNames are the metric names expr reads: identifiers that are
// neither a function (followed by "("), a keyword, nor a label.
func metricNames(expr string) []string {
	e := promStrings.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, "{}")
	e = promRanges.ReplaceAllString(e, "[]")
	e = promGrouping.ReplaceAllString(e, " ")
	var out []string
	for _, m := range promIdent.FindAllStringIndex(e, -1) {
		name := e[m[0]:m[1]]
		if m[0] > 0 && strings.ContainsAny(e[m[0]-1:m[0]], "0123456789$.") {
			continue // 1e6, $__rate_interval
		}
		if strings.HasPrefix(strings.TrimLeft(e[m[1]:], " \t\n"), "(") || promKeywords[name] {
			continue // a function
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

func TestMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`up{job="sandgate"} == 0`: {"up"},
		`sum by (provider) (rate(sandgate_provider_call_errors_total{outcome=~"error|timeout"}[5m])) / sum by (provider) (rate(x_count[5m])) > 0.05`: {
			"sandgate_provider_call_errors_total", "x_count"},
		`histogram_quantile(0.95, sum by (le, route) (rate(a_bucket[$__rate_interval])))`:    {"a_bucket"},
		`sum by (currency) (increase(b_total[1h])) / 1e6`:                                    {"b_total"},
		`sum(increase(c_total[10m])) == 0 or absent(c_total)`:                                {"c_total"},
		`sum(rate(d{code!="",route="GET /v1/lease"}[5m])) * 60 and on(instance) e offset 5m`: {"d", "e"},
		`max(sandgate_stripesync_lag_seconds) > 3600`:                                        {"sandgate_stripesync_lag_seconds"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%q) = %q; want %q", expr, got, want)
		}
	}
}

// syntheticSeries are series Prometheus makes itself for every target,
// not the broker.
var syntheticSeries = map[string]bool{"up": true}

// TestE2EObservabilityNamesExist starts `sandgate serve` (with the
// Stripe sync on, against a mock), does a little of everything the
// dashboard and the alerts look at (a lease read, acquire, exec, a read
// of a missing file, release, operator calls, a usage entry sent to
// Stripe), scrapes the operator listener's /metrics and fails on any
// metric an alert rule or a dashboard panel names that the broker does
// not export.
func TestE2EObservabilityNamesExist(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	stripeURL, _ := stripeMock(t)
	rs := startRedis(t)
	cfg := newServeConfig(t, rs.Addr, serveOptions{})
	s := startServeEnv(t, cfg, "SANDGATE_STRIPE_SECRET_KEY=sk_test_observability0123456789", "SANDGATE_BILLING_STRIPE_BASE_URL="+stripeURL,
		"SANDGATE_BILLING_STRIPE_INTERVAL=200ms", "SANDGATE_BILLING_RECONCILE_INTERVAL=1s")
	adm := s.Admin(t)
	acct := createAccount(t, adm, "observability")
	inst := createInstance(t, adm, acct, 2)
	tok := issueToken(t, adm, inst)
	if err := adm.Do(ctx, http.MethodPost, "/rate-cards", adminapi.RateCardRequest{Name: "observability", Currency: "USD",
		Prices: broker.DevPrices()}, nil); err != nil {
		t.Fatalf("create rate card: %v", err)
	}
	cus, event := "cus_observability", "sandgate_seconds"
	if err := adm.Do(ctx, http.MethodPut, "/accounts/"+acct+"/billing", adminapi.BillingSettings{RateCard: "observability", Currency: "USD",
		Postpaid: true, StripeCustomer: &cus, StripeMeterEvent: &event}, nil); err != nil {
		t.Fatalf("set billing: %v", err)
	}

	c := s.Client(t, tok)
	if _, err := c.Lease(ctx); err != nil {
		t.Fatalf("lease: %v", err)
	}
	ws := acquire(t, c, "observability-1")
	if res, err := c.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec = %+v, %v", res, err)
	}
	_, err := c.ReadFile(ctx, ws.WorkspaceID, "/workspace/missing")
	wantCode(t, "read a missing file", err, http.StatusNotFound, protocol.FileNotFound)
	if _, err := c.Release(ctx, ws.WorkspaceID); err != nil {
		t.Fatalf("release: %v", err)
	}
	// Settled usage for the Stripe sync to send.
	now := time.Now().UTC()
	entry := billing.UsageEntry{ID: "ws_obs:final", Kind: billing.KindUsage, Final: true, AccountID: acct, WorkspaceID: "ws_obs",
		Currency: "USD", Seconds: 7, StartedAt: now.Add(-7 * time.Second), EndedAt: now, TerminatedAt: now}
	if _, err := billing.NewLedger(rs.Client()).Append(ctx, entry); err != nil {
		t.Fatal(err)
	}
	var st adminapi.StripeStatus
	waitFor(t, "the meter event to be sent", func() (bool, error) {
		err := adm.Do(ctx, http.MethodGet, "/accounts/"+acct+"/billing/stripe", nil, &st)
		return err == nil && st.Sent >= 1, err
	})

	// The reaper's leader reports money drift once its first
	// reconciliation pass is done.
	var fams map[string]*dto.MetricFamily
	waitFor(t, "the first reconciliation pass", func() (bool, error) {
		fams = scrape(t, s.AdminURL)
		return fams["sandgate_billing_reconcile_drift_accounts"] != nil, errors.New("no sandgate_billing_reconcile_drift_accounts yet")
	})
	exists := func(name string) bool {
		if _, ok := fams[name]; ok || syntheticSeries[name] {
			return true
		}
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suf); ok {
				if f := fams[base]; f != nil && (f.GetType() == dto.MetricType_HISTOGRAM || (suf != "_bucket" && f.GetType() == dto.MetricType_SUMMARY)) {
					return true
				}
			}
		}
		return false
	}
	for _, r := range alertRules(t) {
		for _, n := range metricNames(r.Expr) {
			if !exists(n) {
				t.Errorf("alert %s names %s, which the broker does not export", r.Alert, n)
			}
		}
	}
	for title, exprs := range dashboardQueries(t) {
		for _, e := range exprs {
			for _, n := range metricNames(e) {
				if !exists(n) {
					t.Errorf("dashboard panel %q names %s, which the broker does not export", title, n)
				}
			}
		}
	}
	// The operator API's series name route templates, never ids.
	f := fams["sandgate_admin_requests_total"]
	if f == nil || !hasLabel(f.GetMetric(), "route", "POST /admin/v1/accounts") || !hasLabel(f.GetMetric(), "status_class", "2xx") {
		t.Errorf("sandgate_admin_requests_total has no route=\"POST /admin/v1/accounts\" status_class=\"2xx\" series: %v", f)
	}
	if f != nil && !hasLabel(f.GetMetric(), "route", "GET /admin/v1/accounts/:id/billing/stripe") {
		t.Errorf("sandgate_admin_requests_total has no series of the route template GET /admin/v1/accounts/:id/billing/stripe")
	}
	if r := fams["sandgate_ready"]; r == nil || len(r.GetMetric()) != 1 || r.GetMetric()[0].GetGauge().GetValue() != 1 {
		t.Errorf("sandgate_ready = %v; want 1 on a ready broker", r)
	}
}

// scrape reads and parses the operator listener's /metrics.
func scrape(t *testing.T, adminURL string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(adminURL + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("GET /metrics does not parse: %v", err)
	}
	return fams
}
