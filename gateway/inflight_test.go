package gateway_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
)

// wantRefusedInflight checks a refusal by the in-flight caps: the exact
// status and code, and Retry-After 1.
func wantRefusedInflight(t *testing.T, label string, rep reply, status int, code protocol.Code) {
	t.Helper()
	wantError(t, label, rep, status, code)
	if got := rep.Header.Get(protocol.HeaderRetryAfter); got != "1" {
		t.Errorf("%s: Retry-After = %q; want \"1\"", label, got)
	}
}

// waitInflight waits until the gateway holds n requests in flight.
func waitInflight(t *testing.T, h *sgtest.Harness, n int) {
	t.Helper()
	sgtest.WaitFor(t, strconv.Itoa(n)+" requests in flight", func() bool { return h.Gateway.InflightStats().Requests == n })
}

// background sends r on its own goroutine; the returned function waits
// for its reply.
func background(t *testing.T, h *sgtest.Harness, r request) func() reply {
	var rep reply
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		rep, err = send(h, nil, r)
	}()
	return func() reply {
		<-done
		if err != nil {
			t.Fatalf("%s: %v", what(r), err)
		}
		return rep
	}
}

func TestInflightCaps(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{Gateway: gateway.Config{MaxInflightPerWorkspace: 2, MaxInflightPerInstance: 3}})
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxConcurrentWorkspaces: 3}})
	other := h.NewInstance(adminapi.Scope{})
	ws1, ws2 := acquire(t, h, in.Token, "ws1"), acquire(t, h, in.Token, "ws2")
	wsOther := acquire(t, h, other.Token, "other")
	g := newGate(t)
	h.Provider.OnExec(func(spec providers.ExecSpec) (providers.ExecResult, error) {
		g.wait()
		return providers.ExecResult{Stdout: []byte("done"), StdoutBytes: 4}, nil
	})
	h.Provider.OnWriteFile(func(string) error { g.wait(); return nil })
	exec := func(tok sandgate.Secret, id string) request {
		return request{Method: http.MethodPost, Path: wsPath(id, "/exec"), Token: tok, Body: `{"argv":["true"]}`}
	}
	read := func(id string) request {
		return request{Method: http.MethodPost, Path: wsPath(id, "/files/read"), Token: in.Token, Body: `{"path":"/workspace/a"}`}
	}
	write := func(id string) request {
		return request{Method: http.MethodPost, Path: wsPath(id, "/files/write"), Token: in.Token, Body: `{"path":"/workspace/a","contents_b64":"eA=="}`}
	}

	// ws1 at its cap: an exec and a write in flight.
	var held []func() reply
	held = append(held, background(t, h, exec(in.Token, ws1.WorkspaceID)))
	waitInflight(t, h, 1)
	held = append(held, background(t, h, write(ws1.WorkspaceID)))
	waitInflight(t, h, 2)
	execs := len(h.Provider.Execs())
	for _, r := range []request{exec(in.Token, ws1.WorkspaceID), read(ws1.WorkspaceID), write(ws1.WorkspaceID)} {
		wantRefusedInflight(t, "workspace at its cap: "+what(r), do(t, h, r), http.StatusTooManyRequests, protocol.RateLimited)
	}
	// The instance at its cap: one more on ws2 fits, then nothing does.
	held = append(held, background(t, h, exec(in.Token, ws2.WorkspaceID)))
	waitInflight(t, h, 3)
	for _, r := range []request{exec(in.Token, ws2.WorkspaceID), read(ws2.WorkspaceID)} {
		wantRefusedInflight(t, "instance at its cap: "+what(r), do(t, h, r), http.StatusTooManyRequests, protocol.RateLimited)
	}
	if got := len(h.Provider.Execs()); got != execs+1 {
		t.Errorf("provider execs = %d; want %d (a refusal runs nothing)", got, execs+1)
	}
	// Another instance is not held back by this one's caps.
	held = append(held, background(t, h, exec(other.Token, wsOther.WorkspaceID)))
	waitInflight(t, h, 4)

	g.open()
	for _, wait := range held {
		if rep := wait(); rep.Status != http.StatusOK && rep.Status != http.StatusNoContent {
			t.Errorf("held request: status %d; want 200 or 204 (body %s)", rep.Status, rep.Body)
		}
	}
	waitInflight(t, h, 0)
	if got := h.Gateway.InflightStats().Bytes; got != 0 {
		t.Errorf("bytes in flight after every request ended = %d; want 0", got)
	}
	// Freed: ws1 runs again.
	wantOK(t, "exec after the caps freed", do(t, h, exec(in.Token, ws1.WorkspaceID)), http.StatusOK, nil)
}

