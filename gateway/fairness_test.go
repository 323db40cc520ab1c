package gateway_test

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
)

// stalledExec sends an exec to path whose body declares n bytes and never
// sends them, until the returned stop is called. Its reply (status 0: the
// transport failed) arrives on the channel.
func stalledExec(t *testing.T, h *sgtest.Harness, tok sandgate.Secret, path string, n int64) (<-chan reply, func()) {
	t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, h.URL()+path, pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = n
	req.Header.Set("Authorization", "Bearer "+tok.Reveal())
	req.Header.Set("Content-Type", "application/json")
	out := make(chan reply, 1)
	go func() {
		resp, err := h.HTTPClient().Do(req)
		if err != nil {
			out <- reply{}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		out <- reply{Status: resp.StatusCode, Header: resp.Header, Body: b}
	}()
	stop := func() { pw.CloseWithError(errors.New("the client gave up")) }
	t.Cleanup(stop)
	return out, stop
}

// answer waits for a stalled request's reply, failing the test when none
// comes: the answer must not wait for the body.
func answer(t *testing.T, what string, got <-chan reply) reply {
	t.Helper()
	select {
	case rep := <-got:
		return rep
	case <-time.After(time.Minute):
		t.Fatalf("%s: no answer while its body is not sent; want one at once", what)
		return reply{}
	}
}

// execOf is a small exec of workspace id by tok.
func execOf(tok sandgate.Secret, id string) request {
	return request{Method: http.MethodPost, Path: wsPath(id, "/exec"), Token: tok, Body: `{"argv":["true"]}`}
}

// TestInflightSlowBodiesFair: the slow-body attack. Execs that
// declare 12 MiB (and 6 MiB) bodies and never send them reserve nothing
// when their workspace does not exist, and, against a workspace of
// instance A, hold no more than A's share: A's own further requests are
// refused with 429 rate_limited, while instance B's exec and file read
// answer 200.
func TestInflightSlowBodiesFair(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{Gateway: gateway.Config{BodyReadTimeout: time.Hour}})
	a := h.NewInstance(adminapi.Scope{})
	b := h.NewInstance(adminapi.Scope{})
	wsA := acquire(t, h, a.Token, "fair-a")
	wsB := acquire(t, h, b.Token, "fair-b")
	sizes := []int64{12 << 20, 12 << 20, 12 << 20, 12 << 20, 6 << 20}

	// A workspace that does not exist: 404 at once, nothing reserved.
	for _, n := range sizes {
		got, _ := stalledExec(t, h, a.Token, wsPath("ws_doesnotexist", "/exec"), n)
		wantError(t, "stalled exec of ws_doesnotexist", answer(t, "stalled exec of ws_doesnotexist", got), http.StatusNotFound, protocol.NotFound)
	}
	// Another instance's workspace: the same.
	got, _ := stalledExec(t, h, a.Token, wsPath(wsB.WorkspaceID, "/exec"), 12<<20)
	wantError(t, "stalled exec of another instance's workspace", answer(t, "stalled exec of another instance's workspace", got),
		http.StatusNotFound, protocol.NotFound)
	if st := h.Gateway.InflightStats(); st != (gateway.InflightStats{}) {
		t.Fatalf("in flight after execs of workspaces not the caller's = %+v; want nothing reserved", st)
	}

	// A's own workspace: the first (12 MiB) holds its reservation, the
	// others are A's refusals. The first is held before the others are
	// sent: which one reserves decides how much of A's share is left.
	var stops []func()
	var replies []<-chan reply
	for i, n := range sizes {
		got, stop := stalledExec(t, h, a.Token, wsPath(wsA.WorkspaceID, "/exec"), n)
		replies, stops = append(replies, got), append(stops, stop)
		if i == 0 {
			waitInflight(t, h, 1)
		}
	}
	waitInflight(t, h, 1)
	for i, got := range replies[1:] {
		select {
		case rep := <-got:
			wantRefusedInflight(t, "A's stalled exec "+strconv.Itoa(i+1), rep, http.StatusTooManyRequests, protocol.RateLimited)
		case <-time.After(30 * time.Second):
			t.Fatalf("A's stalled exec %d: no answer; want 429 while the first holds A's share", i+1)
		}
	}
	select {
	case rep := <-replies[0]:
		t.Fatalf("A's first stalled exec answered %d while its body has not come; want it held", rep.Status)
	default:
	}
	wantRefusedInflight(t, "A's exec while A holds its share", do(t, h, execOf(a.Token, wsA.WorkspaceID)), http.StatusTooManyRequests, protocol.RateLimited)

	// B is untouched.
	wantOK(t, "B's exec", do(t, h, execOf(b.Token, wsB.WorkspaceID)), http.StatusOK, nil)
	wantOK(t, "B's write", do(t, h, request{Method: http.MethodPost, Path: wsPath(wsB.WorkspaceID, "/files/write"), Token: b.Token,
		Body: `{"path":"/workspace/a","contents_b64":"eA=="}`}), http.StatusNoContent, nil)
	wantOK(t, "B's read", do(t, h, request{Method: http.MethodPost, Path: wsPath(wsB.WorkspaceID, "/files/read"), Token: b.Token,
		Body: `{"path":"/workspace/a"}`}), http.StatusOK, nil)

	for _, stop := range stops {
		stop()
	}
	waitInflight(t, h, 0)
	wantOK(t, "A's exec once its stalled bodies are gone", do(t, h, execOf(a.Token, wsA.WorkspaceID)), http.StatusOK, nil)
}

// TestInflightBodyReadTimeout: a body that does not arrive within the
// body read timeout ends its request and frees its reservation.
func TestInflightBodyReadTimeout(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{Gateway: gateway.Config{MaxInflightPerWorkspace: 1, BodyReadTimeout: 200 * time.Millisecond}})
	in := h.NewInstance(adminapi.Scope{})
	ws := acquire(t, h, in.Token, "body-timeout")
	got, _ := stalledExec(t, h, in.Token, wsPath(ws.WorkspaceID, "/exec"), 12<<20)
	rep := answer(t, "exec whose body never came", got)
	if rep.Status != http.StatusBadRequest {
		t.Errorf("exec whose body never came: status %d (body %s); want 400", rep.Status, rep.Body)
	}
	waitInflight(t, h, 0)
	if st := h.Gateway.InflightStats(); st.Bytes != 0 {
		t.Errorf("bytes in flight after the body timed out = %d; want 0", st.Bytes)
	}
	wantOK(t, "exec after the stalled one timed out", do(t, h, execOf(in.Token, ws.WorkspaceID)), http.StatusOK, nil)
}
