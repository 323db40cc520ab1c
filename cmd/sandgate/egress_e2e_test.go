//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/internal/egresstest"
	"github.com/sandgate/sandgate/protocol"
)

// domains returns n distinct valid domains.
func domains(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "d" + strconv.Itoa(i) + ".example.com"
	}
	return out
}

// The dev instance's lease shows ceiling null, and the spec's limit
// holds: max_egress_domains entries are admitted, one more is refused.
func TestE2EEgressDevLease(t *testing.T) {
	d := startDev(t)
	c := d.Client(t, "")
	ctx := context.Background()
	lease, err := c.Lease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lease.Egress.Ceiling != nil {
		t.Errorf("dev lease egress.ceiling = %v; want null (any valid domain)", lease.Egress.Ceiling)
	}
	max := lease.Limits.MaxEgressDomains
	if max <= 0 {
		t.Fatalf("dev lease max_egress_domains = %d", max)
	}
	_, _, err = c.Acquire(ctx, "k-too-many", protocol.AcquireRequest{Label: "e2e", Egress: &protocol.Egress{AllowedDomains: domains(max + 1)}})
	wantCode(t, "acquire with max_egress_domains+1 domains", err, http.StatusBadRequest, protocol.InvalidRequest)
	ws, created, err := c.Acquire(ctx, "k-max", protocol.AcquireRequest{Label: "e2e", Egress: &protocol.Egress{AllowedDomains: domains(max)}})
	if err != nil || !created {
		t.Fatalf("acquire with max_egress_domains (%d) domains: created %v, %v; want 201", max, created, err)
	}
	if _, err := c.Release(ctx, ws.WorkspaceID); err != nil {
		t.Fatal(err)
	}
}

// A `sandgate serve` broker with SANDGATE_EGRESS_HOSTS and
// SANDGATE_EGRESS_PORTS: a workspace reaches its allowed domain with curl
// through the proxy variables, and not the broker's own listeners or
// Redis; its egress bytes are in its usage export.
// egressSite starts the egress tests' TLS site and returns it with the
// environment that lets a broker's proxy reach it by its names.
func egressSite(t *testing.T) (egresstest.Site, []string) {
	t.Helper()
	names := []string{"allowed.sg.test", "denied.sg.test", "a.sg.test", "sg.test"}
	site := egresstest.StartSite(t, names, nil)
	var hosts []string
	for _, n := range names {
		hosts = append(hosts, n+"=127.0.0.1")
	}
	return site, []string{"SANDGATE_EGRESS_HOSTS=" + strings.Join(hosts, ","), "SANDGATE_EGRESS_PORTS=80,443," + strconv.Itoa(site.Port)}
}

// anyEgressInstance creates an account and an instance of it whose scope
// allows any egress domain, and returns the account and a token.
func anyEgressInstance(t *testing.T, a *adminapi.Client) (acct, tok string) {
	t.Helper()
	acct = createAccount(t, a, "egress")
	req := adminapi.CreateInstanceRequest{AccountID: acct, Name: "egress"}
	req.Scope.AnyEgress = true
	var in adminapi.Instance
	if err := a.Do(context.Background(), http.MethodPost, "/instances", req, &in); err != nil {
		t.Fatalf("create instance with any egress on the local provider: %v", err)
	}
	return acct, issueToken(t, a, in.ID)
}

// finalEgress waits for workspace id's final usage entry in acct's export
// and returns its egress bytes.
func finalEgress(t *testing.T, s *serveBroker, acct, id string) (out, in int64) {
	t.Helper()
	now := time.Now().UTC()
	var final struct {
		ID       string `json:"id"`
		BytesOut int64  `json:"egress_bytes_out"`
		BytesIn  int64  `json:"egress_bytes_in"`
	}
	waitFor(t, "the workspace's final usage entry", func() (bool, error) {
		out := runCLI(t, s.AdminEnv(), "usage", "export", "--format", "jsonl", "--account", acct,
			"--from", now.Add(-time.Hour).Format(time.RFC3339), "--to", now.Add(time.Hour).Format(time.RFC3339))
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			if err := json.Unmarshal(sc.Bytes(), &final); err != nil {
				return false, err
			}
			if final.ID == id+":final" {
				return true, nil
			}
		}
		return false, fmt.Errorf("no final entry for %s yet", id)
	})
	return final.BytesOut, final.BytesIn
}

