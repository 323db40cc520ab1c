package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
)

// TestNoRouteIsNeverNotFound checks that a request no route serves is
// never 404 not_found, which the client reads as success for Release and
// DeleteSnapshot: a wrong method is 405 with Allow, any other path
// (a trailing slash included) 400 invalid_request, and the workspace a
// DELETE with a trailing slash names keeps running.
func TestNoRouteIsNeverNotFound(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{})
	ws := acquire(t, h, in.Token, "route-ws")

	for _, tc := range []struct {
		r     request
		allow string // "" for an unknown path
	}{
		{r: request{Method: http.MethodPost, Path: "/v1/lease"}, allow: "GET"},
		{r: request{Method: http.MethodPatch, Path: wsPath(ws.WorkspaceID)}, allow: "GET, DELETE"},
		{r: request{Method: http.MethodGet, Path: wsPath(ws.WorkspaceID, "/exec")}, allow: "POST"},
		{r: request{Method: http.MethodDelete, Path: "/v1/workspaces"}, allow: "POST, GET"},
		{r: request{Method: http.MethodPost, Path: "/v1/snapshots/snap_x"}, allow: "DELETE"},
		{r: request{Method: http.MethodDelete, Path: wsPath(ws.WorkspaceID) + "/"}},
		{r: request{Method: http.MethodDelete, Path: "/v1/snapshots/snap_x/"}},
		{r: request{Method: http.MethodDelete, Path: "/v1/workspaces//"}},
		{r: request{Method: http.MethodGet, Path: "/v1/nope"}},
		{r: request{Method: http.MethodGet, Path: "/"}},
	} {
		r := tc.r
		r.Token = in.Token
		rep := do(t, h, r)
		if tc.allow == "" {
			wantError(t, what(r), rep, http.StatusBadRequest, protocol.InvalidRequest)
			continue
		}
		wantError(t, what(r), rep, http.StatusMethodNotAllowed, protocol.InvalidRequest)
		if got := rep.Header.Get("Allow"); got != tc.allow {
			t.Errorf("%s: Allow = %q; want %q", what(r), got, tc.allow)
		}
	}
	if got := getWorkspace(t, h, in.Token, ws.WorkspaceID); got.State != "running" {
		t.Errorf("after DELETE with a trailing slash: state = %q; want running", got.State)
	}
	// The route's own resources still answer not_found.
	wantError(t, "DELETE of an unknown workspace", do(t, h, request{Method: http.MethodDelete, Path: wsPath("ws_doesnotexist"), Token: in.Token}),
		http.StatusNotFound, protocol.NotFound)
}

// TestJSONCharset checks that every JSON answer, success or error, says
// application/json; charset=utf-8 (spec §Conventions).
func TestJSONCharset(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{})
	ws := acquire(t, h, in.Token, "charset-ws")
	for _, r := range []request{
		{Method: http.MethodGet, Path: "/v1/lease", Token: in.Token},
		{Method: http.MethodGet, Path: wsPath(ws.WorkspaceID), Token: in.Token},
		{Method: http.MethodGet, Path: "/v1/workspaces", Token: in.Token},
		{Method: http.MethodPost, Path: wsPath(ws.WorkspaceID, "/exec"), Token: in.Token, Body: `{"argv":["true"]}`},
		{Method: http.MethodGet, Path: wsPath("ws_doesnotexist"), Token: in.Token},
		{Method: http.MethodGet, Path: "/v1/lease"},
		{Method: http.MethodDelete, Path: wsPath(ws.WorkspaceID), Token: in.Token},
	} {
		rep := do(t, h, r)
		if got, want := rep.Header.Get("Content-Type"), "application/json; charset=utf-8"; got != want {
			t.Errorf("%s (%d): Content-Type = %q; want %q", what(r), rep.Status, got, want)
		}
	}
}

// TestEmptySizeRefused checks that "size": "" (and "image": "",
// "snapshot_id": "") is refused, never silently resolved to the default
// (spec §Acquire), and consumes no key: the same key then acquires.
func TestEmptySizeRefused(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{})
	for _, field := range []string{"size", "image", "snapshot_id"} {
		body := `{"label":"empty","egress":{"allowed_domains":[]},"` + field + `":""}`
		rep := do(t, h, acquireReq(in.Token, "empty-"+field, body))
		wantError(t, field+` ""`, rep, http.StatusBadRequest, protocol.InvalidRequest)
	}
	if n := len(listAll(t, h, in.Token)); n != 0 {
		t.Errorf("workspaces after the refusals = %d; want 0", n)
	}
	wantOK(t, "the same key, size omitted", do(t, h, acquireReq(in.Token, "empty-size", acquireBody("empty"))), http.StatusCreated, nil)
}

