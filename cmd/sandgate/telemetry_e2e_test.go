//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/internal/broker"
	"github.com/sandgate/sandgate/protocol"
)

// Trace and span ids of the caller's traceparent in TestE2ETraces.
const (
	callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpan  = "00f067aa0ba902b7"
)

// TestE2ETraces runs `sandgate serve` exporting OTLP to an in-test
// receiver, drives acquire (with a caller's traceparent) → exec → read
// file → release, and checks the span tree: the server span continues the
// caller's trace and parents admission (and its Redis calls) and the
// provider's create; exec and release have their provider calls and
// settlement beneath them; the reaper's passes are spans too. No span
// carries any of the run's secrets. Then /metrics parses with the
// Prometheus text parser and has every family an operator needs.
func TestE2ETraces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rs := startRedis(t)
	recv := startOTLP(t)
	cfg := newServeConfig(t, rs.Addr, serveOptions{})
	s := startServeEnv(t, cfg, recv.Env()...)
	adm := s.Admin(t)
	acct := createAccount(t, adm, "e2e-traces")
	inst := createInstance(t, adm, acct, 2)
	tok := issueToken(t, adm, inst)
	// A priced, postpaid account: admission holds money and release settles it.
	if err := adm.Do(ctx, http.MethodPost, "/rate-cards", adminapi.RateCardRequest{Name: "e2e-traces", Currency: "EUR",
		Prices: broker.DevPrices()}, nil); err != nil {
		t.Fatalf("create rate card: %v", err)
	}
	if err := adm.Do(ctx, http.MethodPut, "/accounts/"+acct+"/billing", adminapi.BillingSettings{
		RateCard: "e2e-traces", Currency: "EUR", Postpaid: true}, nil); err != nil {
		t.Fatalf("set billing: %v", err)
	}

	rnd := randHex(10)
	secArgv, secEnv, secStdin := "SECRET-ARGV-"+rnd, "SECRET-ENV-"+rnd, "SECRET-STDIN-"+rnd
	secPath, secContent := "/workspace/SECRET-PATH-"+rnd, "SECRET-CONTENT-"+rnd

	// Acquire with the caller's traceparent.
	body, _ := json.Marshal(protocol.AcquireRequest{Label: "traces", Egress: noEgress(), Env: map[string]string{"SG_SECRET": secEnv}})
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/v1/workspaces", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(protocol.HeaderIdempotencyKey, "traces-1")
	req.Header.Set("traceparent", "00-"+callerTrace+"-"+callerSpan+"-01")
	resp, err := httpsClient(cfg.PKI.Roots).Do(req)
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("acquire = %d %s; want 201", resp.StatusCode, b)
	}
	var ws protocol.Workspace
	if err := json.Unmarshal(b, &ws); err != nil {
		t.Fatal(err)
	}
	c := s.Client(t, tok)
	res, err := c.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{
		Argv:     []string{"sh", "-c", `echo "$1" "$SG_SECRET"; cat`, "sh", secArgv},
		StdinB64: base64.StdEncoding.EncodeToString([]byte(secStdin)),
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec = %+v, %v", res, err)
	}
	if err := c.WriteFile(ctx, ws.WorkspaceID, secPath, []byte(secContent)); err != nil {
		t.Fatalf("write file: %v", err)
	}
	_, err = c.ReadFile(ctx, ws.WorkspaceID, secPath+"-missing")
	wantCode(t, "read a missing file", err, http.StatusNotFound, protocol.FileNotFound)
	if _, err := c.Release(ctx, ws.WorkspaceID); err != nil {
		t.Fatalf("release: %v", err)
	}

	checkMetrics(t, s.AdminURL)

	s.stop() // flushes the spans still buffered
	// The acquire's log lines name its trace, which continues the caller's.
	if !strings.Contains(s.Logs(), `"trace_id":"`+callerTrace+`","span_id":"`) {
		t.Errorf("no log line names the caller's trace %s:\n%s", callerTrace, tail(s.Logs(), 20))
	}
	spans := recv.Spans()
	byID := map[string]recvSpan{}
	for _, sp := range spans {
		byID[sp.SpanID] = sp
	}
	find := func(what string, ok func(recvSpan) bool) recvSpan {
		t.Helper()
		for _, sp := range spans {
			if ok(sp) {
				return sp
			}
		}
		t.Fatalf("no span %s among %d", what, len(spans))
		return recvSpan{}
	}
	// under reports whether sp descends from the span with id anc.
	under := func(sp recvSpan, anc string) bool {
		for i := 0; i < 64 && sp.ParentID != ""; i++ {
			if sp.ParentID == anc {
				return true
			}
			sp = byID[sp.ParentID]
		}
		return false
	}
	named := func(name string) func(recvSpan) bool { return func(sp recvSpan) bool { return sp.Name == name } }

	acq := find("POST /v1/workspaces", named("POST /v1/workspaces"))
	if acq.TraceID != callerTrace || acq.ParentID != callerSpan || acq.Kind != "SPAN_KIND_SERVER" {
		t.Errorf("acquire's server span: trace %s parent %s kind %s; want the caller's trace %s and span %s, server",
			acq.TraceID, acq.ParentID, acq.Kind, callerTrace, callerSpan)
	}
	for k, want := range map[string]string{"http.route": "/v1/workspaces", "http.response.status_code": "201", "http.request.method": "POST"} {
		if acq.Attrs[k] != want {
			t.Errorf("acquire's server span %s = %q; want %q", k, acq.Attrs[k], want)
		}
	}
	if !strings.HasPrefix(acq.Attrs["sandgate.request_id"], "req_") {
		t.Errorf("acquire's server span has request id %q", acq.Attrs["sandgate.request_id"])
	}
	admSpan := find("admission under the acquire", func(sp recvSpan) bool { return sp.Name == "admission" && sp.ParentID == acq.SpanID })
	if admSpan.Attrs["sandgate.admission.outcome"] != "admitted" {
		t.Errorf("admission span outcome = %q; want admitted", admSpan.Attrs["sandgate.admission.outcome"])
	}
	find("a Redis call under admission", func(sp recvSpan) bool {
		return strings.HasPrefix(sp.Name, "redis ") && sp.ParentID == admSpan.SpanID && sp.Attrs["db.system.name"] == "redis"
	})
	create := find("provider create under the acquire", func(sp recvSpan) bool { return sp.Name == "provider create" && under(sp, acq.SpanID) })
	for k, want := range map[string]string{"sandgate.provider": "local", "sandgate.provider.operation": "create", "sandgate.provider.outcome": "ok"} {
		if create.Attrs[k] != want {
			t.Errorf("provider create span %s = %q; want %q", k, create.Attrs[k], want)
		}
	}
	execSpan := find("the exec's server span", named("POST /v1/workspaces/:id/exec"))
	find("provider exec under it", func(sp recvSpan) bool { return sp.Name == "provider exec" && under(sp, execSpan.SpanID) })
	read := find("the read's server span", func(sp recvSpan) bool {
		return sp.Name == "POST /v1/workspaces/:id/files/read" && sp.Attrs["error.code"] == string(protocol.FileNotFound)
	})
	find("provider read_file under it", func(sp recvSpan) bool {
		return sp.Name == "provider read_file" && under(sp, read.SpanID) && sp.Attrs["sandgate.provider.outcome"] == "file_not_found"
	})
	rel := find("the release's server span", named("DELETE /v1/workspaces/:id"))
	find("provider terminate under it", func(sp recvSpan) bool { return sp.Name == "provider terminate" && under(sp, rel.SpanID) })
	find("billing settle under it", func(sp recvSpan) bool { return sp.Name == "billing settle" && under(sp, rel.SpanID) })
	find("a reaper pass", named("reaper pass"))

	raw := recv.Raw()
	for what, secret := range map[string]string{"the token": tok, "the token's secret part": tok[12:], "argv": secArgv,
		"an env value": secEnv, "stdin": secStdin, "a path": "SECRET-PATH-" + rnd, "file contents": secContent,
		"the random part of any secret": rnd, "the operator token": cfg.AdminToken} {
		if strings.Contains(raw, secret) {
			t.Errorf("an exported span carries %s", what)
		}
	}
}