// TestE2EEgressBytesSurviveRestart: the bytes a workspace fetched through
// one broker process are on its final usage entry when the next process,
// after a restart, releases it: the first recorded them on its way down.
func TestE2EEgressBytesSurviveRestart(t *testing.T) {
	t.Parallel()
	rds := startRedis(t)
	site, env := egressSite(t)
	cfg := newServeConfig(t, rds.Addr, serveOptions{})
	s1 := startServeEnv(t, cfg, env...)
	ctx := context.Background()
	acct, tok := anyEgressInstance(t, s1.Admin(t))
	c1 := s1.Client(t, tok)
	ws, created, err := c1.Acquire(ctx, "k-egress-restart", protocol.AcquireRequest{Label: "e2e", Egress: &protocol.Egress{AllowedDomains: []string{"allowed.sg.test"}}})
	if err != nil || !created {
		t.Fatalf("acquire with allowed.sg.test: %v", err)
	}
	if err := c1.WriteFile(ctx, ws.WorkspaceID, "/workspace/ca.pem", site.CAPEM); err != nil {
		t.Fatal(err)
	}
	res, err := c1.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{TimeoutSeconds: 60,
		Argv: []string{"curl", "-fsS", "--max-time", "20", "--cacert", "/workspace/ca.pem", "https://allowed.sg.test:" + strconv.Itoa(site.Port) + "/"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("curl allowed.sg.test: %+v, %v; want the page", res, err)
	}
	// What the first process counted, from its metric (this is its only
	// workspace with egress), once the tunnel's last bytes are in.
	var out1, in1 int64
	waitFor(t, "the first process's egress count to settle", func() (bool, error) {
		o, i := egressMetric(t, s1.AdminURL)
		time.Sleep(200 * time.Millisecond)
		out1, in1 = egressMetric(t, s1.AdminURL)
		return o == out1 && i == in1 && out1 > 0 && in1 > 0, nil
	})
	s1.stop()

	s2 := startServeEnv(t, cfg, env...)
	if _, err := s2.Client(t, tok).Release(ctx, ws.WorkspaceID); err != nil {
		t.Fatal(err)
	}
	// One fetch of a small page: a TLS handshake each way at least, every
	// byte once.
	if out, in := finalEgress(t, s2, acct, ws.WorkspaceID); out != out1 || in != in1 || out < 200 || in < 500 {
		t.Errorf("final usage entry after a restart: egress bytes out %d, in %d; want the first process's fetch, %d and %d", out, in, out1, in1)
	}
}

// egressMetric reads a broker's egress byte counters, out and in, from
// its operator listener's /metrics.
func egressMetric(t *testing.T, adminURL string) (out, in int64) {
	t.Helper()
	resp, err := http.Get(adminURL + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), "{")
		if !ok || !strings.HasPrefix(name, "sandgate_egress_bytes") {
			continue
		}
		labels, val, _ := strings.Cut(rest, "} ")
		n, err := strconv.ParseFloat(val, 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", sc.Text(), err)
		}
		switch {
		case strings.Contains(labels, `direction="out"`):
			out += int64(n)
		case strings.Contains(labels, `direction="in"`):
			in += int64(n)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	return out, in
}

func TestE2EEgressServe(t *testing.T) {
	rds := startRedis(t)
	site, env := egressSite(t)
	port := strconv.Itoa(site.Port)
	cfg := newServeConfig(t, rds.Addr, serveOptions{})
	s := startServeEnv(t, cfg, env...)
	a := s.Admin(t)
	ctx := context.Background()
	acct, tok := anyEgressInstance(t, a)
	c := s.Client(t, tok)
	lease, err := c.Lease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lease.Egress.Ceiling != nil {
		t.Errorf("lease egress.ceiling = %v; want null", lease.Egress.Ceiling)
	}

	ws, created, err := c.Acquire(ctx, "k-egress", protocol.AcquireRequest{Label: "e2e", Egress: &protocol.Egress{AllowedDomains: []string{"allowed.sg.test"}}})
	if err != nil || !created {
		t.Fatalf("acquire with allowed.sg.test: %v", err)
	}
	if err := c.WriteFile(ctx, ws.WorkspaceID, "/workspace/ca.pem", site.CAPEM); err != nil {
		t.Fatal(err)
	}
	run := func(argv ...string) (string, int) {
		t.Helper()
		res, err := c.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: argv, TimeoutSeconds: 60})
		if err != nil {
			t.Fatalf("exec %s: %v", argv[0], err)
		}
		out, _ := base64.StdEncoding.DecodeString(res.StdoutB64)
		errOut, _ := base64.StdEncoding.DecodeString(res.StderrB64)
		return string(out) + string(errOut), res.ExitCode
	}
	curl := func(url string, opts ...string) (string, int) {
		t.Helper()
		return run(append(append([]string{"curl", "-fsS", "--max-time", "20", "--cacert", "/workspace/ca.pem"}, opts...), url)...)
	}

	if out, code := curl("https://allowed.sg.test:" + port + "/"); code != 0 || out != "hello allowed.sg.test\n" {
		t.Fatalf("curl allowed.sg.test: exit %d, %q; want the page", code, out)
	}
	if out, _ := run("env"); !strings.Contains(out, "HTTPS_PROXY=http://127.0.0.1:3128\n") || !strings.Contains(out, "http_proxy=http://127.0.0.1:3128\n") {
		t.Errorf("exec env has no proxy variables: %q", out)
	}
	if out, code := curl("https://denied.sg.test:" + port + "/"); code == 0 || strings.Contains(out, "hello") {
		t.Errorf("curl denied.sg.test: exit %d, %q; want it refused", code, out)
	}
	// The broker's own listeners and Redis, through the proxy (IP
	// literals) and directly (no route: the sandbox's own loopback).
	pub, _ := url.Parse(s.URL)
	adm, _ := url.Parse(s.AdminURL)
	for _, hostport := range []string{pub.Host, adm.Host, rds.Addr, "localhost:" + pub.Port()} {
		for _, opts := range [][]string{{"--proxy", "http://127.0.0.1:3128", "--noproxy", ""}, {"--noproxy", "*"}} {
			out, code := curl("http://"+hostport+"/", opts...)
			// No answer of the broker (a JSON envelope) or Redis (-ERR).
			if code == 0 || strings.Contains(out, "{") || strings.Contains(out, "ERR") {
				t.Errorf("curl %s %q in the sandbox: exit %d, %q; want no connection", hostport, opts, code, out)
			}
		}
	}
	if out, code := run("getent", "hosts", "example.com"); code == 0 {
		t.Errorf("getent hosts example.com in the sandbox: %q; want no resolver", out)
	}
	// A durable command gets the variables too.
	st, _, err := c.StartCommand(ctx, ws.WorkspaceID, "egress-cmd", protocol.ExecRequest{
		Argv: []string{"curl", "-fsS", "--max-time", "20", "--cacert", "/workspace/ca.pem", "https://allowed.sg.test:" + port + "/"}, TimeoutSeconds: 60})
	if err != nil {
		t.Fatalf("start command: %v", err)
	}
	waitFor(t, "the durable curl", func() (bool, error) {
		st, err = c.ReadCommand(ctx, ws.WorkspaceID, "egress-cmd")
		return err == nil && st.State == protocol.CommandCompleted, err
	})
	if out, _ := base64.StdEncoding.DecodeString(st.StdoutB64); st.ExitCode == nil || *st.ExitCode != 0 || string(out) != "hello allowed.sg.test\n" {
		t.Errorf("durable curl: %+v, stdout %q; want exit 0 and the page", st, out)
	}

	if _, err := c.Release(ctx, ws.WorkspaceID); err != nil {
		t.Fatal(err)
	}
	// The workspace's final usage entry carries its egress bytes.
	bytesOut, bytesIn := finalEgress(t, s, acct, ws.WorkspaceID)
	// Three fetches of a small page: a TLS handshake each way at least.
	if bytesOut < 200 || bytesIn < 500 {
		t.Errorf("final usage entry egress bytes out %d, in %d; want the fetches' bytes", bytesOut, bytesIn)
	}
	now := time.Now().UTC()
	csv := runCLI(t, s.AdminEnv(), "usage", "export", "--format", "csv", "--account", acct,
		"--from", now.Add(-time.Hour).Format(time.RFC3339), "--to", now.Add(time.Hour).Format(time.RFC3339))
	if header, _, _ := strings.Cut(csv, "\r\n"); !strings.HasSuffix(header, ",egress_bytes_out,egress_bytes_in,reason,actor") {
		t.Errorf("CSV header %q; want it to end in the egress columns, then reason and actor", header)
	}
	// A usage row's reason and actor are empty.
	if !strings.Contains(csv, ","+strconv.FormatInt(bytesOut, 10)+","+strconv.FormatInt(bytesIn, 10)+",,\r\n") {
		t.Errorf("CSV export has no row ending in the workspace's egress bytes %d,%d:\n%s", bytesOut, bytesIn, csv)
	}
}