func TestInflightBudget(t *testing.T) {
	t.Parallel()
	const maxOut = 1 << 20
	// Two execs' worst case (2 × max_output_bytes and their small bodies) fit, a third does not.
	// The instance's and account's shares are left out of the way: this is the whole budget's test.
	h := sgtest.New(t, sgtest.Options{Gateway: gateway.Config{MaxInflightPerWorkspace: 100, MaxInflightPerInstance: 100,
		InflightBytes: 5 * maxOut, InflightBytesPerInstance: 100 * maxOut, InflightBytesPerAccount: 100 * maxOut}})
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxOutputBytes: maxOut, MaxFileBytes: 1024}})
	big := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxOutputBytes: 3 * maxOut}})
	ws := acquire(t, h, in.Token, "budget")
	wsBig := acquire(t, h, big.Token, "big")
	g := newGate(t)
	h.Provider.OnExec(func(spec providers.ExecSpec) (providers.ExecResult, error) {
		g.wait()
		return providers.ExecResult{}, nil
	})
	exec := request{Method: http.MethodPost, Path: wsPath(ws.WorkspaceID, "/exec"), Token: in.Token, Body: `{"argv":["true"]}`}
	held := []func() reply{background(t, h, exec)}
	waitInflight(t, h, 1)
	held = append(held, background(t, h, exec))
	waitInflight(t, h, 2)
	if got, want := h.Gateway.InflightStats().Bytes, int64(2*(2*maxOut+4*len(`{"argv":["true"]}`))); got != want {
		t.Errorf("bytes reserved by two execs = %d; want %d", got, want)
	}
	wantRefusedInflight(t, "exec past the budget", do(t, h, exec), http.StatusTooManyRequests, protocol.RateLimited)
	// What is left still takes a small transfer (1 KiB of contents).
	wantOK(t, "small write within the budget", do(t, h, request{Method: http.MethodPost, Path: wsPath(ws.WorkspaceID, "/files/write"),
		Token: in.Token, Body: `{"path":"/workspace/a","contents_b64":"eA=="}`}), http.StatusNoContent, nil)
	g.open()
	for _, wait := range held {
		if rep := wait(); rep.Status != http.StatusOK {
			t.Errorf("held exec: status %d; want 200 (body %s)", rep.Status, rep.Body)
		}
	}
	waitInflight(t, h, 0)
	// A scope whose worst case is over the whole budget never runs.
	wantRefusedInflight(t, "exec larger than the budget", do(t, h, request{Method: http.MethodPost,
		Path: wsPath(wsBig.WorkspaceID, "/exec"), Token: big.Token, Body: `{"argv":["true"]}`}), http.StatusTooManyRequests, protocol.RateLimited)
}

