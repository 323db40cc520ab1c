package client_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/protocol"
)

// exampleBroker is a broker of one workspace for the examples, answering
// as protocol v1 does; a real program points client.Config at its broker
// (for `sandgate dev`: BROKER_URL, BROKER_CA and BROKER_TOKEN from
// .sandgate/dev.env).
func exampleBroker() (*client.Client, func()) {
	ws := `{"workspace_id":"ws_example","state":"%s","size":"small","image":"host","created_at":"2026-10-01T12:00:00Z",` +
		`"expires_at":"2026-10-01T13:00:00Z","idle_timeout_seconds":900,"terminated_at":%s,"termination_reason":%s%s}`
	mux := http.NewServeMux()
	answer := func(status int, body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			fmt.Fprint(w, body)
		}
	}
	mux.Handle("POST /v1/workspaces", answer(201, fmt.Sprintf(ws, "running", "null", "null", "")))
	mux.Handle("POST /v1/workspaces/ws_example/exec", answer(200, `{"exit_code":0,"stdout_b64":"aGkK","stderr_b64":"",`+
		`"stdout_truncated":false,"stderr_truncated":false,"timeout_clamped":false,"timed_out":false,"stdout_bytes":3,"stderr_bytes":0}`))
	mux.HandleFunc("POST /v1/workspaces/ws_example/files/write", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	mux.Handle("POST /v1/workspaces/ws_example/files/read", answer(200, `{"contents_b64":"aGVsbG8K","size_bytes":6}`))
	mux.Handle("POST /v1/workspaces/ws_example/snapshots", answer(201, `{"snapshot_id":"snap_example","workspace_id":"ws_example",`+
		`"dir":"/workspace/notes","created_at":"2026-10-01T12:01:00Z","expires_at":"2026-10-15T12:01:00Z","size_bytes":120}`))
	mux.HandleFunc("DELETE /v1/snapshots/snap_example", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	mux.Handle("DELETE /v1/workspaces/ws_example", answer(200, fmt.Sprintf(ws, "terminated", `"2026-10-01T12:02:00Z"`, `"released"`, `,"metered_seconds":120`)))
	srv := httptest.NewTLSServer(mux)
	c, err := client.New(client.Config{Endpoint: srv.URL, Token: "sgt_example", HTTPClient: srv.Client()})
	if err != nil {
		log.Fatal(err)
	}
	return c, srv.Close
}

func ExampleClient_Acquire() {
	c, done := exampleBroker()
	defer done()
	ctx := context.Background()
	// The Idempotency-Key makes a retry safe: the broker answers the same
	// workspace (200) instead of creating a second one.
	ws, created, err := c.Acquire(ctx, "acquire-demo-1", protocol.AcquireRequest{
		Label:  "demo",
		Egress: &protocol.Egress{AllowedDomains: []string{}}, // no network at all
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ws.WorkspaceID, ws.State, created)
	// Output: ws_example running true
}

func ExampleClient_Exec() {
	c, done := exampleBroker()
	defer done()
	res, err := c.Exec(context.Background(), "ws_example", protocol.ExecRequest{Argv: []string{"echo", "hi"}, TimeoutSeconds: 30})
	if err != nil {
		log.Fatal(err)
	}
	out, _ := base64.StdEncoding.DecodeString(res.StdoutB64)
	fmt.Printf("exit %d: %q\n", res.ExitCode, out)
	// Output: exit 0: "hi\n"
}

func ExampleClient_WriteFile() {
	c, done := exampleBroker()
	defer done()
	ctx := context.Background()
	if err := c.WriteFile(ctx, "ws_example", "/workspace/notes/hello.txt", []byte("hello\n")); err != nil {
		log.Fatal(err)
	}
	b, err := c.ReadFile(ctx, "ws_example", "/workspace/notes/hello.txt")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%q\n", b)
	// Output: "hello\n"
}

func ExampleClient_Snapshot() {
	c, done := exampleBroker()
	defer done()
	ctx := context.Background()
	snap, created, err := c.Snapshot(ctx, "ws_example", "snap-demo-1", "/workspace/notes")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(snap.SnapshotID, created)
	// A warm start names it in AcquireRequest.SnapshotID; delete it when done.
	if err := c.DeleteSnapshot(ctx, snap.SnapshotID); err != nil {
		log.Fatal(err)
	}
	// Output: snap_example true
}

func ExampleClient_Release() {
	c, done := exampleBroker()
	defer done()
	ws, err := c.Release(context.Background(), "ws_example")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ws.State, *ws.TerminationReason, *ws.MeteredSeconds)
	// Output: terminated released 120
}
