package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/sandgate/sandgate/protocol"
)

// TestSlowBodiesFairServe: the issue's slow-body attack against `sandgate
// serve`. TLS connections that declare 12 MiB (and 6 MiB) exec bodies and
// never send them, to a workspace that does not exist and to a workspace
// of instance A, leave instance B's exec and file read at 200; A's own
// extra requests get 429 rate_limited with a Retry-After.
func TestSlowBodiesFairServe(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	cfg := newServeConfig(t, rs.Addr, serveOptions{})
	// A's share is 60 MiB: one stalled 12 MiB exec holds 4 × 12 MiB + 2 ×
	// max_output_bytes (4 MiB) = 56 MiB of it, so no other exec of A's fits.
	appendConfig(t, cfg, "admission:\n  inflight:\n    body_timeout: 10m\n    per_instance_bytes: 62914560\n")
	s := startServe(t, cfg)
	adm := s.Admin(t)
	tokA := issueToken(t, adm, createInstance(t, adm, createAccount(t, adm, "e2e-fair-a"), 2))
	tokB := issueToken(t, adm, createInstance(t, adm, createAccount(t, adm, "e2e-fair-b"), 2))
	wsA := acquire(t, s.Client(t, tokA), "fair-a")
	wsB := acquire(t, s.Client(t, tokB), "fair-b")
	hc := httpsClient(cfg.PKI.Roots)

	type answer struct {
		status int
		header http.Header
		body   []byte
	}
	// stalled sends an exec whose body declares n bytes and never comes.
	stalled := func(tok, ws string, n int64) <-chan answer {
		pr, pw := io.Pipe()
		t.Cleanup(func() { pw.CloseWithError(errors.New("the client gave up")) })
		req, err := http.NewRequest(http.MethodPost, s.URL+"/v1/workspaces/"+ws+"/exec", pr)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = n
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		out := make(chan answer, 1)
		go func() {
			resp, err := hc.Do(req)
			if err != nil {
				out <- answer{}
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			out <- answer{resp.StatusCode, resp.Header, b}
		}()
		return out
	}
	post := func(tok, ws, route string, body any) answer {
		b, _ := json.Marshal(body)
		req, err := http.NewRequest(http.MethodPost, s.URL+"/v1/workspaces/"+ws+route, bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", route, err)
		}
		defer resp.Body.Close()
		rb, _ := io.ReadAll(resp.Body)
		return answer{resp.StatusCode, resp.Header, rb}
	}
	codeOf := func(b []byte) protocol.Code {
		var env protocol.Envelope
		_ = json.Unmarshal(b, &env)
		return env.Error.Code
	}
	wait := func(what string, got <-chan answer) answer {
		t.Helper()
		select {
		case a := <-got:
			return a
		case <-time.After(time.Minute):
			t.Fatalf("%s: no answer while its body is not sent; want one at once", what)
			return answer{}
		}
	}
	sizes := []int64{12 << 20, 12 << 20, 12 << 20, 12 << 20, 6 << 20}
	for _, n := range sizes {
		if a := wait("stalled exec of ws_doesnotexist", stalled(tokA, "ws_doesnotexist", n)); a.status != http.StatusNotFound {
			t.Errorf("stalled exec of ws_doesnotexist = %d %s; want 404 at once", a.status, a.body)
		}
	}
	// A's stalled execs all declare 12 MiB, so whichever the gateway reads
	// first fills A's share (a 6 MiB one would leave room for a small exec).
	var toA []<-chan answer
	for range sizes {
		toA = append(toA, stalled(tokA, wsA.WorkspaceID, 12<<20))
	}
	// All but one of A's are A's own refusals; the one left holds A's share.
	refused := 0
	deadline := time.After(time.Minute)
	for refused < len(sizes)-1 {
		select {
		case a := <-toA[0]:
			toA = toA[1:]
			if a.status != http.StatusTooManyRequests || codeOf(a.body) != protocol.RateLimited || a.header.Get(protocol.HeaderRetryAfter) == "" {
				t.Fatalf("A's stalled exec = %d %s (Retry-After %q); want 429 rate_limited with a Retry-After", a.status, a.body, a.header.Get(protocol.HeaderRetryAfter))
			}
			refused++
		case <-time.After(50 * time.Millisecond):
			toA = append(toA[1:], toA[0]) // look at the next one
		case <-deadline:
			t.Fatalf("A's stalled execs refused: %d; want %d", refused, len(sizes)-1)
		}
	}
	if a := post(tokA, wsA.WorkspaceID, "/exec", protocol.ExecRequest{Argv: []string{"true"}}); a.status != http.StatusTooManyRequests || codeOf(a.body) != protocol.RateLimited {
		t.Errorf("A's exec while A's stalled body holds its share = %d %s; want 429 rate_limited", a.status, a.body)
	}
	if a := post(tokB, wsB.WorkspaceID, "/exec", protocol.ExecRequest{Argv: []string{"sh", "-c", "echo hi > /workspace/f"}}); a.status != http.StatusOK {
		t.Errorf("B's exec = %d %s; want 200", a.status, a.body)
	}
	if a := post(tokB, wsB.WorkspaceID, "/files/read", protocol.ReadFileRequest{Path: "/workspace/f"}); a.status != http.StatusOK {
		t.Errorf("B's file read = %d %s; want 200", a.status, a.body)
	}
}
