package gateway_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/reaper"
)

// TestIdleCountsFromExecEnd checks that the idle timeout counts from the end
// of the last exec, not from its deadline, while an exec still running keeps
// the workspace busy however long it takes. Time is the harness's clock; the
// reaper runs one pass at a time.
func TestIdleCountsFromExecEnd(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		lifetime time.Duration
		exec     protocol.ExecRequest
		runFor   time.Duration // how long the exec runs, by the clock
	}{
		{"quick echo, idle 20s of a 40s lifetime", 40 * time.Second,
			protocol.ExecRequest{Argv: []string{"echo", "hi"}}, 0},
		{"quick command with timeout_seconds 900", time.Hour,
			protocol.ExecRequest{Argv: []string{"true"}, TimeoutSeconds: 900}, 0},
		{"exec running past the idle timeout", time.Hour,
			protocol.ExecRequest{Argv: []string{"sleep", "45"}, TimeoutSeconds: 120}, 45 * time.Second},
	}
	const idle = 20 * time.Second
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := sgtest.New(t, sgtest.Options{})
			in := h.NewInstance(adminapi.Scope{Limits: protocol.Limits{
				MaxLifetimeSeconds: int64(tt.lifetime / time.Second), IdleTimeoutSeconds: int64(idle / time.Second),
				MaxExecTimeoutSeconds: 900}})
			ws := acquire(t, h, in.Token, "idle")
			r := reaper.New(reaper.Config{}, reaper.Deps{DB: h.DB, Providers: h.Providers, Terminator: h.Terminator, Clock: h.Clock})
			pass := func() {
				t.Helper()
				if err := r.Pass(context.Background()); err != nil {
					t.Fatalf("reaper pass: %v", err)
				}
			}

			started, finish := make(chan struct{}), newGate(t)
			h.Provider.OnExec(func(providers.ExecSpec) (providers.ExecResult, error) {
				close(started)
				finish.wait()
				return providers.ExecResult{}, nil
			})
			done := make(chan reply, 1)
			go func() {
				rep, err := send(h, h.Server.Client(), request{Method: http.MethodPost, Path: wsPath(ws.WorkspaceID, "/exec"), Token: in.Token, Body: tt.exec})
				if err != nil {
					t.Errorf("exec: %v", err)
				}
				done <- rep
			}()
			<-started
			if tt.runFor > 0 {
				// Past the idle timeout while the exec runs: busy, not idle.
				h.Clock.Advance(tt.runFor)
				pass()
				wantRunning(t, h, in.Token, ws.WorkspaceID)
			}
			finish.open()
			wantOK(t, "exec", <-done, http.StatusOK, nil)

			h.Clock.Advance(idle - time.Second)
			pass()
			wantRunning(t, h, in.Token, ws.WorkspaceID)
			h.Clock.Advance(2 * time.Second)
			pass()
			// idle−1s after the exec ended it was running; idle+1s after, it
			// ended as idle (before lifetime's end, so not expired).
			wantEnded(t, h, in.Token, ws.WorkspaceID, sandgate.ReasonIdle)
		})
	}
}
