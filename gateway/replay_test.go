package gateway_test

import (
	"net/http"
	"testing"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
)

// TestReplayBeforeRefusals: a replay of a completed Acquire answers the
// workspace it created (200, the same workspace) whatever would refuse a
// new request now, refused in Go before the admission script (the
// broker-wide stop) or by the script (the instance at its concurrency
// limit), as if the Idempotency-Key were looked up first (spec
// §Idempotency); a new key is refused as before.
func TestReplayBeforeRefusals(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	op := newOperator(t, h)
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxConcurrentWorkspaces: 1}})
	first := acquire(t, h, in.Token, "replay-1")
	replay := func(label string) {
		t.Helper()
		var again protocol.Workspace
		wantOK(t, label, do(t, h, acquireReq(in.Token, "replay-1", acquireBody("test"))), http.StatusOK, &again)
		if again.WorkspaceID != first.WorkspaceID || again.State != first.State {
			t.Errorf("%s: workspace %s %s; want %s %s", label, again.WorkspaceID, again.State, first.WorkspaceID, first.State)
		}
	}

	// The instance is full: the script answers the replay from its claim
	// check, ahead of the concurrency check.
	wantError(t, "new key at the limit", do(t, h, acquireReq(in.Token, "replay-2", acquireBody("test"))),
		http.StatusTooManyRequests, protocol.ConcurrencyLimit)
	replay("replay at the limit")

	// Stopped: the stop refuses before the script runs; the key is looked
	// up then, and answers.
	op.do(t, http.MethodPost, "/stop", adminapi.StopRequest{On: new(true), Reason: "incident"}, nil)
	wantRefused(t, "new key while stopped", do(t, h, acquireReq(in.Token, "replay-3", acquireBody("test"))),
		http.StatusForbidden, protocol.EmergencyStopped, "incident", "")
	var again protocol.Workspace
	wantOK(t, "replay while stopped", do(t, h, acquireReq(in.Token, "replay-1", acquireBody("test"))), http.StatusOK, &again)
	if again.WorkspaceID != first.WorkspaceID {
		t.Errorf("replay while stopped: workspace %s; want %s", again.WorkspaceID, first.WorkspaceID)
	}
	if n := len(h.Provider.CreateSpecs()); n != 1 {
		t.Errorf("provider creates = %d; want 1", n)
	}
}
