//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/sandgate/sandgate/protocol"
)

// TestProtocolPointsAsAClient replays, against `sandgate serve` with real
// sandboxes, the requests of issue 10 that a client found answered wrongly:
// each must get the exact status and code.
func TestProtocolPointsAsAClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	gw := startServe(t, newServeConfig(t, startRedis(t).Addr, serveOptions{}))
	adm := gw.Admin(t)
	tok := issueToken(t, adm, createInstance(t, adm, createAccount(t, adm, "e2e-points"), 2))
	c := gw.Client(t, tok)
	ws := acquire(t, c, "points-1")
	hc := httpsClient(gw.cfg.PKI.Roots)
	wsURL := gw.URL + "/v1/workspaces"
	exec, write := wsURL+"/"+ws.WorkspaceID+"/exec", wsURL+"/"+ws.WorkspaceID+"/files/write"

	tests := []struct {
		name   string
		url    string
		body   string
		status int
		code   protocol.Code
	}{
		{"env value null", wsURL, `{"label":"p","egress":{"allowed_domains":[]},"env":{"A":null}}`, 400, protocol.InvalidRequest},
		{"agent empty", wsURL, `{"label":"p","egress":{"allowed_domains":[]},"agent":""}`, 400, protocol.InvalidRequest},
		{"argv invalid UTF-8", exec, "{\"argv\":[\"touch\",\"/workspace/a\xff\"]}", 400, protocol.InvalidRequest},
		{"stdin base64 with a newline", exec, `{"argv":["cat"],"stdin_b64":"aGVs\nbG8K"}`, 400, protocol.InvalidRequest},
		{"write to /usr", write, `{"path":"/usr/x","contents_b64":"eA=="}`, 422, protocol.NotAFile},
		{"write to /proc", write, `{"path":"/proc/self/x","contents_b64":"eA=="}`, 422, protocol.NotAFile},
		{"write under /etc", write, `{"path":"/etc/new/x","contents_b64":"eA=="}`, 422, protocol.NotAFile},
		{"write path invalid UTF-8", write, "{\"path\":\"/workspace/\xc3\",\"contents_b64\":\"eA==\"}", 400, protocol.InvalidRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, tt.url, bytes.NewReader([]byte(tt.body)))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(protocol.HeaderIdempotencyKey, "points-refused")
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			var env protocol.Envelope
			if err := json.Unmarshal(b, &env); err != nil || resp.StatusCode != tt.status || env.Error.Code != tt.code {
				t.Errorf("answer = %d %s; want %d %s", resp.StatusCode, b, tt.status, tt.code)
			}
			if env.Error.Retryable {
				t.Errorf("answer %s is retryable; want a mistake the client fixes", env.Error.Code)
			}
		})
	}
	// None of the refused requests reached the sandbox.
	res, err := c.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"ls", "-A", "/workspace"}})
	if err != nil || res.StdoutB64 != "" {
		t.Errorf("ls /workspace after the refusals = %+v, %v; want it empty", res, err)
	}
	if ws2, _, err := c.Acquire(ctx, "points-refused", protocol.AcquireRequest{Label: "p", Egress: noEgress()}); err != nil || ws2.WorkspaceID == "" {
		t.Errorf("Acquire with the key the refusals used = %v; want a new workspace (a 400 consumes no key)", err)
	}
}
