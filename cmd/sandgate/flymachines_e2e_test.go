//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/logbuf"
	"github.com/sandgate/sandgate/protocol"
)

// fakeFly is the fake Machines API (providers/flymachines/flytest) run as
// a process of its own, as a real vendor would be.
type fakeFly struct {
	url, caFile, token string
	cmd                *exec.Cmd
	logs               logbuf.Buffer
	done               chan struct{}
}

var (
	flyfakeOnce sync.Once
	flyfakeBin  string
	flyfakeErr  error
)

// startFakeFly builds (once) and starts cmd/flyfake, and stops it with
// SIGTERM when the test ends; it destroys its Machines then.
func startFakeFly(t *testing.T) *fakeFly {
	t.Helper()
	flyfakeOnce.Do(func() {
		flyfakeBin = filepath.Join(filepath.Dir(sandgateBin), "flyfake")
		out, err := exec.Command("go", "build", "-o", flyfakeBin, "github.com/sandgate/sandgate/providers/flymachines/flytest/cmd/flyfake").CombinedOutput()
		if err != nil {
			flyfakeErr = err
			flyfakeBin = string(out)
		}
	})
	if flyfakeErr != nil {
		t.Fatalf("go build flyfake: %v\n%s", flyfakeErr, flyfakeBin)
	}
	dir := t.TempDir()
	f := &fakeFly{token: "fm2_" + randHex(16), done: make(chan struct{})}
	info := filepath.Join(dir, "info.json")
	f.cmd = exec.Command(flyfakeBin, "-data-dir", dir, "-info", info, "-orgs", "sandgate-org")
	f.cmd.Env = cleanEnv("FLYFAKE_TOKEN=" + f.token)
	f.cmd.Stdout, f.cmd.Stderr = &f.logs, &f.logs
	f.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := startTied(f.cmd); err != nil {
		t.Fatalf("start flyfake: %v", err)
	}
	go func() { f.cmd.Wait(); close(f.done) }()
	t.Cleanup(func() {
		f.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-f.done:
		case <-time.After(60 * time.Second):
			t.Errorf("flyfake did not stop within 60s of SIGTERM")
			f.cmd.Process.Kill()
			<-f.done
		}
		if t.Failed() {
			t.Logf("flyfake output:\n%s", tail(f.logs.String(), 8<<10))
		}
	})
	waitFor(t, "flyfake's info file", func() (bool, error) {
		select {
		case <-f.done:
			t.Fatalf("flyfake exited early:\n%s", f.logs.String())
		default:
		}
		b, err := os.ReadFile(info)
		if err != nil {
			return false, err
		}
		var v struct {
			URL    string `json:"url"`
			CAFile string `json:"ca_file"`
		}
		if err := json.Unmarshal(b, &v); err != nil {
			return false, err
		}
		f.url, f.caFile = v.URL, v.CAFile
		return true, nil
	})
	return f
}

// fakeMachine is a Machine as the fake lists it.
type fakeMachine struct {
	ID     string `json:"id"`
	State  string `json:"state"`
	Config struct {
		AutoDestroy bool                    `json:"auto_destroy"`
		Restart     struct{ Policy string } `json:"restart"`
		Metadata    map[string]string       `json:"metadata"`
		Env         map[string]string       `json:"env"`
		Init        struct{ Exec []string } `json:"init"`
	} `json:"config"`
}

// machines lists every Machine of app the fake has, destroyed ones included.
func (f *fakeFly) machines(t *testing.T, app string) []fakeMachine {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, f.url+"/v1/apps/"+app+"/machines?include_deleted=true", nil)
	req.Header.Set("Authorization", "FlyV1 "+f.token)
	resp, err := httpsClient(loadPool(t, f.caFile)).Do(req)
	if err != nil {
		t.Fatalf("list the fake's machines: %v", err)
	}
	defer resp.Body.Close()
	var ms []fakeMachine
	if err := json.NewDecoder(resp.Body).Decode(&ms); err != nil || resp.StatusCode != 200 {
		t.Fatalf("list the fake's machines: HTTP %d, %v", resp.StatusCode, err)
	}
	return ms
}

