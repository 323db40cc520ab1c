//go:build linux

package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/logbuf"
	"github.com/sandgate/sandgate/providers/flysprites"
)

// startFakeSprites builds and runs the fake Sprites API as its own
// process (providers/flysprites/spritetest/fakesprites) with token, and
// returns its SPRITES_API_URL and SSL_CERT_FILE and its output. It is
// stopped with SIGTERM when the test ends, which deletes its sprites.
func startFakeSprites(t *testing.T, token string) (apiURL, caFile string, logs *logbuf.Buffer) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "fakesprites")
	build := exec.Command("go", "build", "-race", "-o", bin, "../../providers/flysprites/spritetest/fakesprites")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build fakesprites: %v\n%s", err, out)
	}
	info := filepath.Join(dir, "info.env")
	cmd := exec.Command(bin, "--data-dir", filepath.Join(dir, "data"), "--info", info)
	cmd.Env = cleanEnv("SPRITE_TOKEN=" + token)
	logs = &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	// SIGTERM, not SIGKILL: on it the fake deletes its sprites and their sandboxes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := startTied(cmd); err != nil {
		t.Fatalf("start fakesprites: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("fakesprites exited with %v after SIGTERM\n%s", err, logs.String())
			}
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Errorf("fakesprites did not exit within 30s of SIGTERM")
		}
	})
	waitFor(t, "fakesprites info", func() (bool, error) {
		select {
		case err := <-done:
			t.Fatalf("fakesprites exited early (%v):\n%s", err, logs.String())
		default:
		}
		b, err := os.ReadFile(info)
		if err != nil {
			return false, err
		}
		env, err := parseVars(string(b))
		apiURL, caFile = env["SPRITES_API_URL"], env["SSL_CERT_FILE"]
		return err == nil && apiURL != "" && caFile != "", err
	})
	return apiURL, caFile, logs
}

func parseVars(s string) (map[string]string, error) {
	env := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	return env, nil
}

// TestFlySpritesWalkthrough runs `sandgate dev --provider fly-sprites`
// against the fake Sprites API as its own process (SPRITE_TOKEN,
// SPRITES_API_URL and SSL_CERT_FILE, as the README says) and runs the
// README's curl walk-through with the real curl: steps 1 to 4, then the
// "Snapshots and durable commands" block (snapshot, warm start into a new
// sprite, durable command), then step 5, all verbatim. Then it greps
// every log for the vendor token, the client token and content.
func TestFlySpritesWalkthrough(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "curl", "sed", "date"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the walk-through needs %s: %v", tool, err)
		}
	}
	token := "spr_e2e_" + randHex(16)
	apiURL, caFile, fakeLogs := startFakeSprites(t, token)
	d := startDevWith(t, []string{"SPRITE_TOKEN=" + token, "SPRITES_API_URL=" + apiURL, "SSL_CERT_FILE=" + caFile},
		"--provider", "fly-sprites")

	// The walk-through, then its "Snapshots and durable commands" section,
	// in the same shell, as the README says.
	script := "set -euo pipefail\n" + readmeBlock(t, "## Walk-through with curl") + readmeBlock(t, "### Snapshots and durable commands")
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = d.workDir
	cmd.Env = cleanEnv()
	out, stderr := runScript(t, "walk-through", cmd, func() string { return tail(d.Logs(), 8<<10) })
	for _, want := range []string{
		`"admission":{"state":"open"}`,    // 1. GET /v1/lease
		"workspace: ws_",                  // 2.
		`"stdout_b64":"aGkK"`,             // 3. exec echo hi
		`"contents_b64":"aGVsbG8K"`,       // 4. the file read back
		`"state":"running"`,               // the warm start's 201, the durable command
		`{"state":"canceled"}`,            // its cancel
		`"state":"terminated"`,            // 5. DELETE
		`"termination_reason":"released"`, // 5.
	} {
		if !strings.Contains(out, want) {
			t.Errorf("walk-through output lacks %s", want)
		}
	}
	// The warm start is a new sprite with the snapshot's directory in it:
	// the README reads the file back there too, then releases everything.
	if n := strings.Count(out, `"contents_b64":"aGVsbG8K"`); n < 2 {
		t.Errorf("the file was read back %d times; want 2 (the warm start has it too)", n)
	}
	c := d.Client(t, "")
	if live, err := c.ListWorkspaces(context.Background(), "live", "", 0); err != nil || len(live.Workspaces) != 0 {
		t.Errorf("live workspaces after the README = %+v, %v; want none", live, err)
	}
	if t.Failed() {
		t.Logf("walk-through output:\n%s\nstderr:\n%s", out, stderr)
	}

	// An orphan: a sprite of this broker and provider that no record
	// knows (its create's answer was lost). The reaper's sweep deletes it.
	orphan := flysprites.NamePrefix("sandgate-dev", "fly-sprites") + "ws-orphan" + randHex(6)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: loadPool(t, caFile)}}}
	vendor := func(method, path, body string) int {
		req, _ := http.NewRequest(method, apiURL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s at the fake: %v", method, path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	labels := `["sandgate-broker=sandgate-dev","sandgate-workspace=ws_orphan","sandgate-instance=inst_orphan"]`
	if st := vendor(http.MethodPost, "/v1/sprites", `{"name":"`+orphan+`","labels":`+labels+`}`); st != http.StatusCreated {
		t.Fatalf("creating the orphan at the fake: status %d", st)
	}
	waitFor(t, "the reaper to sweep the orphan sprite", func() (bool, error) {
		st := vendor(http.MethodGet, "/v1/sprites/"+orphan, "")
		return st == http.StatusNotFound, fmt.Errorf("GET the orphan: status %d", st)
	})
	waitFor(t, "the broker's log of the orphan sweep", func() (bool, error) {
		return strings.Contains(d.Logs(), `"msg":"reaper terminated an orphan","component":"reaper","workspace_id":"ws_orphan"`), nil
	})

	// No token or content in any log: dev's stderr (its stdout prints
	// BROKER_TOKEN by design) and everything the fake vendor wrote.
	logs := map[string]string{"sandgate dev stderr": d.stderr.String(), "fakesprites": fakeLogs.String()}
	for name, l := range logs {
		for _, secret := range []string{token, d.Token, "aGVsbG8K", "hello.txt", "/workspace/notes"} {
			if strings.Contains(l, secret) {
				t.Errorf("%s holds %q", name, secret)
			}
		}
	}
	if strings.Contains(d.stdout.String(), token) {
		t.Errorf("sandgate dev stdout holds the vendor token")
	}
}
