//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/protocol"
)

// TestE2EDev drives every endpoint of a real `sandgate dev` through the v1
// client, then the operator CLI through the binary, checking each CLI
// action's effect through the client.
func TestE2EDev(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := startDev(t)
	c := d.Client(t, "")

	lease, err := c.Lease(ctx)
	if err != nil {
		t.Fatalf("Lease: %v", err)
	}
	if lease.Lease.State != "active" || lease.Admission.State != protocol.AdmissionOpen {
		t.Fatalf("Lease: state %q, admission %q; want active, open", lease.Lease.State, lease.Admission.State)
	}

	req := protocol.AcquireRequest{Label: "e2e-dev", Egress: noEgress(), Env: map[string]string{"GREETING": "hello"}}
	ws, created, err := c.Acquire(ctx, "e2e-dev-1", req)
	if err != nil || !created {
		t.Fatalf("Acquire = created %v, %v; want 201", created, err)
	}
	if ws.State != "running" || !strings.HasPrefix(ws.WorkspaceID, sandgate.PrefixWorkspace) {
		t.Fatalf("Acquire: workspace %+v; want a running ws_ id", ws)
	}
	again, created, err := c.Acquire(ctx, "e2e-dev-1", req)
	if err != nil || created {
		t.Fatalf("Acquire replay = created %v, %v; want 200", created, err)
	}
	if again.WorkspaceID != ws.WorkspaceID {
		t.Fatalf("Acquire replay: id %s; want %s", again.WorkspaceID, ws.WorkspaceID)
	}

	got, err := c.Workspace(ctx, ws.WorkspaceID)
	if err != nil || got.State != "running" {
		t.Fatalf("Workspace = %+v, %v; want running", got, err)
	}
	list, err := c.ListWorkspaces(ctx, "live", "", 0)
	if err != nil {
		t.Fatalf("ListWorkspaces: %v", err)
	}
	if !listed(list, ws.WorkspaceID) {
		t.Fatalf("ListWorkspaces(live) does not list %s", ws.WorkspaceID)
	}

	res, err := c.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"echo", "hi"}})
	if err != nil {
		t.Fatalf("Exec echo hi: %v", err)
	}
	if out := b64(t, res.StdoutB64); out != "hi\n" || res.ExitCode != 0 {
		t.Fatalf("Exec echo hi = exit %d, stdout %q; want 0, %q", res.ExitCode, out, "hi\n")
	}
	res, err = c.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"sh", "-c", `echo "$GREETING" >&2; exit 3`}})
	if err != nil {
		t.Fatalf("Exec exit 3: %v", err)
	}
	if errOut := b64(t, res.StderrB64); res.ExitCode != 3 || errOut != "hello\n" {
		t.Fatalf("Exec exit 3 = exit %d, stderr %q; want 3, %q", res.ExitCode, errOut, "hello\n")
	}
	res, err = c.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"sleep", "30"}, TimeoutSeconds: 1})
	if err != nil {
		t.Fatalf("Exec sleep 30 (timeout 1s): %v", err)
	}
	if res.ExitCode <= 128 || !res.TimedOut {
		t.Fatalf("Exec sleep 30 (timeout 1s) = exit %d, timed_out %v; want > 128, true", res.ExitCode, res.TimedOut)
	}

	data := make([]byte, 64<<10)
	for i := range data {
		data[i] = byte(i * 7) // every byte value, NULs included
	}
	if err := c.WriteFile(ctx, ws.WorkspaceID, "/workspace/dir/sub/blob.bin", data); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	back, err := c.ReadFile(ctx, ws.WorkspaceID, "/workspace/dir/sub/blob.bin")
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	if !bytes.Equal(back, data) {
		t.Fatalf("ReadFile returned %d bytes that differ from the %d written", len(back), len(data))
	}
	_, err = c.ReadFile(ctx, ws.WorkspaceID, "/workspace/no/such/file")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ReadFile(missing) = %v; want an error matching fs.ErrNotExist", err)
	}
	wantCode(t, "ReadFile(missing)", err, http.StatusNotFound, protocol.FileNotFound)

	// Snapshot the directory, then warm-start a second workspace from it:
	// the file is back at the same path.
	snap, created, err := c.Snapshot(ctx, ws.WorkspaceID, "e2e-snap-1", "/workspace/dir")
	if err != nil || !created || !strings.HasPrefix(snap.SnapshotID, sandgate.PrefixSnapshot) {
		t.Fatalf("Snapshot = %+v, created %v, %v; want 201 with a snap_ id", snap, created, err)
	}
	if replay, created, err := c.Snapshot(ctx, ws.WorkspaceID, "e2e-snap-1", "/workspace/dir"); err != nil || created || replay.SnapshotID != snap.SnapshotID {
		t.Fatalf("Snapshot replay = %+v, created %v, %v; want 200 with %s", replay, created, err, snap.SnapshotID)
	}
	warm, created, err := c.Acquire(ctx, "e2e-dev-warm", protocol.AcquireRequest{Label: "e2e-warm", Egress: noEgress(), SnapshotID: snap.SnapshotID})
	if err != nil || !created {
		t.Fatalf("Acquire from snapshot = created %v, %v; want 201", created, err)
	}
	if back, err := c.ReadFile(ctx, warm.WorkspaceID, "/workspace/dir/sub/blob.bin"); err != nil || !bytes.Equal(back, data) {
		t.Fatalf("ReadFile in the warm-started workspace = %d bytes, %v; want the %d bytes snapshotted", len(back), err, len(data))
	}

	// A durable command: started once, read until completed; a cancel
	// after completion keeps the result.
	cmdReq := protocol.ExecRequest{Argv: []string{"sh", "-c", "echo durable >> /workspace/log; cat /workspace/log; exit 4"}}
	if st, launched, err := c.StartCommand(ctx, warm.WorkspaceID, "e2e:cmd-1", cmdReq); err != nil || !launched || st == nil {
		t.Fatalf("StartCommand = %+v, launched %v, %v; want 202", st, launched, err)
	}
	if _, launched, err := c.StartCommand(ctx, warm.WorkspaceID, "e2e:cmd-1", cmdReq); err != nil || launched {
		t.Fatalf("StartCommand again = launched %v, %v; want 200 (claimed once)", launched, err)
	}
	var st *protocol.CommandStatus
	waitFor(t, "the durable command to complete", func() (bool, error) {
		st, err = c.ReadCommand(ctx, warm.WorkspaceID, "e2e:cmd-1")
		return err == nil && st.State == protocol.CommandCompleted, fmt.Errorf("state %+v, %v", st, err)
	})
	if st.ExitCode == nil || *st.ExitCode != 4 || b64(t, st.StdoutB64) != "durable\n" {
		t.Fatalf("ReadCommand = %s; want exit 4 and one line of output", mustJSON(t, st))
	}
	if err := c.CancelCommand(ctx, warm.WorkspaceID, "e2e:cmd-1"); err != nil {
		t.Fatalf("CancelCommand after completion: %v", err)
	}
	if st, err := c.ReadCommand(ctx, warm.WorkspaceID, "e2e:cmd-1"); err != nil || st.State != protocol.CommandCompleted {
		t.Fatalf("ReadCommand after cancel = %+v, %v; want still completed", st, err)
	}
	if st, err := c.ReadCommand(ctx, warm.WorkspaceID, "e2e:never"); err != nil || st.State != protocol.CommandUnknown {
		t.Fatalf("ReadCommand(unknown identity) = %+v, %v; want unknown", st, err)
	}
	if err := c.DeleteSnapshot(ctx, snap.SnapshotID); err != nil {
		t.Fatalf("DeleteSnapshot: %v", err)
	}
	if err := c.DeleteSnapshot(ctx, snap.SnapshotID); err != nil {
		t.Fatalf("DeleteSnapshot again: %v; want 204", err)
	}
	if _, err := c.Release(ctx, warm.WorkspaceID); err != nil {
		t.Fatalf("Release warm: %v", err)
	}

	rel, err := c.Release(ctx, ws.WorkspaceID)
	if err != nil || rel == nil {
		t.Fatalf("Release = %+v, %v; want a status object", rel, err)
	}
	if rel.State != "terminated" || rel.TerminationReason == nil || *rel.TerminationReason != "released" ||
		rel.TerminatedAt == nil || rel.MeteredSeconds == nil {
		t.Fatalf("Release = %s; want terminated, reason released, terminated_at and metered_seconds", mustJSON(t, rel))
	}
	_, err = c.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"true"}})
	wantCode(t, "Exec after release", err, http.StatusGone, protocol.WorkspaceGone)
	if rel2, err := c.Release(ctx, ws.WorkspaceID); err != nil || rel2 == nil || rel2.State != "terminated" {
		t.Fatalf("Release again = %+v, %v; want terminated (idempotent)", rel2, err)
	}
	list, err = c.ListWorkspaces(ctx, "live", "", 0)
	if err != nil || listed(list, ws.WorkspaceID) {
		t.Fatalf("ListWorkspaces(live) after release = %v; want %s gone", err, ws.WorkspaceID)
	}

	t.Run("AdminCLI", func(t *testing.T) { testAdminCLI(t, d) })

	// dev prints BROKER_TOKEN to stdout on purpose; its logs (stderr) must
	// never carry a token. TestNoSecretsInLogs scans a serve run in depth.
	if logs := d.stderr.String(); strings.Contains(logs, d.Token) || strings.Contains(logs, d.AdminToken) {
		t.Errorf("sandgate dev's log (stderr) contains a token")
	}
}

