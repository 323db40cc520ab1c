package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/logbuf"
	"github.com/sandgate/sandgate/internal/stripemock"
	"github.com/sandgate/sandgate/stripesync"
)

// stripeMock runs stripe-mock, built from its Go module (a tool
// dependency in go.mod), on a unix socket for this test, behind a
// recording proxy; it returns the proxy's URL and its log of meter
// event requests that stripe-mock accepted.
func stripeMock(t *testing.T) (string, func() []url.Values) {
	t.Helper()
	dir := t.TempDir()
	bin, err := stripemock.Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	var logs logbuf.Buffer
	cmd := exec.Command(bin, "-http-unix", sock)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitFor(t, "stripe-mock to listen", func() (bool, error) {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err == nil, err
	})
	rp := stripemock.Proxy(sock)
	var mu sync.Mutex
	var sent []url.Values
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		rec := httptest.NewRecorder()
		rp.ServeHTTP(rec, r)
		if r.URL.Path == "/v1/billing/meter_events" && rec.Code == http.StatusOK {
			form, _ := url.ParseQuery(string(body))
			form.Set("Idempotency-Key", r.Header.Get("Idempotency-Key"))
			mu.Lock()
			sent = append(sent, form)
			mu.Unlock()
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []url.Values {
		mu.Lock()
		defer mu.Unlock()
		return append([]url.Values(nil), sent...)
	}
}

// TestE2EStripeSync: a `sandgate serve` with the Stripe key in its
// environment and billing.stripe from SANDGATE_BILLING_STRIPE_* sends an
// account's settled usage to stripe-mock as a meter event, once, under
// the entry's identifier; the status route and `sandgate usage stripe
// status` report it, /metrics counts it, and the key is in no log line.
func TestE2EStripeSync(t *testing.T) {
	t.Parallel()
	const key = "sk_test_e2eSecretKey0123456789"
	stripeURL, sent := stripeMock(t)
	rs := startRedis(t)
	cfg := newServeConfig(t, rs.Addr, serveOptions{LogLevel: "debug"})
	s := startServeEnv(t, cfg, "SANDGATE_STRIPE_SECRET_KEY="+key, "SANDGATE_BILLING_STRIPE_BASE_URL="+stripeURL,
		"SANDGATE_BILLING_STRIPE_INTERVAL=200ms")
	acct := createAccount(t, s.Admin(t), "stripe-e2e-"+randHex(4))

	out := runCLI(t, s.AdminEnv(), "admin", "billing", "set", "--account", acct, "--currency", "USD", "--postpaid",
		"--stripe-customer", "cus_e2e", "--stripe-meter-event", "sandgate_seconds", "-o", "json")
	var bs adminapi.BillingSettings
	if err := json.Unmarshal([]byte(out), &bs); err != nil || bs.StripeCustomer == nil || *bs.StripeCustomer != "cus_e2e" {
		t.Fatalf("billing set = %s, %v; want stripe_customer cus_e2e", out, err)
	}
	if _, stderr, err := tryCLI(s.AdminEnv(), "admin", "billing", "set", "--account", acct, "--currency", "USD", "--stripe-customer", "acme"); err == nil ||
		!strings.Contains(stderr, "customer must be a Stripe customer id") {
		t.Errorf("billing set --stripe-customer acme = %v, %q; want stripesync's refusal", err, stderr)
	}

	// Settled usage: a final entry of the account's ledger, filed now.
	now := time.Now().UTC().Add(time.Second)
	entry := billing.UsageEntry{ID: "ws_e2e:final", Kind: billing.KindUsage, Final: true, AccountID: acct, WorkspaceID: "ws_e2e",
		Currency: "USD", Seconds: 42, StartedAt: now.Add(-42 * time.Second), EndedAt: now, TerminatedAt: now}
	if _, err := billing.NewLedger(rs.Client()).Append(context.Background(), entry); err != nil {
		t.Fatal(err)
	}
	var st adminapi.StripeStatus
	waitFor(t, "the meter event to be sent", func() (bool, error) {
		err := s.Admin(t).Do(context.Background(), http.MethodGet, "/accounts/"+acct+"/billing/stripe", nil, &st)
		return err == nil && st.Sent == 1 && st.Pending == 0, err
	})
	events := sent()
	if len(events) != 1 {
		t.Fatalf("stripe-mock accepted %d meter events; want 1: %v", len(events), events)
	}
	ev, id := events[0], stripesync.Identifier(acct, entry.ID)
	if ev.Get("event_name") != "sandgate_seconds" || ev.Get("payload[stripe_customer_id]") != "cus_e2e" || ev.Get("payload[value]") != "42" ||
		ev.Get("identifier") != id || ev.Get("Idempotency-Key") != id {
		t.Errorf("meter event = %v; want sandgate_seconds, cus_e2e, 42, identifier %s", ev, id)
	}

	fin := []string{"SANDGATE_ADMIN_URL=" + s.AdminURL, "SANDGATE_ADMIN_TOKEN=" + s.cfg.AdminToken}
	if out := runCLI(t, fin, "usage", "stripe", "status", acct); !strings.Contains(out, "customer cus_e2e") || !strings.Contains(out, "sent=1") {
		t.Errorf("usage stripe status =\n%s\nwant cus_e2e and sent=1", out)
	}
	if out := runCLI(t, fin, "usage", "stripe", "retry", acct); !strings.Contains(out, "0 requeued") {
		t.Errorf("usage stripe retry = %q; want 0 requeued", out)
	}
	resp, err := http.Get(s.AdminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `sandgate_stripesync_events_total{outcome="sent"} 1`) || !strings.Contains(string(metrics), "sandgate_stripesync_lag_seconds") {
		t.Errorf("/metrics lacks the Stripe sync's series:\n%s", grepLines(string(metrics), "stripesync"))
	}
	time.Sleep(500 * time.Millisecond) // more passes: nothing is sent twice
	if n := len(sent()); n != 1 {
		t.Errorf("stripe-mock accepted %d meter events after more passes; want 1", n)
	}
	if strings.Contains(s.Logs(), key) || strings.Contains(s.Logs(), strings.TrimPrefix(key, "sk_test_")) {
		t.Errorf("the Stripe key is in the broker's logs")
	}
	if !strings.Contains(s.Logs(), "stripe sync on") {
		t.Errorf("the broker did not log that the Stripe sync is on")
	}
}

// grepLines returns the lines of s that hold sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
