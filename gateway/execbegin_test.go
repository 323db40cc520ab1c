package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/protocol"
)

// TestExecRefusalsMarkNothing: an exec reads its body before its one
// round trip reads the workspace and marks it busy, yet answers in the
// order of every workspace route (404, then 410, then the body's 400), and
// an exec its body refuses neither marks the workspace busy nor counts as
// its activity.
func TestExecRefusalsMarkNothing(t *testing.T) {
	e := rtStart(t, rtOptions{})
	id := e.acquire(t)
	before, err := e.db.Workspace(context.Background(), e.inst.AccountID, id)
	if err != nil {
		t.Fatal(err)
	}
	gone := e.acquire(t)
	e.mustDo(t, http.MethodDelete, "/v1/workspaces/"+gone, "", nil, http.StatusOK)
	for _, tt := range []struct {
		name, id, body string
		status         int
		code           protocol.Code
	}{
		{"unknown workspace, bad body", sandgate.NewID(sandgate.PrefixWorkspace), `{"argv":[]}`, http.StatusNotFound, protocol.NotFound},
		{"invalid id, bad body", "ws_no!", `{"argv":[]}`, http.StatusBadRequest, protocol.InvalidRequest},
		{"released workspace, bad body", gone, `{"argv":["true"],"timeout_seconds":-1}`, http.StatusGone, protocol.WorkspaceGone},
		{"empty argv", id, `{"argv":[]}`, http.StatusBadRequest, protocol.InvalidRequest},
		{"negative timeout", id, `{"argv":["true"],"timeout_seconds":-1}`, http.StatusBadRequest, protocol.InvalidRequest},
		{"not JSON", id, `{"argv":`, http.StatusBadRequest, protocol.InvalidRequest},
	} {
		got, b := e.do(t, http.MethodPost, "/v1/workspaces/"+tt.id+"/exec", tt.body, nil)
		var env protocol.Envelope
		_ = json.Unmarshal(b, &env)
		if got != tt.status || env.Error.Code != tt.code {
			t.Errorf("%s: exec = %d %q; want %d %q", tt.name, got, env.Error.Code, tt.status, tt.code)
		}
	}
	after, err := e.db.Workspace(context.Background(), e.inst.AccountID, id)
	if err != nil || !after.BusyUntil.IsZero() || !after.LastActivity.Equal(before.LastActivity) {
		t.Errorf("after refused execs: busy until %v, last activity %v (%v); want not busy, %v", after.BusyUntil, after.LastActivity, err, before.LastActivity)
	}
	if r := e.exec(t, id, "true"); r.ExitCode != 0 {
		t.Errorf("exec after the refusals: exit code %d; want 0", r.ExitCode)
	}
}