// TestInflightConcurrent fires many execs at one workspace at once: no
// more than the cap ever run together, every other one is refused with
// 429, each admitted one answers its own output, and nothing stays
// reserved. Run it with -race.
func TestInflightConcurrent(t *testing.T) {
	t.Parallel()
	const cap, n = 4, 24
	h := sgtest.New(t, sgtest.Options{Gateway: gateway.Config{MaxInflightPerWorkspace: cap}})
	in := h.NewInstance(adminapi.Scope{})
	ws := acquire(t, h, in.Token, "concurrent")
	var running, peak atomic.Int32
	full := newGate(t) // opened once cap execs run together
	h.Provider.OnExec(func(spec providers.ExecSpec) (providers.ExecResult, error) {
		now := running.Add(1)
		defer running.Add(-1)
		for {
			p := peak.Load()
			if now <= p || peak.CompareAndSwap(p, now) {
				break
			}
		}
		if now == cap {
			full.open()
		}
		full.wait()
		// Output over several of the gateway's chunks, written into its buffers.
		out := bytes.Repeat([]byte(spec.Argv[1]), 150_001)
		spec.Stdout.Write(out)
		spec.Stderr.Write(out[:7])
		return providers.ExecResult{StdoutBytes: int64(len(out)), StderrBytes: 7}, nil
	})
	var wg sync.WaitGroup
	var ok, refused atomic.Int32
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			arg := string(rune('a' + i))
			rep, err := send(h, nil, request{Method: http.MethodPost, Path: wsPath(ws.WorkspaceID, "/exec"), Token: in.Token,
				Body: protocol.ExecRequest{Argv: []string{"echo", arg}}})
			if err != nil {
				t.Errorf("exec %d: %v", i, err)
				return
			}
			switch rep.Status {
			case http.StatusOK:
				ok.Add(1)
				var res protocol.ExecResponse
				if err := json.Unmarshal(rep.Body, &res); err != nil {
					t.Errorf("exec %d: decode: %v", i, err)
					return
				}
				want := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte(arg), 150_001))
				if res.StdoutB64 != want || res.StderrB64 != base64.StdEncoding.EncodeToString(bytes.Repeat([]byte(arg), 7)) {
					t.Errorf("exec %d: output of %d and %d base64 characters is not its own", i, len(res.StdoutB64), len(res.StderrB64))
				}
			case http.StatusTooManyRequests:
				refused.Add(1)
				var env protocol.Envelope
				if err := json.Unmarshal(rep.Body, &env); err != nil || env.Error.Code != protocol.RateLimited || rep.Header.Get(protocol.HeaderRetryAfter) != "1" {
					t.Errorf("exec %d: 429 with code %q, Retry-After %q; want rate_limited, 1", i, env.Error.Code, rep.Header.Get(protocol.HeaderRetryAfter))
				}
			default:
				t.Errorf("exec %d: status %d; want 200 or 429 (body %s)", i, rep.Status, rep.Body)
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p != cap {
		t.Errorf("execs running at once = %d at most; want %d", p, cap)
	}
	if ok.Load()+refused.Load() != n || ok.Load() == 0 {
		t.Errorf("answers: %d ok, %d refused; want %d in all, at least one ok", ok.Load(), refused.Load(), n)
	}
	waitInflight(t, h, 0)
	if st := h.Gateway.InflightStats(); st != (gateway.InflightStats{}) {
		t.Errorf("in flight after every exec ended = %+v; want none", st)
	}
}

// TestExecBodyStreamed checks that the exec answer, encoded straight into
// the response, is byte for byte what marshalling protocol.ExecResponse
// gives, with its length declared.
func TestExecBodyStreamed(t *testing.T) {
	t.Parallel()
	h := sgtest.New(t, sgtest.Options{})
	in := h.NewInstance(adminapi.Scope{})
	ws := acquire(t, h, in.Token, "streamed")
	out := make([]byte, 3*64<<10+2) // over chunk boundaries, not a multiple of 3
	for i := range out {
		out[i] = byte(i * 7)
	}
	for _, viaWriter := range []bool{true, false} {
		h.Provider.OnExec(func(spec providers.ExecSpec) (providers.ExecResult, error) {
			res := providers.ExecResult{ExitCode: 3, StdoutTruncated: true, StdoutBytes: 1 << 30, StderrBytes: 1, TimedOut: true}
			if viaWriter {
				spec.Stdout.Write(out[:1000])
				spec.Stdout.Write(out[1000:])
				spec.Stderr.Write([]byte{0})
			} else {
				res.Stdout, res.Stderr = out, []byte{0}
			}
			return res, nil
		})
		rep := do(t, h, request{Method: http.MethodPost, Path: wsPath(ws.WorkspaceID, "/exec"), Token: in.Token,
			Body: `{"argv":["true"],"timeout_seconds":100000}`})
		want, _ := json.Marshal(protocol.ExecResponse{ExitCode: 3, StdoutB64: base64.StdEncoding.EncodeToString(out),
			StderrB64: "AA==", StdoutTruncated: true, TimeoutClamped: true, TimedOut: true, StdoutBytes: 1 << 30, StderrBytes: 1})
		if rep.Status != http.StatusOK || !bytes.Equal(rep.Body, want) {
			t.Errorf("exec (output via writer %v): status %d, body of %d bytes equal to the marshalled response: %v; want 200, true",
				viaWriter, rep.Status, len(rep.Body), bytes.Equal(rep.Body, want))
		}
		if got := rep.Header.Get("Content-Length"); got != strconv.Itoa(len(want)) {
			t.Errorf("exec (output via writer %v): Content-Length = %q; want %d", viaWriter, got, len(want))
		}
		if got := rep.Header.Get("Content-Type"); got != "application/json; charset=utf-8" {
			t.Errorf("exec: Content-Type = %q; want application/json; charset=utf-8", got)
		}
	}
}