// testAdminCLI runs `sandgate admin …` against the dev broker and checks
// each effect through the v1 client.
func testAdminCLI(t *testing.T, d *devBroker) {
	ctx := context.Background()
	env := d.AdminEnv()

	acct := runCLI(t, env, "admin", "account", "create", "--name", "e2e-cli")
	acctID := strings.TrimSuffix(acct, "\n")
	if !strings.HasPrefix(acctID, sandgate.PrefixAccount) || strings.ContainsAny(acctID, " \t\n") {
		t.Fatalf("account create printed %q; want the account id alone", acct)
	}
	// An account whose billing was never configured cannot acquire.
	runCLI(t, env, "admin", "billing", "set", "--account", acctID, "--free")
	inst := runCLI(t, env, "admin", "instance", "create", "--account", acctID,
		"--max-concurrent", "2", "--max-lifetime", "1h", "--idle-timeout", "15m",
		"--sizes", "small,standard", "--default-size", "small")
	instID := strings.TrimSuffix(inst, "\n")
	if !strings.HasPrefix(instID, sandgate.PrefixInstance) || strings.ContainsAny(instID, " \t\n") {
		t.Fatalf("instance create printed %q; want the instance id alone", inst)
	}

	var in adminapi.Instance
	if err := json.Unmarshal([]byte(runCLI(t, env, "admin", "instance", "get", instID, "-o", "json")), &in); err != nil {
		t.Fatalf("instance get -o json: %v", err)
	}
	l := in.Scope.Limits
	if in.ID != instID || in.AccountID != acctID || l.MaxConcurrentWorkspaces != 2 || l.MaxLifetimeSeconds != 3600 ||
		l.IdleTimeoutSeconds != 900 || strings.Join(in.Scope.Sizes, ",") != "small,standard" || in.Scope.DefaultSize != "small" {
		t.Fatalf("instance get = %s; want the scope just created", mustJSON(t, in))
	}

	tok1 := cliToken(t, runCLI(t, env, "admin", "token", "issue", "--instance", instID))
	c1 := d.Client(t, tok1)
	lease, err := c1.Lease(ctx)
	if err != nil {
		t.Fatalf("Lease with the issued token: %v", err)
	}
	if lease.Lease.State != "active" || lease.Lease.InstanceID != instID || lease.DefaultSize != "small" ||
		len(lease.Sizes) != 2 || lease.Limits.MaxConcurrentWorkspaces != 2 || lease.Limits.MaxLifetimeSeconds != 3600 {
		t.Fatalf("Lease with the issued token = %s; want the instance's scope", mustJSON(t, lease))
	}
	ws := acquire(t, c1, "e2e-cli-1")
	if ws.Size != "small" {
		t.Fatalf("Acquire without a size: size %q; want the default, small", ws.Size)
	}

	tok2 := cliToken(t, runCLI(t, env, "admin", "token", "rotate", "--instance", instID))
	c2 := d.Client(t, tok2)
	lease, err = c1.Lease(ctx)
	if err != nil || lease.Lease.State != "superseded" || lease.Lease.SupersededAt == nil {
		t.Fatalf("Lease with the rotated-out token in grace = %+v, %v; want superseded", lease, err)
	}
	if lease, err = c2.Lease(ctx); err != nil || lease.Lease.State != "active" {
		t.Fatalf("Lease with the new token = %+v, %v; want active", lease, err)
	}
	// spec §Credential: rotation keeps the instance's workspaces.
	if got, err := c2.Workspace(ctx, ws.WorkspaceID); err != nil || got.State != "running" {
		t.Fatalf("the new token reading the old token's workspace = %+v, %v; want running", got, err)
	}

	if n := strings.TrimSpace(runCLI(t, env, "admin", "token", "end-grace", "--instance", instID)); n != "1" {
		t.Fatalf("token end-grace printed %q; want 1", n)
	}
	_, err = c1.Lease(ctx)
	wantCode(t, "Lease with the superseded token after end-grace", err, http.StatusUnauthorized, protocol.LeaseSuperseded)
	if _, err := c2.Lease(ctx); err != nil {
		t.Fatalf("Lease with the new token after end-grace: %v", err)
	}

	// One token by its lease id: the token still in its grace period is cut
	// off at once, its successor and the workspaces are untouched.
	tok3 := cliToken(t, runCLI(t, env, "admin", "token", "rotate", "--instance", instID))
	c3 := d.Client(t, tok3)
	l2, err := c2.Lease(ctx)
	if err != nil || l2.Lease.State != "superseded" {
		t.Fatalf("Lease with the rotated-out token = %+v, %v; want superseded", l2, err)
	}
	for _, args := range [][]string{{}, {"--instance", instID, "--lease", l2.Lease.ID}, {"--lease", l2.Lease.ID, "--keep-workspaces"}} {
		if _, stderr, err := tryCLI(env, append([]string{"admin", "token", "revoke"}, args...)...); err == nil {
			t.Fatalf("token revoke %q succeeded; want a usage error (stderr %q)", args, stderr)
		}
	}
	if out := strings.TrimSpace(runCLI(t, env, "admin", "token", "revoke", "--lease", l2.Lease.ID)); out != "revoked=1 terminated=0 failed=0" {
		t.Fatalf("token revoke --lease printed %q; want revoked=1 terminated=0 failed=0", out)
	}
	_, err = c2.Lease(ctx)
	wantCode(t, "Lease with the token revoked by its lease", err, http.StatusUnauthorized, protocol.LeaseRevoked)
	if l3, err := c3.Lease(ctx); err != nil || l3.Lease.State != "active" {
		t.Fatalf("Lease with the successor after revoke --lease = %+v, %v; want active", l3, err)
	}
	if got, err := c3.Workspace(ctx, ws.WorkspaceID); err != nil || got.State != "running" {
		t.Fatalf("workspace after revoke --lease = %+v, %v; want running", got, err)
	}

	if n := strings.TrimSpace(runCLI(t, env, "admin", "token", "revoke", "--instance", instID)); n == "0" {
		t.Fatalf("token revoke printed %q; want a count > 0", n)
	}
	_, err = c3.Lease(ctx)
	wantCode(t, "Lease after revoke", err, http.StatusUnauthorized, protocol.LeaseRevoked)
	_, err = c3.Workspace(ctx, ws.WorkspaceID)
	wantCode(t, "Workspace after revoke", err, http.StatusUnauthorized, protocol.LeaseRevoked)

	// A refusal of the operator API is a non-zero exit with a message.
	if _, stderr, err := tryCLI(env, "admin", "instance", "get", "inst_doesnotexist"); err == nil || !strings.Contains(stderr, "not_found") {
		t.Fatalf("instance get of an unknown id = %v, stderr %q; want a non-zero exit naming not_found", err, stderr)
	}
	if _, stderr, err := tryCLI([]string{"SANDGATE_ADMIN_URL=" + d.AdminURL, "SANDGATE_ADMIN_TOKEN=sgo_wrong"}, "admin", "account", "list"); err == nil {
		t.Fatalf("admin with a wrong operator token succeeded; stderr %q", stderr)
	}

	// The operator listener serves Prometheus metrics without a token;
	// their attributes are bounded: no id appears.
	resp, err := http.Get(d.AdminURL + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics = %d, %v; want 200", resp.StatusCode, err)
	}
	for _, want := range []string{"sandgate_reaper_passes_total", `sandgate_http_requests_total{code="",`, `route="POST /v1/workspaces"`} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("GET /metrics does not hold %s:\n%s", want, body)
		}
	}
	for _, id := range []string{ws.WorkspaceID, instID} {
		if bytes.Contains(body, []byte(id)) {
			t.Errorf("GET /metrics names %s", id)
		}
	}
}

