package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/sandgate/sandgate/internal/broker"
	"github.com/sandgate/sandgate/protocol"
)

// TestInflightCapServe: `sandgate serve` takes admission.inflight from its
// config. With two execs of one workspace running in real sandboxes, a third
// is refused with exactly 429 rate_limited and Retry-After 1; releasing the
// workspace ends the held ones.
func TestInflightCapServe(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	cfg := newServeConfig(t, rs.Addr, serveOptions{})
	appendConfig(t, cfg, "admission:\n  inflight:\n    per_workspace: 2\n    per_instance: 10\n    max_bytes: 104857600\n")
	s := startServe(t, cfg)
	adm := s.Admin(t)
	tok := issueToken(t, adm, createInstance(t, adm, createAccount(t, adm, "e2e-inflight"), 2))
	c := s.Client(t, tok)
	ws := acquire(t, c, "inflight")
	hc := httpsClient(cfg.PKI.Roots)
	execURL := s.URL + "/v1/workspaces/" + ws.WorkspaceID + "/exec"
	post := func(argv ...string) (int, http.Header, []byte) {
		body, _ := json.Marshal(protocol.ExecRequest{Argv: argv, TimeoutSeconds: 600})
		req, err := http.NewRequest(http.MethodPost, execURL, bytes.NewReader(body))
		if err != nil {
			t.Error(err)
			return 0, nil, nil
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return 0, nil, nil // a held exec cut short by the release
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b
	}

	// Two execs that wait for a file nobody writes; one refused while a
	// probe below holds a place tries again.
	var held sync.WaitGroup
	for range 2 {
		held.Go(func() {
			for {
				if st, _, _ := post("sh", "-c", "while [ ! -e /workspace/never ]; do sleep 0.05; done"); st != http.StatusTooManyRequests {
					return
				}
			}
		})
	}
	var status int
	var header http.Header
	var body []byte
	waitFor(t, "a third exec to be refused while two run", func() (bool, error) {
		status, header, body = post("true")
		return status == http.StatusTooManyRequests, nil
	})
	var env protocol.Envelope
	if err := json.Unmarshal(body, &env); err != nil || env.Error.Code != protocol.RateLimited {
		t.Errorf("refusal body %s: code %q, %v; want rate_limited", body, env.Error.Code, err)
	}
	if got := header.Get(protocol.HeaderRetryAfter); got != "1" {
		t.Errorf("refusal Retry-After = %q; want \"1\"", got)
	}
	if !strings.Contains(env.Error.Message, "workspace") {
		t.Errorf("refusal message %q; want it to name the workspace's cap", env.Error.Message)
	}
	if _, err := c.Release(context.Background(), ws.WorkspaceID); err != nil {
		t.Fatalf("release: %v", err)
	}
	held.Wait()
}

// TestConfigInflight: admission.inflight is read from the config file, and
// a negative cap is refused.
func TestConfigInflight(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(yaml string) string {
		p := dir + "/c.yaml"
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c, err := broker.LoadConfig(write("admission:\n  inflight:\n    per_workspace: 3\n    per_instance: 5\n    max_bytes: 1048576\n"), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if in := c.Admission.Inflight; in.PerWorkspace != 3 || in.PerInstance != 5 || in.MaxBytes != 1<<20 {
		t.Errorf("admission.inflight = %+v; want 3, 5, 1048576", in)
	}
	if _, err := broker.LoadConfig(write("admission:\n  inflight:\n    per_workspace: -1\n"), func(string) string { return "" }); err == nil {
		t.Errorf("loadConfig with per_workspace -1 = nil error; want a refusal")
	}
}