// TestInflightCommands: durable command requests reserve bytes from the
// budget (429 past it) but do not count against the per-workspace cap, so
// a repeated PUT still answers the command's status while execs fill it.
func TestInflightCommands(t *testing.T) {
	t.Parallel()
	const maxOut = 1 << 20
	h := sgtest.New(t, sgtest.Options{Gateway: gateway.Config{MaxInflightPerWorkspace: 1, InflightBytes: 5 * maxOut,
		InflightBytesPerInstance: 100 * maxOut, InflightBytesPerAccount: 100 * maxOut}})
	in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxOutputBytes: maxOut}})
	ws := acquire(t, h, in.Token, "commands")
	put := request{Method: http.MethodPut, Path: wsPath(ws.WorkspaceID, "/commands/c1"), Token: in.Token, Body: `{"argv":["true"]}`}
	get := request{Method: http.MethodGet, Path: wsPath(ws.WorkspaceID, "/commands/c1"), Token: in.Token}
	wantOK(t, "PUT", do(t, h, put), http.StatusAccepted, nil)

	g := newGate(t)
	h.Provider.OnExec(func(spec providers.ExecSpec) (providers.ExecResult, error) {
		g.wait()
		return providers.ExecResult{}, nil
	})
	exec := request{Method: http.MethodPost, Path: wsPath(ws.WorkspaceID, "/exec"), Token: in.Token, Body: `{"argv":["true"]}`}
	held := background(t, h, exec)
	waitInflight(t, h, 1)
	wantRefusedInflight(t, "exec past the workspace's cap", do(t, h, exec), http.StatusTooManyRequests, protocol.RateLimited)
	// 2 MiB of the 5 are held: a command read (2 MiB and a little) fits, beside the exec.
	// A request's reservation is given back once its handler returns, which
	// can be just after the client has read the whole answer: each wait
	// below lets the last one end before the next is measured.
	wantOK(t, "repeated PUT at the workspace's cap", do(t, h, put), http.StatusOK, nil)
	waitInflight(t, h, 1)
	wantOK(t, "GET at the workspace's cap", do(t, h, get), http.StatusOK, nil)
	waitInflight(t, h, 1)

	// A second workspace's execs take the budget: a command read no longer fits.
	in2 := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{MaxOutputBytes: maxOut}})
	ws2 := acquire(t, h, in2.Token, "commands-2")
	held2 := background(t, h, request{Method: http.MethodPost, Path: wsPath(ws2.WorkspaceID, "/exec"), Token: in2.Token, Body: `{"argv":["true"]}`})
	waitInflight(t, h, 2)
	wantRefusedInflight(t, "GET past the budget", do(t, h, get), http.StatusTooManyRequests, protocol.RateLimited)
	g.open()
	for _, wait := range []func() reply{held, held2} {
		if rep := wait(); rep.Status != http.StatusOK {
			t.Errorf("held exec: status %d; want 200 (body %s)", rep.Status, rep.Body)
		}
	}
	rep := do(t, h, get)
	var st protocol.CommandStatus
	wantOK(t, "GET once the budget is free", rep, http.StatusOK, &st)
	// Encoded straight into the response, the completed status is byte for
	// byte what protocol.CommandStatus marshals to.
	if again, _ := json.Marshal(st); st.ExitCode == nil || !bytes.Equal(again, rep.Body) {
		t.Errorf("completed command status %s; want it as protocol.CommandStatus marshals it: %s", rep.Body, again)
	}
	waitInflight(t, h, 0)
	if st := h.Gateway.InflightStats(); st != (gateway.InflightStats{}) {
		t.Errorf("in flight at the end = %+v; want none", st)
	}
}