// cliToken checks that a token command printed the token alone.
func cliToken(t *testing.T, out string) string {
	t.Helper()
	tok := strings.TrimSuffix(out, "\n")
	if !strings.HasPrefix(tok, "sgt_") || strings.ContainsAny(tok, " \t\n") {
		t.Fatalf("token command printed %q; want the sgt_ token alone", out)
	}
	return tok
}

func listed(l *protocol.WorkspaceList, id string) bool {
	for _, w := range l.Workspaces {
		if w.WorkspaceID == id {
			return true
		}
	}
	return false
}

func b64(t testing.TB, s string) string {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatalf("not base64: %v", err)
	}
	return string(b)
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// newAccountInstance creates, through gw's operator API, an account named
// name with one instance of maxConcurrent slots; it returns the operator
// client and the instance's id.
func newAccountInstance(t testing.TB, gw *serveBroker, name string, maxConcurrent int) (*adminapi.Client, string) {
	t.Helper()
	adm := gw.Admin(t)
	return adm, createInstance(t, adm, createAccount(t, adm, name), maxConcurrent)
}

// runScript runs cmd and returns its stdout and stderr; when it fails, the
// test stops with both, and with broker's answer when broker is not nil.
// what names the script in the failure.
func runScript(t *testing.T, what string, cmd *exec.Cmd, broker func() string) (stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		msg := fmt.Sprintf("%s: %v\nstdout:\n%s\nstderr:\n%s", what, err, out.String(), errOut.String())
		if broker != nil {
			msg += "\nbroker:\n" + broker()
		}
		t.Fatal(msg)
	}
	return out.String(), errOut.String()
}

