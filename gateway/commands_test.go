package gateway_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/internal/fakeprovider"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
)

// cmdtPath is the path of a durable command.
func cmdtPath(ws, identity string) string { return "/v1/workspaces/" + ws + "/commands/" + identity }

// cmdtWait polls ReadCommand until the command is finished.
func (e *snapEnv) cmdtWait(ws, identity string) *protocol.CommandStatus {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := e.cl.ReadCommand(context.Background(), ws, identity)
		if err != nil {
			e.t.Fatalf("ReadCommand: %v", err)
		}
		if st.State == protocol.CommandCompleted || st.State == protocol.CommandCanceled {
			return st
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("command %s still %q after a minute", identity, st.State)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// TestCommandsLocal drives durable commands on real bwrap: a double PUT
// from many goroutines launches once, and cancel before launch, during the
// run and after completion.
func TestCommandsLocal(t *testing.T) {
	t.Parallel()
	p := snapLocal(t)
	e := snapStart(t, p, nil)
	ws := e.acquire("").WorkspaceID
	ctx := context.Background()

	// Exactly once: the command appends a line to a file.
	req := protocol.ExecRequest{Argv: []string{"sh", "-c", "echo line >>/workspace/once; printf out; printf err >&2; exit 3"}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	launched, replayed := 0, 0
	for range 16 {
		wg.Go(func() {
			st, l, err := e.cl.StartCommand(ctx, ws, "tool-call:1", req)
			// 429: the in-flight cap refused it before anything ran (each
			// PUT holds twice the output cap while in flight); a client
			// sends it again after Retry-After, which cannot launch twice.
			for range 30 {
				var ce *client.Error
				if !errors.As(err, &ce) || ce.Code != protocol.RateLimited {
					break
				}
				time.Sleep(ce.RetryAfter)
				st, l, err = e.cl.StartCommand(ctx, ws, "tool-call:1", req)
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Errorf("StartCommand: %v", err)
			case l:
				launched++
			default:
				replayed++
				if st.State == protocol.CommandUnknown || st.State == "" {
					t.Errorf("repeated PUT state = %q", st.State)
				}
			}
		})
	}
	wg.Wait()
	if launched != 1 || replayed != 15 {
		t.Fatalf("202s, 200s = %d, %d; want 1, 15", launched, replayed)
	}
	st := e.cmdtWait(ws, "tool-call:1")
	if st.State != protocol.CommandCompleted || st.ExitCode == nil {
		t.Fatalf("command = %+v; want completed", st)
	}
	got, err := e.cl.ReadFile(ctx, ws, "/workspace/once")
	if err != nil {
		t.Fatal(err)
	}
	wantOut, wantErr := "out", "err"
	if *st.ExitCode != 3 {
		t.Errorf("exit code = %d; want 3", *st.ExitCode)
	}
	if string(got) != "line\n" {
		t.Errorf("file after 16 PUTs = %q; want exactly one line", got)
	}
	if cmdtB64(st.StdoutB64) != wantOut || cmdtB64(st.StderrB64) != wantErr || st.StdoutBytes != 3 || st.StderrBytes != 3 || st.OutputTruncated {
		t.Errorf("output = %q, %q, %d, %d, truncated %v; want %q, %q", cmdtB64(st.StdoutB64), cmdtB64(st.StderrB64), st.StdoutBytes, st.StderrBytes, st.OutputTruncated, wantOut, wantErr)
	}

	// Cancel after completion: the result survives.
	if err := e.cl.CancelCommand(ctx, ws, "tool-call:1"); err != nil {
		t.Fatal(err)
	}
	if st := e.cmdtWait(ws, "tool-call:1"); st.State != protocol.CommandCompleted || *st.ExitCode != 3 {
		t.Errorf("after a late cancel = %+v; want completed 3", st)
	}

	// Cancel before launch: a later PUT never runs it.
	if err := e.cl.CancelCommand(ctx, ws, "tool-call:2"); err != nil {
		t.Fatal(err)
	}
	st2, launchedLate, err := e.cl.StartCommand(ctx, ws, "tool-call:2", protocol.ExecRequest{Argv: []string{"touch", "/workspace/fenced"}})
	if err != nil || launchedLate || st2.State != protocol.CommandCanceled {
		t.Errorf("PUT after a cancel = %+v, launched %v, %v; want 200 canceled", st2, launchedLate, err)
	}
	if _, err := e.cl.ReadFile(ctx, ws, "/workspace/fenced"); err == nil {
		t.Errorf("a fenced command ran")
	}

	// Cancel during the run kills the whole process group.
	hb := `( while :; do date +%s%N >/tmp/hb; sleep 0.05; done ) & sleep 300`
	if _, l, err := e.cl.StartCommand(ctx, ws, "tool-call:3", protocol.ExecRequest{Argv: []string{"sh", "-c", hb}, TimeoutSeconds: 600}); err != nil || !l {
		t.Fatalf("StartCommand: %v, launched %v", err, l)
	}
	beat := func() string {
		for i := 0; ; i++ {
			b, err := e.cl.ReadFile(ctx, ws, "/tmp/hb")
			if err == nil {
				return string(b)
			}
			if i == 400 {
				t.Fatalf("no heartbeat: %v", err)
			}
			time.Sleep(25 * time.Millisecond)
		}
	}
	// The child is alive if its heartbeat changes (bounded poll: a loaded
	// machine may schedule it late).
	a := beat()
	for i := 0; beat() == a; i++ {
		if i == 200 {
			t.Fatalf("the command's child does not beat")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st, _ := e.cl.ReadCommand(ctx, ws, "tool-call:3"); st.State != protocol.CommandRunning {
		t.Errorf("state while running = %q; want running", st.State)
	}
	if err := e.cl.CancelCommand(ctx, ws, "tool-call:3"); err != nil {
		t.Fatal(err)
	}
	if st := e.cmdtWait(ws, "tool-call:3"); st.State != protocol.CommandCanceled || st.ExitCode == nil || *st.ExitCode != 137 {
		t.Errorf("after cancel = %+v; want canceled 137", st)
	}
	a = beat()
	time.Sleep(300 * time.Millisecond)
	if beat() != a {
		t.Errorf("the command's child survived the cancel")
	}
	if err := e.cl.CancelCommand(ctx, ws, "tool-call:3"); err != nil {
		t.Errorf("second cancel: %v", err)
	}
	// Nothing of the command reached the logs.
	if strings.Contains(e.logs.String(), "/workspace/once") || strings.Contains(e.logs.String(), "/tmp/hb") {
		t.Errorf("logs carry argv")
	}
}

func cmdtB64(s string) string {
	b, _ := base64.StdEncoding.DecodeString(s)
	return string(b)
}

// TestCommandProtocol checks the wire answers with the fake provider.
func TestCommandProtocol(t *testing.T) {
	t.Parallel()
	fake := fakeprovider.New()
	fake.HoldCommands = true
	fake.ExecFunc = func(spec providers.ExecSpec) providers.ExecResult {
		return providers.ExecResult{ExitCode: 5, Stdout: []byte("0123456789"), StdoutBytes: 10, StdoutTruncated: false}
	}
	e := snapStart(t, fake, nil)
	ws := e.acquire("").WorkspaceID
	ctx := context.Background()
	put := func(identity string, body any) (int, protocol.CommandStatus, []byte) {
		t.Helper()
		st, b := e.do(http.MethodPut, cmdtPath(ws, identity), body, nil)
		var out protocol.CommandStatus
		json.Unmarshal(b, &out)
		return st, out, b
	}
	run := protocol.ExecRequest{Argv: []string{"make", "test"}}

	if st, b := e.do(http.MethodGet, cmdtPath(ws, "never"), nil, nil); st != http.StatusOK || string(b) != `{"state":"unknown"}`+"\n" {
		t.Errorf("GET of an unknown identity = %d %q; want 200 {\"state\":\"unknown\"}", st, b)
	}
	if st, b := e.do(http.MethodGet, cmdtPath(ws, strings.Repeat("x", 129)), nil, nil); st != http.StatusBadRequest {
		t.Errorf("GET of an over-long identity = %d %s; want 400", st, b)
	}
	if st, _, b := put("bad", map[string]any{"argv": []string{}}); st != http.StatusBadRequest {
		t.Errorf("PUT with an empty argv = %d %s; want 400", st, b)
	}
	if st, _ := e.do(http.MethodGet, cmdtPath(ws, "bad"), nil, nil); st != http.StatusOK {
		t.Errorf("a refused PUT claimed the identity")
	}

	// Many PUTs at once: one launch.
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for range 20 {
		wg.Go(func() {
			st, _, b := put("c1", run)
			// 429: the in-flight cap refused it before anything ran (each
			// PUT holds twice the output cap while in flight); a client
			// sends it again after Retry-After, which cannot launch twice.
			for range 30 {
				var env protocol.Envelope
				if st != http.StatusTooManyRequests || json.Unmarshal(b, &env) != nil || env.Error.Code != protocol.RateLimited {
					break
				}
				time.Sleep(time.Second)
				st, _, b = put("c1", run)
			}
			mu.Lock()
			codes[st]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[http.StatusAccepted] != 1 || codes[http.StatusOK] != 19 || fake.Launches() != 1 {
		t.Fatalf("PUT answers %v, launches %d; want one 202, nineteen 200, one launch", codes, fake.Launches())
	}
	// A repeated PUT answers the current status whatever its body.
	if st, out, b := put("c1", map[string]any{"nonsense": true}); st != http.StatusOK || out.State != protocol.CommandRunning {
		t.Errorf("repeated PUT with another body = %d %s; want 200 running", st, b)
	}
	w, _ := e.db.Workspace(ctx, e.acct, ws)
	if !w.BusyUntil.After(e.clock.Now()) || w.LastActivity.IsZero() {
		t.Errorf("workspace after PUT: busy until %v, activity %v; want busy and active", w.BusyUntil, w.LastActivity)
	}
	fake.FinishCommand(ws, cmdtKey("c1"))
	st, err := e.cl.ReadCommand(ctx, ws, "c1")
	if err != nil || st.State != protocol.CommandCompleted || st.ExitCode == nil || *st.ExitCode != 5 || cmdtB64(st.StdoutB64) != "0123456789" || st.StdoutBytes != 10 {
		t.Errorf("GET after completion = %+v, %v; want completed 5 with the output", st, err)
	}
	if w, _ := e.db.Workspace(ctx, e.acct, ws); !w.BusyUntil.IsZero() {
		t.Errorf("workspace still busy after its command completed")
	}

	// Preflight failure: 422, and the identity stays free.
	fake.Set(func(p *fakeprovider.Provider) { p.StartCommandErr = providers.ErrCommandNotStarted })
	if st, _, b := put("c2", run); st != http.StatusUnprocessableEntity || snapCode(b) != protocol.CommandNotStarted {
		t.Errorf("PUT failing preflight = %d %s; want 422 command_not_started", st, b)
	}
	fake.Set(func(p *fakeprovider.Provider) { p.StartCommandErr = nil })
	if st, _, b := put("c2", run); st != http.StatusAccepted {
		t.Errorf("PUT after a preflight failure = %d %s; want 202", st, b)
	}

	// Unknown outcome: 502, starting until the dispatch deadline, then fenced.
	fake.Set(func(p *fakeprovider.Provider) { p.StartCommandErr = fakeprovider.ErrInjected })
	if st, _, b := put("c3", run); st != http.StatusBadGateway {
		t.Errorf("PUT with an unknown outcome = %d %s; want 502", st, b)
	}
	fake.Set(func(p *fakeprovider.Provider) { p.StartCommandErr = nil })
	if st, _ := e.cl.ReadCommand(ctx, ws, "c3"); st.State != protocol.CommandStarting {
		t.Errorf("GET before the dispatch deadline = %q; want starting", st.State)
	}
	e.clock.Advance(2 * time.Minute)
	if st, _ := e.cl.ReadCommand(ctx, ws, "c3"); st.State != protocol.CommandCanceled || st.ExitCode != nil {
		t.Errorf("GET past the dispatch deadline = %+v; want canceled without an exit code", st)
	}
	if err := fake.StartCommand(ctx, providers.Sandbox{Ref: ws}, cmdtKey("c3"), providers.ExecSpec{Argv: []string{"x"}}); err != providers.ErrCommandFenced {
		t.Errorf("a delayed launch after the fence = %v; want ErrCommandFenced", err)
	}

	// Cancel during the run, and of an identity never used.
	put("c4", run)
	if err := e.cl.CancelCommand(ctx, ws, "c4"); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.cl.ReadCommand(ctx, ws, "c4"); st.State != protocol.CommandCanceled || st.ExitCode == nil || *st.ExitCode != 137 {
		t.Errorf("GET after cancel = %+v; want canceled 137", st)
	}
	if st, b := e.do(http.MethodPost, cmdtPath(ws, "c5")+"/cancel", nil, nil); st != http.StatusAccepted {
		t.Errorf("cancel of an unused identity = %d %s; want 202", st, b)
	}
	if st, out, _ := put("c5", run); st != http.StatusOK || out.State != protocol.CommandCanceled {
		t.Errorf("PUT after cancel = %d %+v; want 200 canceled", st, out)
	}
	if n := fake.Launches(); n != 3 {
		t.Errorf("launches = %d; want 3 (c1, c2, c4)", n)
	}

	// Other instances and gone workspaces.
	otherTok, _ := e.otherInstance()
	if st, _ := e.doWith(otherTok, http.MethodGet, cmdtPath(ws, "c1"), nil, nil); st != http.StatusNotFound {
		t.Errorf("GET from another instance = %d; want 404", st)
	}
	if _, err := e.cl.Release(ctx, ws); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ method, path string }{
		{http.MethodGet, cmdtPath(ws, "c1")},
		{http.MethodPut, cmdtPath(ws, "c9")},
		{http.MethodPost, cmdtPath(ws, "c1") + "/cancel"},
	} {
		if st, b := e.do(tt.method, tt.path, run, nil); st != http.StatusGone || snapCode(b) != protocol.WorkspaceGone {
			t.Errorf("%s %s on a released workspace = %d %s; want 410 workspace_gone", tt.method, tt.path, st, b)
		}
	}
}

// cmdtKey is the broker's name for an identity: its hex SHA-256.
func cmdtKey(identity string) string {
	sum := sha256.Sum256([]byte(identity))
	return hex.EncodeToString(sum[:])
}

// TestCommandCancelFencesDelayedLaunch: a cancel between the claim and a
// delayed launch fences it: the launch never runs.
func TestCommandCancelFencesDelayedLaunch(t *testing.T) {
	t.Parallel()
	fake := fakeprovider.New()
	gate := make(chan struct{})
	fake.StartGate = gate
	e := snapStart(t, fake, nil)
	ws := e.acquire("").WorkspaceID
	ctx := context.Background()
	type answer struct {
		st       *protocol.CommandStatus
		launched bool
		err      error
	}
	done := make(chan answer, 1)
	go func() {
		st, l, err := e.cl.StartCommand(ctx, ws, "slow", protocol.ExecRequest{Argv: []string{"make"}})
		done <- answer{st, l, err}
	}()
	for i := 0; ; i++ { // wait for the claim
		st, err := e.cl.ReadCommand(ctx, ws, "slow")
		if err == nil && st.State == protocol.CommandStarting {
			break
		}
		if i == 400 {
			t.Fatalf("the PUT never claimed the identity: %+v, %v", st, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := e.cl.CancelCommand(ctx, ws, "slow"); err != nil {
		t.Fatalf("CancelCommand: %v", err)
	}
	close(gate)
	a := <-done
	if a.err != nil || !a.launched || a.st.State != protocol.CommandCanceled {
		t.Errorf("the delayed PUT = %+v, launched %v, %v; want 202 canceled", a.st, a.launched, a.err)
	}
	if n := fake.Launches(); n != 0 {
		t.Errorf("launches = %d; want 0: the fence held", n)
	}
	if st, err := e.cl.ReadCommand(ctx, ws, "slow"); err != nil || st.State != protocol.CommandCanceled || st.ExitCode != nil {
		t.Errorf("GET = %+v, %v; want canceled without an exit code", st, err)
	}
}