// createMachine creates a Machine in the fake directly, as another
// client of the account would, and returns its id.
func (f *fakeFly) createMachine(t *testing.T, app string, metadata map[string]string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"config": map[string]any{
		"image": "docker.io/library/ubuntu:24.04", "metadata": metadata, "auto_destroy": true,
		"restart": map[string]string{"policy": "no"}, "guest": map[string]any{"cpu_kind": "shared", "cpus": 1, "memory_mb": 256}}})
	req, _ := http.NewRequest(http.MethodPost, f.url+"/v1/apps/"+app+"/machines", bytes.NewReader(body))
	req.Header.Set("Authorization", "FlyV1 "+f.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpsClient(loadPool(t, f.caFile)).Do(req)
	if err != nil {
		t.Fatalf("create a machine in the fake: %v", err)
	}
	defer resp.Body.Close()
	var m fakeMachine
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != 200 || m.ID == "" {
		t.Fatalf("create a machine in the fake: HTTP %d, %v", resp.StatusCode, err)
	}
	return m.ID
}

// TestFlyMachinesDev runs `sandgate dev --provider fly-machines` against
// the fake Machines API with the vendor's own variables and the fake's CA
// in SSL_CERT_FILE: the README's walk-through verbatim, then a snapshot
// and a warm start from it, and an orphan Machine is swept by the
// reaper. Every Machine is gone at the end, each was
// created with auto_destroy, restart "no", the lifetime init and only
// the broker's metadata, and no token or content is in the broker's logs.
func TestFlyMachinesDev(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := startFakeFly(t)
	app := "sandgate-e2e-" + randHex(4)
	d := startDevWith(t, []string{
		"FLY_API_TOKEN=" + f.token, "FLY_FLAPS_BASE_URL=" + f.url,
		"SANDGATE_FLY_APP=" + app, "SANDGATE_FLY_ORG=sandgate-org", "SSL_CERT_FILE=" + f.caFile,
	}, "--provider", "fly-machines")

	// The README's walk-through, verbatim, with its "Snapshots and durable
	// commands" block run before the release (it needs the workspace).
	script, err := filepath.Abs("testdata/walkthrough.sh")
	if err != nil {
		t.Fatal(err)
	}
	checkReadmeWalkthrough(t, script)
	b, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	head, body, _ := strings.Cut(string(b), "set -euo pipefail\n\n")
	// The walk-through, then its "Snapshots and durable commands" section,
	// in the same shell, as the README says.
	full := head + "set -euo pipefail\n\n" + body + readmeBlock(t, "### Snapshots and durable commands")
	fullPath := filepath.Join(t.TempDir(), "walkthrough-fly.sh")
	if err := os.WriteFile(fullPath, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", fullPath)
	cmd.Dir = d.workDir
	cmd.Env = cleanEnv()
	stdout, _ := runScript(t, "the walk-through", cmd, func() string { return tail(d.Logs(), 8<<10) })
	for _, want := range []string{`"state":"active"`, "workspace: ws_", `"exit_code":0`, `"stdout_b64":"aGkK"`,
		`"contents_b64":"aGVsbG8K"`, `"state":"canceled"`, `"state":"terminated"`, `"termination_reason":"released"`} {
		if !strings.Contains(stdout, want) {
			t.Errorf("the walk-through's output lacks %s:\n%s", want, stdout)
		}
	}
	c := d.Client(t, "")
	// The README reads the file back in the warm start too, then releases
	// everything it made.
	if n := strings.Count(stdout, `"contents_b64":"aGVsbG8K"`); n < 2 {
		t.Errorf("the file was read back %d times; want 2 (the warm start has it too)", n)
	}
	if live, err := c.ListWorkspaces(ctx, "live", "", 0); err != nil || len(live.Workspaces) != 0 {
		t.Errorf("live workspaces after the README = %+v, %v; want none", live, err)
	}

	// A snapshot and a warm start, with secrets planted for the log scan.
	rnd := randHex(10)
	secEnv, secArgv, secContent := "SECRET-ENV-"+rnd, "SECRET-ARGV-"+rnd, "SECRET-CONTENT-"+rnd
	ws, _, err := c.Acquire(ctx, "fly-e2e-1", protocol.AcquireRequest{Label: "fly", Egress: noEgress(), Env: map[string]string{"SG_SECRET": secEnv}})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	res, err := c.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"sh", "-c",
		`mkdir -p /workspace/dir && printf %s "$1" >/workspace/dir/arg && printf '\377\000%s' "$SG_SECRET" >/workspace/dir/bin`, "sh", secArgv}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Exec = %+v, %v", res, err)
	}
	if err := c.WriteFile(ctx, ws.WorkspaceID, "/workspace/dir/file", []byte(secContent)); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	snap, _, err := c.Snapshot(ctx, ws.WorkspaceID, "fly-e2e-snap", "/workspace/dir")
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	warm, _, err := c.Acquire(ctx, "fly-e2e-warm", protocol.AcquireRequest{Label: "fly-warm", Egress: noEgress(), SnapshotID: snap.SnapshotID})
	if err != nil {
		t.Fatalf("warm Acquire: %v", err)
	}
	for path, want := range map[string]string{"/workspace/dir/file": secContent, "/workspace/dir/arg": secArgv, "/workspace/dir/bin": "\xff\x00" + secEnv} {
		if b, err := c.ReadFile(ctx, warm.WorkspaceID, path); err != nil || string(b) != want {
			t.Errorf("warm start: ReadFile(%s) = %q, %v; want %q", path, b, err, want)
		}
	}
	for _, id := range []string{ws.WorkspaceID, warm.WorkspaceID} {
		if _, err := c.Release(ctx, id); err != nil {
			t.Errorf("Release(%s): %v", id, err)
		}
	}
	if err := c.DeleteSnapshot(ctx, snap.SnapshotID); err != nil {
		t.Errorf("DeleteSnapshot: %v", err)
	}

	ms := f.machines(t, app)
	if len(ms) != 5 {
		t.Errorf("the fake had %d machines; want 5 (the walk-through's, the snapshot section's two, cold, warm)", len(ms))
	}
	for _, m := range ms {
		if m.State != "destroyed" {
			t.Errorf("machine %s is %s after release; want destroyed", m.ID, m.State)
		}
		cfg := m.Config
		if !cfg.AutoDestroy || cfg.Restart.Policy != "no" || len(cfg.Init.Exec) == 0 {
			t.Errorf("machine %s: auto_destroy %v, restart %q, init %d args; want true, no, the lifetime init", m.ID, cfg.AutoDestroy, cfg.Restart.Policy, len(cfg.Init.Exec))
		}
		if len(cfg.Metadata) != 3 || cfg.Metadata["sandgate-broker"] != "sandgate-dev" {
			t.Errorf("machine %s metadata = %v; want the broker's three ids", m.ID, cfg.Metadata)
		}
	}

	// An orphan: a Machine with the broker's labels and no record. The
	// reaper's orphan sweep finds it by List and destroys it.
	orphan := f.createMachine(t, app, map[string]string{
		"sandgate-broker": "sandgate-dev", "sandgate-workspace": "ws_orphan" + randHex(6), "sandgate-instance": "inst_orphan"})
	waitFor(t, "the orphan machine swept", func() (bool, error) {
		for _, m := range f.machines(t, app) {
			if m.ID == orphan && m.State == "destroyed" {
				return true, nil
			}
		}
		return false, nil
	})

	d.stop()
	logs := d.Logs()
	for what, secret := range map[string]string{
		"the Fly token": f.token, "the Fly token's secret part": f.token[4:], "an env value": secEnv,
		"argv": secArgv, "file contents": secContent, "file contents, base64": base64.StdEncoding.EncodeToString([]byte(secContent)),
		"the random part of any secret": rnd,
	} {
		if i := strings.Index(logs, secret); i >= 0 {
			t.Errorf("sandgate dev's output contains %s: …%s…", what, logs[max(0, i-200):min(len(logs), i+len(secret)+50)])
		}
	}
	if !strings.Contains(logs, "sandbox created") {
		t.Errorf("sandgate dev's output has no provider log line; is logging captured?")
	}
}