// TestReadmeWalkthrough runs testdata/walkthrough.sh, the README's curl
// walk-through, with the real curl against a dev broker, from the working
// directory where `sandgate dev` keeps .sandgate/dev.env. It also checks
// that README.md still shows exactly the commands of the script.
func TestReadmeWalkthrough(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "curl", "sed", "date"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the walk-through needs %s: %v", tool, err)
		}
	}
	script, err := filepath.Abs("testdata/walkthrough.sh")
	if err != nil {
		t.Fatal(err)
	}
	checkReadmeWalkthrough(t, script)

	d := startDev(t)
	cmd := exec.Command("bash", script)
	cmd.Dir = d.workDir
	cmd.Env = cleanEnv()
	out, stderr := runScript(t, "walkthrough.sh", cmd, nil)
	for _, want := range []string{
		`"lease":{"id":"lse_`,             // 1. GET /v1/lease
		`"state":"active"`,                // 1.
		`"admission":{"state":"open"}`,    // 1.
		"workspace: ws_",                  // 2. POST /v1/workspaces
		`"exit_code":0`,                   // 3. exec echo hi
		`"stdout_b64":"aGkK"`,             // 3. "hi\n"
		`"contents_b64":"aGVsbG8K"`,       // 4. the file read back: "hello\n"
		`"state":"terminated"`,            // 5. DELETE
		`"termination_reason":"released"`, // 5.
		`"metered_seconds":`,              // 5.
	} {
		if !strings.Contains(out, want) {
			t.Errorf("walkthrough.sh output lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("walkthrough.sh output:\n%s\nstderr:\n%s", out, stderr)
	}
	live, err := d.Client(t, "").ListWorkspaces(context.Background(), "live", "", 0)
	if err != nil || len(live.Workspaces) != 0 {
		t.Fatalf("after the walk-through, live workspaces = %v, %v; want none", live, err)
	}
}

// checkReadmeWalkthrough fails the test unless README.md's "Walk-through
// with curl" block is the script's text below its `set -euo pipefail` line.
func checkReadmeWalkthrough(t *testing.T, script string) {
	t.Helper()
	b, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(b), "set -euo pipefail\n\n")
	if !ok {
		t.Fatalf("%s: no `set -euo pipefail` line followed by a blank line", script)
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	_, section, _ := strings.Cut(string(readme), "## Walk-through with curl")
	_, block, _ := strings.Cut(section, "```sh\n")
	block, _, _ = strings.Cut(block, "```")
	if block != body {
		t.Errorf("README.md's walk-through differs from testdata/walkthrough.sh; keep them identical.\nREADME:\n%s\nscript:\n%s", block, body)
	}
}

// TestServeRefusesPlaintext: serve without a certificate and without
// trusted proxies must refuse to start, saying why.
func TestServeRefusesPlaintext(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "plain.yaml")
	yaml := "listen: \"127.0.0.1:0\"\nadmin_listen: \"127.0.0.1:0\"\ndata_dir: " + quote(filepath.Join(dir, "data")) +
		"\nredis:\n  addr: \"127.0.0.1:1\"\n"
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := tryCLI(nil, "serve", "--config", cfg)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("serve without TLS = %v; want a non-zero exit\nstdout: %s\nstderr: %s", err, stdout, stderr)
	}
	if msg := strings.ToLower(stderr); !strings.Contains(msg, "tls") || !strings.Contains(msg, "plaintext") {
		t.Fatalf("serve without TLS said %q; want a message naming TLS and plaintext", stderr)
	}
}

