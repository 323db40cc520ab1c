package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/protocol"
)

// TestAdminWorkspaceCLI: a workspace acquired through the protocol is
// listed by `sandgate admin workspace list`, shown by `get`, and ended by
// `kill`, after which the protocol answers 410 workspace_gone for it.
func TestAdminWorkspaceCLI(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	c := d.Client(t, "")
	ws := acquire(t, c, "cli-kill-"+randHex(8))
	env := d.AdminEnv()

	out := runCLI(t, env, "admin", "workspace", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ID ") || !strings.Contains(lines[0], "AMOUNT") ||
		!strings.HasPrefix(lines[1], ws.WorkspaceID+" ") || !strings.Contains(lines[1], " running ") {
		t.Fatalf("workspace list =\n%s\nwant a header and %s running", out, ws.WorkspaceID)
	}
	var got adminapi.Workspace
	if err := json.Unmarshal([]byte(runCLI(t, env, "admin", "workspace", "get", ws.WorkspaceID, "-o", "json")), &got); err != nil {
		t.Fatal(err)
	}
	if got.ID != ws.WorkspaceID || got.State != "running" || got.Provider != "local" || got.Currency != "USD" {
		t.Fatalf("workspace get = %+v; want it running on local, priced in USD", got)
	}

	if out := runCLI(t, env, "admin", "workspace", "kill", ws.WorkspaceID); out != "terminated emergency_stopped\n" {
		t.Fatalf("workspace kill = %q; want \"terminated emergency_stopped\\n\"", out)
	}
	_, err := c.Exec(context.Background(), ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"true"}})
	wantCode(t, "exec after the kill", err, 410, protocol.WorkspaceGone)
	st, err := c.Workspace(context.Background(), ws.WorkspaceID)
	if err != nil || st.State != "terminated" || st.TerminationReason == nil || *st.TerminationReason != "emergency_stopped" {
		t.Fatalf("status after the kill = %+v, %v; want terminated, emergency_stopped", st, err)
	}
	if out := runCLI(t, env, "admin", "workspace", "list"); strings.Contains(out, ws.WorkspaceID) {
		t.Errorf("workspace list after the kill =\n%s\nwant no %s", out, ws.WorkspaceID)
	}
	if _, stderr, err := tryCLI(env, "admin", "workspace", "kill", "ws_nope"); err == nil || !strings.Contains(stderr, "404 not_found") {
		t.Errorf("kill ws_nope = %v, %q; want a non-zero exit saying 404 not_found", err, stderr)
	}
}
