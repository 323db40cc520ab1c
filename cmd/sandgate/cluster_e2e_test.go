package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/protocol"
)

// TestClusterWalkthrough runs the walk-through against a Redis Cluster
// with two gateways behind one "load balancer" (alternating calls): the
// operator sets up on one, the client acquires on one, writes and execs
// on the other, releases, and the usage reconciles; the concurrency limit
// holds across both gateways.
func TestClusterWalkthrough(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := redistest.StartCluster(t)
	cfg := newServeConfig(t, "", serveOptions{Redis: fmt.Sprintf("  mode: cluster\n  addrs: [%s]\n  wait: {replicas: 1}", strings.Join(c.Addrs, ", "))})
	a, b := startServe(t, cfg), startServe(t, cfg)
	adm := a.Admin(t)
	acct := createAccount(t, adm, "e2e-cluster")
	inst := createInstance(t, adm, acct, 2)
	tok := issueToken(t, adm, inst)
	ca, cb := a.Client(t, tok), b.Client(t, tok)

	lease, err := cb.Lease(ctx)
	if err != nil || lease.Lease.State != "active" {
		t.Fatalf("lease through the second gateway = %+v, %v; want active", lease, err)
	}
	ws := acquire(t, ca, "cluster-1")
	if err := cb.WriteFile(ctx, ws.WorkspaceID, "/workspace/hello.txt", []byte("hello\n")); err != nil {
		t.Fatalf("WriteFile through the second gateway: %v", err)
	}
	res, err := cb.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"cat", "/workspace/hello.txt"}})
	if err != nil || res.ExitCode != 0 || res.StdoutB64 != base64.StdEncoding.EncodeToString([]byte("hello\n")) {
		t.Fatalf("exec cat through the second gateway = %+v, %v; want exit 0 and hello", res, err)
	}
	// The limit of 2 holds across both gateways.
	ws2 := acquire(t, cb, "cluster-2")
	_, _, err = ca.Acquire(ctx, "cluster-3", protocol.AcquireRequest{Label: "e2e", Egress: noEgress()})
	wantCode(t, "a third acquire across two gateways", err, 429, protocol.ConcurrencyLimit)

	for _, r := range []struct {
		c  *client.Client
		id string
	}{{cb, ws.WorkspaceID}, {ca, ws2.WorkspaceID}} {
		got, err := r.c.Release(ctx, r.id)
		if err != nil || got.State != "terminated" || got.MeteredSeconds == nil {
			t.Fatalf("release %s on the other gateway = %+v, %v; want terminated with metered seconds", r.id, got, err)
		}
	}
	out := runCLI(t, a.AdminEnv(), "usage", "reconcile", "--account", acct)
	if !strings.Contains(out, acct+" ok") {
		t.Fatalf("usage reconcile on the cluster: %s", out)
	}
	live, err := ca.ListWorkspaces(ctx, "live", "", 0)
	if err != nil || len(live.Workspaces) != 0 {
		t.Fatalf("after the walk-through, live workspaces = %v, %v; want none", live, err)
	}
}