// TestServeRefusesAnotherDataDir: two `sandgate serve` configs on one Redis
// with different data directories. The first to start owns the store's
// local workspaces; the other refuses to start, saying why, whether or not
// workspaces are live, while another process on the first's data directory
// starts and serves the first's workspaces.
func TestServeRefusesAnotherDataDir(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rs := startRedis(t)
	cfgA, cfgB := newServeConfig(t, rs.Addr, serveOptions{}), newServeConfig(t, rs.Addr, serveOptions{})
	gwA := startServe(t, cfgA)
	adm := gwA.Admin(t)
	tok := issueToken(t, adm, createInstance(t, adm, createAccount(t, adm, "e2e-datadir"), 2))
	ws := acquire(t, gwA.Client(t, tok), "datadir-1")

	refused := func(live string) {
		t.Helper()
		stdout, stderr, err := tryCLI(cfgB.env, "serve", "--config", cfgB.Path)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() == 0 {
			t.Fatalf("serve with another data dir = %v; want a non-zero exit\nstdout: %s\nstderr: %s", err, stdout, stderr)
		}
		for _, want := range []string{"refusing to start", filepath.Join(cfgA.DataDir, "local"), filepath.Join(cfgB.DataDir, "local"),
			live + " workspaces live", "410 workspace_gone", "sg:datadir:local"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("serve with another data dir said %q; want it to name %q", stderr, want)
			}
		}
	}
	refused("1")

	// Another process on the first's data directory is welcome.
	gwA2 := startServe(t, cfgA)
	if got, err := gwA2.Client(t, tok).Workspace(ctx, ws.WorkspaceID); err != nil || got.State != "running" {
		t.Fatalf("workspace through the second process on the same data dir = %+v, %v; want running", got, err)
	}
	if _, err := gwA2.Client(t, tok).Release(ctx, ws.WorkspaceID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// Still refused once nothing is live: the claim is the operator's to lift.
	refused("0")
}