// checkMetrics reads the operator listener's /metrics, parses it with the
// Prometheus text parser and checks the families of issue 15, with no
// OpenTelemetry scope labels and no id as a label.
func checkMetrics(t *testing.T, adminURL string) {
	t.Helper()
	fams := scrape(t, adminURL)
	want := map[string]string{
		"sandgate_http_request_duration_seconds":  "HISTOGRAM",
		"sandgate_http_requests_total":            "COUNTER",
		"sandgate_admission_decisions_total":      "COUNTER",
		"sandgate_workspaces_live":                "GAUGE",
		"sandgate_provider_call_duration_seconds": "HISTOGRAM",
		"sandgate_provider_call_errors_total":     "COUNTER",
		"sandgate_reaper_corrections_total":       "COUNTER",
		"sandgate_reaper_passes_total":            "COUNTER",
		"sandgate_billing_held_micros_total":      "COUNTER",
		"sandgate_billing_settled_micros_total":   "COUNTER",
		"sandgate_pool_seconds_total":             "COUNTER", // 0: the local provider can pool, none configured
		"sandgate_pool_taken_total":               "COUNTER",
	}
	for name, typ := range want {
		f, ok := fams[name]
		if !ok {
			t.Errorf("/metrics has no family %s", name)
			continue
		}
		if got := f.GetType().String(); got != typ {
			t.Errorf("/metrics %s is a %s; want %s", name, got, typ)
		}
	}
	if f := fams["sandgate_admission_decisions_total"]; f != nil && !hasLabel(f.GetMetric(), "outcome", "admitted") {
		t.Errorf("sandgate_admission_decisions_total has no outcome=\"admitted\" series")
	}
	if f := fams["sandgate_billing_held_micros_total"]; f != nil && !hasLabel(f.GetMetric(), "currency", "EUR") {
		t.Errorf("sandgate_billing_held_micros_total has no currency=\"EUR\" series")
	}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.HasPrefix(l.GetName(), "otel_scope") {
					t.Errorf("%s carries the scope label %s", name, l.GetName())
				}
				if v := l.GetValue(); strings.HasPrefix(v, "ws_") || strings.HasPrefix(v, "acct_") || strings.HasPrefix(v, "inst_") {
					t.Errorf("%s has an id as label %s=%q", name, l.GetName(), v)
				}
			}
		}
	}
}

func hasLabel(ms []*dto.Metric, name, value string) bool {
	for _, m := range ms {
		for _, l := range m.GetLabel() {
			if l.GetName() == name && l.GetValue() == value {
				return true
			}
		}
	}
	return false
}
