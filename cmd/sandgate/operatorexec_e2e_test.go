package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/store"
)

// runCLIIn runs `sandgate args…` with stdin, returning its streams and
// exit code.
func runCLIIn(t testing.TB, env []string, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pollTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, sandgateBin, args...)
	cmd.Env = cleanEnv(env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), exitOf(t, err)
}

// TestOperatorWorkspaceExec: an admin operator runs a command in a
// tenant's workspace and reads and writes its files from the CLI; what
// the command and files hold is what the tenant sees; the command's exit
// code is sandgate's; another role is refused (exit 3); the audit log
// names the operator, the workspace and the action but never the argv,
// the path or the contents, and neither does the broker's log.
func TestOperatorWorkspaceExec(t *testing.T) {
	_, cfg, s := startOne(t)
	a := s.Admin(t)
	acct := createAccount(t, a, "operator-exec")
	tok := issueToken(t, a, createInstance(t, a, acct, 1))
	tenant := s.Client(t, tok)
	ws := acquire(t, tenant, "operator-exec-1")
	ctx := context.Background()
	env := s.AdminEnv()
	// Markers that must reach the sandbox and never the audit log or logs.
	const argvMark, pathMark, contentMark = "argv-secret-4d1f", "/workspace/path-secret-9c2e.txt", "content-secret-77ab"

	// exec: the streams land on sandgate's, and the exit code is the command's.
	stdout, stderr, code := runCLIIn(t, env, "", "workspace", "exec", ws.WorkspaceID, "--",
		"sh", "-c", "echo out-"+argvMark+"; echo err >&2; exit 7")
	if code != 7 || stdout != "out-"+argvMark+"\n" || stderr != "err\n" {
		t.Fatalf("workspace exec: exit %d, stdout %q, stderr %q; want 7, %q, %q", code, stdout, stderr, "out-"+argvMark+"\n", "err\n")
	}
	// stdin, and -o json for scripts (exit code 0 is success).
	stdout, stderr, code = runCLIIn(t, env, "from-stdin", "workspace", "exec", ws.WorkspaceID, "--stdin", "-", "-o", "json", "--", "cat")
	var res adminapi.ExecResponse
	if code != 0 || json.Unmarshal([]byte(stdout), &res) != nil {
		t.Fatalf("workspace exec -o json: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if got, _ := base64.StdEncoding.DecodeString(res.StdoutB64); res.ExitCode != 0 || string(got) != "from-stdin" {
		t.Errorf("workspace exec -o json: exit_code %d, stdout %q; want 0, %q", res.ExitCode, got, "from-stdin")
	}

	// files put from stdin, then the tenant reads it; files get of what
	// the tenant wrote, to stdout and to --out.
	if _, stderr, code := runCLIIn(t, env, contentMark, "workspace", "files", "put", ws.WorkspaceID, pathMark); code != 0 {
		t.Fatalf("files put: exit %d, stderr %q", code, stderr)
	}
	if got, err := tenant.ReadFile(ctx, ws.WorkspaceID, pathMark); err != nil || string(got) != contentMark {
		t.Fatalf("tenant read of the operator's file: %q, %v; want %q", got, err, contentMark)
	}
	if err := tenant.WriteFile(ctx, ws.WorkspaceID, "/workspace/tenant.txt", []byte("tenant\x00bytes")); err != nil {
		t.Fatal(err)
	}
	if stdout, stderr, code := runCLIIn(t, env, "", "workspace", "files", "get", ws.WorkspaceID, "/workspace/tenant.txt"); code != 0 || stdout != "tenant\x00bytes" {
		t.Fatalf("files get: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	outFile := filepath.Join(t.TempDir(), "got")
	runCLI(t, env, "admin", "workspace", "files", "get", ws.WorkspaceID, "/workspace/tenant.txt", "--out", outFile)
	if b, err := os.ReadFile(outFile); err != nil || string(b) != "tenant\x00bytes" {
		t.Fatalf("files get --out: %q, %v", b, err)
	}

	// Refusals: usage without --, an unknown workspace, a lesser role.
	if _, stderr, code := runCLIIn(t, env, "", "workspace", "exec", ws.WorkspaceID, "true"); code != exitUsage {
		t.Errorf("workspace exec without --: exit %d (stderr %q); want %d", code, stderr, exitUsage)
	}
	if _, stderr, code := runCLIIn(t, env, "", "workspace", "exec", "ws_nope", "--", "true"); code != exitRefused || !strings.Contains(stderr, "404") {
		t.Errorf("workspace exec of no workspace: exit %d (stderr %q); want %d and 404", code, stderr, exitRefused)
	}
	opEnv := []string{"SANDGATE_ADMIN_URL=" + s.AdminURL, "SANDGATE_ADMIN_TOKEN=" + cfg.OpToken}
	for _, args := range [][]string{
		{"workspace", "exec", ws.WorkspaceID, "--", "touch", "/workspace/by-operator-role"},
		{"workspace", "files", "get", ws.WorkspaceID, "/workspace/tenant.txt"},
		{"workspace", "files", "put", ws.WorkspaceID, "/workspace/by-operator-role"},
	} {
		stdout, stderr, code := runCLIIn(t, opEnv, "x", args...)
		if code != exitRefused || !strings.Contains(stderr, "403 forbidden") || stdout != "" {
			t.Errorf("sandgate %s with an operator-role token: exit %d, stdout %q, stderr %q; want %d and 403 forbidden",
				strings.Join(args, " "), code, stdout, stderr, exitRefused)
		}
	}
	if _, err := tenant.ReadFile(ctx, ws.WorkspaceID, "/workspace/by-operator-role"); err == nil {
		t.Error("an operator-role token's refused exec or write still made its file")
	}

	// The audit log: who, which workspace, which operation, the outcome.
	var audit bytes.Buffer
	if err := a.Stream(ctx, "/audit", &audit); err != nil {
		t.Fatal(err)
	}
	type seen struct{ ok, forbidden int }
	got := map[string]*seen{}
	sc := bufio.NewScanner(bytes.NewReader(audit.Bytes()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e store.AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		if !strings.HasPrefix(e.Action, "workspace.") || e.Target != "workspace:"+ws.WorkspaceID {
			continue
		}
		if got[e.Action] == nil {
			got[e.Action] = &seen{}
		}
		switch {
		case e.Outcome.Status < 300 && strings.HasPrefix(e.Actor, "e2e-admin") && e.Role == "admin":
			got[e.Action].ok++
		case e.Outcome.Status == 403 && e.Actor == "e2e-operator" && e.Role == "operator":
			got[e.Action].forbidden++
		}
	}
	for action, want := range map[string]seen{
		"workspace.exec":        {ok: 2, forbidden: 1},
		"workspace.files.write": {ok: 1, forbidden: 1},
		"workspace.files.read":  {ok: 2, forbidden: 1},
	} {
		if g := got[action]; g == nil || *g != want {
			t.Errorf("audit of %s on %s: %+v; want %+v", action, ws.WorkspaceID, g, want)
		}
	}
	for _, secret := range []string{argvMark, pathMark, contentMark, "path-secret", "from-stdin"} {
		if strings.Contains(audit.String(), secret) {
			t.Errorf("the audit log holds %q", secret)
		}
		if strings.Contains(s.Logs(), secret) {
			t.Errorf("the broker's log holds %q", secret)
		}
	}
}