func quote(s string) string {
	b, _ := json.Marshal(s) // a JSON string is a valid YAML double-quoted scalar
	return string(b)
}

// TestCrossInstance404: an id owned by another instance, of the same account
// or another one, answers exactly like an unknown id (spec §Trust model).
func TestCrossInstance404(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, cfg, s := startOne(t)
	adm := s.Admin(t)
	acct := createAccount(t, adm, "e2e-cross")
	instA := createInstance(t, adm, acct, 2)
	instB := createInstance(t, adm, acct, 2)
	instC := createInstance(t, adm, createAccount(t, adm, "e2e-cross-other"), 2)
	tokA, tokB, tokC := issueToken(t, adm, instA), issueToken(t, adm, instB), issueToken(t, adm, instC)

	ca := s.Client(t, tokA)
	ws := acquire(t, ca, "cross-a")
	if err := ca.WriteFile(ctx, ws.WorkspaceID, "/workspace/a.txt", []byte("instance A's")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	// A workspace of B's own, so that B's token is proven to work.
	wsB := acquire(t, s.Client(t, tokB), "cross-b")

	hc := httpsClient(cfg.PKI.Roots)
	unknown := sandgate.NewID(sandgate.PrefixWorkspace)
	type probe struct {
		name, method, suffix string
		body                 any
	}
	probes := []probe{
		{"GET", http.MethodGet, "", nil},
		{"exec", http.MethodPost, "/exec", protocol.ExecRequest{Argv: []string{"touch", "/workspace/pwned"}}},
		{"files/read", http.MethodPost, "/files/read", protocol.ReadFileRequest{Path: "/workspace/a.txt"}},
		{"files/write", http.MethodPost, "/files/write", protocol.WriteFileRequest{Path: "/workspace/a.txt", ContentsB64: base64.StdEncoding.EncodeToString([]byte("pwned"))}},
		{"DELETE", http.MethodDelete, "", nil},
	}
	for _, other := range []struct{ name, tok string }{{"same account", tokB}, {"other account", tokC}} {
		for _, p := range probes {
			wantStatus, wantBody := rawCall(t, hc, p.method, s.URL+"/v1/workspaces/"+unknown+p.suffix, other.tok, p.body)
			status, body := rawCall(t, hc, p.method, s.URL+"/v1/workspaces/"+ws.WorkspaceID+p.suffix, other.tok, p.body)
			if wantStatus != http.StatusNotFound || !bytes.Contains(wantBody, []byte(`"code":"not_found"`)) {
				t.Errorf("%s %s of an unknown id = %d %s; want 404 not_found", other.name, p.name, wantStatus, wantBody)
			}
			if status != wantStatus || !bytes.Equal(body, wantBody) {
				t.Errorf("%s %s of A's workspace = %d %s; want exactly the unknown id's %d %s",
					other.name, p.name, status, body, wantStatus, wantBody)
			}
		}
	}

	// Nothing the other instances sent reached A's workspace.
	got, err := ca.Workspace(ctx, ws.WorkspaceID)
	if err != nil || got.State != "running" {
		t.Fatalf("A's workspace after the probes = %+v, %v; want running", got, err)
	}
	if b, err := ca.ReadFile(ctx, ws.WorkspaceID, "/workspace/a.txt"); err != nil || string(b) != "instance A's" {
		t.Fatalf("A's file after the probes = %q, %v; want it unchanged", b, err)
	}
	if _, err := ca.ReadFile(ctx, ws.WorkspaceID, "/workspace/pwned"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("A's workspace has /workspace/pwned (%v); the foreign exec ran", err)
	}
	// And the other way round: A cannot see B's workspace either.
	_, err = ca.Workspace(ctx, wsB.WorkspaceID)
	wantCode(t, "A reading B's workspace", err, http.StatusNotFound, protocol.NotFound)
	if _, err := ca.Release(ctx, ws.WorkspaceID); err != nil {
		t.Fatalf("Release A: %v", err)
	}
	if _, err := s.Client(t, tokB).Release(ctx, wsB.WorkspaceID); err != nil {
		t.Fatalf("Release B: %v", err)
	}
}

// TestWorkspacesSurviveRestart: a gateway killed outright loses nothing;
// a new one over the same Redis and data_dir serves the same workspace.
func TestWorkspacesSurviveRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, cfg, s1 := startOne(t)
	adm, inst := newAccountInstance(t, s1, "e2e-restart", 2)
	tok := issueToken(t, adm, inst)
	c1 := s1.Client(t, tok)
	ws := acquire(t, c1, "restart-1")
	if err := c1.WriteFile(ctx, ws.WorkspaceID, "/workspace/keep/me.txt", []byte("survives\n")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}

	// An exec in flight when the gateway dies: its sandbox must die with
	// the gateway (the harness checks every process that descended from
	// it), and its client learns that the outcome is unknown.
	execErr := make(chan error, 1)
	go func() {
		_, err := c1.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"sleep", "300"}, TimeoutSeconds: 600})
		execErr <- err
	}()
	waitFor(t, "the exec's sandbox to start", func() (bool, error) {
		return len(sleepers(s1)) > 0, nil
	})
	s1.kill()
	if err := <-execErr; !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("Exec cut by the gateway's death = %v; want ErrOutcomeUnknown", err)
	}
	s1.checkNoSandboxesLeft()

	s2 := startServe(t, cfg)
	c2 := s2.Client(t, tok)
	b, err := c2.ReadFile(ctx, ws.WorkspaceID, "/workspace/keep/me.txt")
	if err != nil || string(b) != "survives\n" {
		t.Fatalf("ReadFile after restart = %q, %v; want %q", b, err, "survives\n")
	}
	res, err := c2.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"cat", "keep/me.txt"}, Dir: "/workspace"})
	if err != nil || res.ExitCode != 0 || b64(t, res.StdoutB64) != "survives\n" {
		t.Fatalf("Exec after restart = %+v, %v; want cat to print the file", res, err)
	}
	got, err := c2.Workspace(ctx, ws.WorkspaceID)
	if err != nil || got.State != "running" || got.WorkspaceID != ws.WorkspaceID {
		t.Fatalf("Workspace after restart = %+v, %v; want the same running workspace", got, err)
	}
	rel, err := c2.Release(ctx, ws.WorkspaceID)
	if err != nil || rel == nil || rel.State != "terminated" {
		t.Fatalf("Release after restart = %+v, %v; want terminated", rel, err)
	}
}
