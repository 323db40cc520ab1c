package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/protocol"
)

// TestProtocolAnswers runs `sandgate dev` and checks the answers no
// other test looked at, as a client and an operator see them: a DELETE
// with a trailing slash is never 404 not_found (which the client reads as
// a successful release) and leaves the workspace running; a wrong method
// is 405 with Allow; a missing program exits 127 with a shell's line; the
// operator listener answers an unclean path with the envelope, never Go's
// 307 redirect, and leads / to the console.
func TestProtocolAnswers(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	c := d.Client(t, d.Token)
	ctx := context.Background()
	ws, _, err := c.Acquire(ctx, "answers", protocol.AcquireRequest{Label: "answers", Egress: &protocol.Egress{AllowedDomains: []string{}}})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	hc := httpsClient(d.Roots)

	status, body := rawCall(t, hc, http.MethodDelete, d.URL+"/v1/workspaces/"+ws.WorkspaceID+"/", d.Token, nil)
	if env := envelopeOf(t, body); status == http.StatusNotFound || env.Error.Code == protocol.NotFound || status < 400 {
		t.Errorf("DELETE with a trailing slash: %d %s; want an error that is not 404 not_found", status, body)
	}
	if got, err := c.Workspace(ctx, ws.WorkspaceID); err != nil || got.State != "running" {
		t.Errorf("after DELETE with a trailing slash: %+v, %v; want running", got, err)
	}

	req, _ := http.NewRequest(http.MethodPost, d.URL+"/v1/lease", nil)
	req.Header.Set("Authorization", "Bearer "+d.Token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET" {
		t.Errorf("POST /v1/lease: %d, Allow %q; want 405, GET", resp.StatusCode, resp.Header.Get("Allow"))
	}

	res, err := c.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"nosuchprog"}})
	if err != nil {
		t.Fatalf("exec of a missing program: %v", err)
	}
	stderr, _ := base64.StdEncoding.DecodeString(res.StderrB64)
	if res.ExitCode != 127 || string(stderr) != "nosuchprog: command not found\n" {
		t.Errorf("exec of a missing program: exit %d, stderr %q; want 127, %q", res.ExitCode, stderr, "nosuchprog: command not found\n")
	}

	// A write below a dangling symlink: a parent that is not a directory,
	// refused for good (422), never a retryable 502.
	if res, err := c.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"ln", "-s", "/nowhere", "/workspace/dangling"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("make a dangling symlink: %+v, %v", res, err)
	}
	err = c.WriteFile(ctx, ws.WorkspaceID, "/workspace/dangling/f.txt", []byte("x"))
	wantCode(t, "files/write below a dangling symlink", err, http.StatusUnprocessableEntity, protocol.NotAFile)

	status, body = rawCall(t, hc, http.MethodGet, d.AdminURL+"/admin/v1/workspaces/../accounts", d.AdminToken, nil)
	if status >= 300 && status < 400 || envelopeOf(t, body).Error.Code == "" {
		t.Errorf("operator GET /admin/v1/workspaces/../accounts: %d %s; want the envelope, no redirect", status, body)
	}
	req, _ = http.NewRequest(http.MethodGet, d.AdminURL+"/", nil)
	resp, err = hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "/console/" {
		t.Errorf("operator GET /: %d, Location %q; want 303 to /console/", resp.StatusCode, loc)
	}
}

// envelopeOf decodes an error envelope; a body that is not one yields
// the zero envelope.
func envelopeOf(t testing.TB, body []byte) protocol.Envelope {
	t.Helper()
	var env protocol.Envelope
	if err := json.Unmarshal(body, &env); err != nil && !strings.HasPrefix(string(body), "<") {
		t.Logf("body is not JSON: %q", body)
	}
	return env
}