// TestAcquireRacingStop checks that an Acquire whose workspace a pause or
// a stop ends while its create runs answers the refusal the pause or stop
// gives, never 201 with state terminated, and that its Idempotency-Key
// does not replay that dead workspace: once admission is open again, the
// same key creates a workspace that runs.
func TestAcquireRacingStop(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		on, off       string
		onBody, offBy func(in sgtest.Instance) any
		code          protocol.Code
		reason        string
	}{
		{name: "pause", on: "/pause", off: "/resume", code: protocol.Paused, reason: "instance_paused",
			onBody: func(in sgtest.Instance) any { return adminapi.PauseRequest{InstanceID: in.ID} },
			offBy:  func(in sgtest.Instance) any { return adminapi.ResumeRequest{InstanceID: in.ID} }},
		{name: "stop", on: "/stop", off: "/stop", code: protocol.EmergencyStopped, reason: "incident",
			onBody: func(in sgtest.Instance) any {
				return adminapi.StopRequest{On: new(true), AccountID: in.AccountID, Reason: "incident"}
			},
			offBy: func(in sgtest.Instance) any { return adminapi.StopRequest{On: new(false), AccountID: in.AccountID} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := sgtest.New(t, sgtest.Options{})
			op := newOperator(t, h)
			in := h.NewInstance(adminapi.Scope{})
			r := acquireReq(in.Token, "racing", acquireBody("racing"))
			g, id, first := startBlockedAcquire(t, h, "acquire", r)

			op.do(t, http.MethodPost, tc.on, tc.onBody(in), nil)
			g.open()
			wantRefused(t, "acquire ended by the "+tc.name, <-first, http.StatusForbidden, tc.code, tc.reason, "")
			if n := h.Provider.Live(); n != 0 {
				t.Errorf("provider sandboxes after the %s = %d; want 0", tc.name, n)
			}
			h.Provider.OnCreate(nil)
			op.do(t, http.MethodPost, tc.off, tc.offBy(in), nil)
			var ws protocol.Workspace
			wantOK(t, "the same key after the "+tc.name, do(t, h, r), http.StatusCreated, &ws)
			if ws.WorkspaceID == id || ws.State != "running" {
				t.Errorf("the same key after the %s: id, state = %q, %q; want a new workspace, running", tc.name, ws.WorkspaceID, ws.State)
			}
		})
	}
}

// TestSnapshotTooLargeForSize checks that a warm start from a snapshot
// taken in a size with more disk than the requested one answers 410
// snapshot_gone, which the client follows to a cold start, before
// anything is created (real bwrap: the local provider's tiers), and that
// the same snapshot still restores into its own size.
func TestSnapshotTooLargeForSize(t *testing.T) {
	t.Parallel()
	e := snapStart(t, snapLocal(t), nil)
	ctx := context.Background()
	large := func(snapshot string) protocol.AcquireRequest {
		r := snapAcquireReq(snapshot)
		r.Size = "large"
		return r
	}
	src, _, err := e.cl.Acquire(ctx, "src", large(""))
	if err != nil {
		t.Fatalf("acquire large: %v", err)
	}
	e.exec(src.WorkspaceID, "sh", "-c", "mkdir -p /workspace/p && echo hi >/workspace/p/f")
	snap, _, err := e.snapshot(src.WorkspaceID, "snap", "/workspace/p")
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	list := func() int {
		l, err := e.cl.ListWorkspaces(ctx, "all", "", 100)
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		return len(l.Workspaces)
	}
	before := list()
	for i := range 2 {
		small := snapAcquireReq(snap.SnapshotID)
		small.Size = "small"
		_, _, err := e.cl.Acquire(ctx, fmt.Sprintf("small-%d", i), small)
		if got := snapErrCode(err); got != protocol.SnapshotGone {
			t.Errorf("warm start of small from a large snapshot: %v (code %q); want 410 snapshot_gone", err, got)
		}
	}
	if after := list(); after != before {
		t.Errorf("workspaces after the refused warm starts = %d; want %d (nothing created)", after, before)
	}
	ws, _, err := e.cl.Acquire(ctx, "large-warm", large(snap.SnapshotID))
	if err != nil {
		t.Fatalf("warm start of large: %v", err)
	}
	if out := e.exec(ws.WorkspaceID, "cat", "/workspace/p/f"); snapB64d(out.StdoutB64) != "hi\n" {
		t.Errorf("restored file = %q; want %q", snapB64d(out.StdoutB64), "hi\n")
	}
}

// TestOperatorSecondsOverflow checks that an operator API *_seconds
// field too large for the broker's durations is refused with 400 naming
// the field, never wrapped around (snapshot_ttl_seconds 18446744075 was
// stored as 1 s), and that nothing is created.
func TestOperatorSecondsOverflow(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	op := newOperator(t, h)
	acct := h.NewAccount()
	for field, lim := range map[string]protocol.Limits{
		"snapshot_ttl_seconds": {SnapshotTTLSeconds: 18446744075},
		"max_lifetime_seconds": {MaxLifetimeSeconds: 1 << 62},
		"idle_timeout_seconds": {IdleTimeoutSeconds: 9223372037},
	} {
		err := op.c.Do(context.Background(), http.MethodPost, "/instances",
			adminapi.CreateInstanceRequest{AccountID: acct, Name: "overflow", Scope: adminapi.Scope{Limits: lim}}, nil)
		var ae *adminapi.APIError
		if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Code != protocol.InvalidRequest || !strings.Contains(ae.Message, field) {
			t.Errorf("create an instance with %s overflowing: %v; want 400 invalid_request naming the field", field, err)
		}
	}
	in := h.NewInstanceIn(acct, adminapi.Scope{})
	err := op.c.Do(context.Background(), http.MethodPost, "/instances/"+in.ID+"/tokens", adminapi.IssueTokenRequest{TTLSeconds: 1 << 62}, nil)
	var ae *adminapi.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || !strings.Contains(ae.Message, "ttl_seconds") {
		t.Errorf("issue a token with ttl_seconds overflowing: %v; want 400 naming the field", err)
	}
}
