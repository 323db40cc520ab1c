//go:build linux

package main

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/modal"
	"github.com/sandgate/sandgate/providers/modal/modaltest"
)

// modalSandboxOf returns the id of the sandbox the fake Modal runs for
// workspace id.
func modalSandboxOf(t testing.TB, fake *modaltest.Server, id string) string {
	t.Helper()
	for _, sb := range fake.Sandboxes() {
		for _, tg := range sb.Request.GetTags() {
			if tg.GetTagName() == providers.LabelWorkspace && tg.GetTagValue() == id {
				return sb.ID
			}
		}
	}
	t.Fatalf("Modal runs no sandbox tagged with workspace %s", id)
	return ""
}

// killAtModal ends sandbox ref vendor-side, as Modal does on its own (a
// crash, an operator in Modal's console), straight through the vendor
// API and not through any gateway.
func killAtModal(t testing.TB, fake *modaltest.Server, ref string) {
	t.Helper()
	p, err := modal.New(context.Background(), modal.Config{ServerURL: fake.URL, TokenID: modalTokenID, TokenSecret: modalTokenSecret, RootCAs: fake.CertPool},
		providers.Env{BrokerID: "vendor-console"})
	if err != nil {
		t.Fatalf("modal.New: %v", err)
	}
	defer p.Close()
	if err := p.Terminate(context.Background(), providers.Sandbox{Ref: ref}); err != nil {
		t.Fatalf("terminate at Modal: %v", err)
	}
}

// vendorTruthWorkspace starts a gateway on a fake Modal with the given
// reaper.reconcile_interval and one workspace of an instance of one slot
// called name, and returns the fake, the instance's client and the
// workspace.
func vendorTruthWorkspace(t *testing.T, reconcile, name string) (*modaltest.Server, *client.Client, *protocol.Workspace) {
	t.Helper()
	fake, env, _, cfg := startModalServe(t)
	appendConfig(t, cfg, "reaper:\n  reconcile_interval: "+reconcile+"\n")
	gw := startServeEnv(t, cfg, env...)
	_, _, tok := obligationsInstance(t, gw, "e2e-"+name, 1, time.Hour)
	c := gw.Client(t, tok)
	return fake, c, acquire(t, c, name+"-1")
}

// wantEndedBy checks that ws ended (failed) no later than by, with its
// metering stopped there, and that the instance's only slot is free: a
// new workspace is admitted.
func wantEndedBy(t *testing.T, c *client.Client, id string, killed, by time.Time) {
	t.Helper()
	w, err := c.Workspace(context.Background(), id)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	if w.TerminatedAt == nil || w.MeteredSeconds == nil {
		t.Fatalf("workspace = %s; want terminated_at and metered_seconds", mustJSON(t, w))
	}
	end, err := time.Parse(time.RFC3339, *w.TerminatedAt)
	if err != nil {
		t.Fatalf("terminated_at %q: %v", *w.TerminatedAt, err)
	}
	if end.Before(killed.Truncate(time.Second)) || end.After(by) {
		t.Errorf("terminated_at %s; want between the vendor's kill %s and %s", end.Format(time.RFC3339Nano), killed.Format(time.RFC3339Nano), by.Format(time.RFC3339Nano))
	}
	created, _ := time.Parse(time.RFC3339, w.CreatedAt)
	if max := int64(by.Sub(created)/time.Second) + 1; *w.MeteredSeconds > max {
		t.Errorf("metered_seconds = %d; want at most %d (metering stops when the vendor's end is learned)", *w.MeteredSeconds, max)
	}
	ws2, created2, err := c.Acquire(context.Background(), "vendor-truth-next-"+id, protocol.AcquireRequest{Label: "e2e", Egress: noEgress()})
	if err != nil || !created2 {
		t.Fatalf("acquire after the vendor's end: %v (created %v); want 201: the slot is free", err, created2)
	}
	if _, err := c.Release(context.Background(), ws2.WorkspaceID); err != nil {
		t.Errorf("release: %v", err)
	}
}

// TestVendorKillReconciled: a sandbox Modal ended on its own, with no
// request touching the workspace, is found missing from Modal's listing
// by the reaper within its reconcile interval: the workspace reads
// terminated (failed), its metering stopped then and its slot is free.
func TestVendorKillReconciled(t *testing.T) {
	t.Parallel()
	fake, c, ws := vendorTruthWorkspace(t, "1s", "vendor-kill")
	ref := modalSandboxOf(t, fake, ws.WorkspaceID)
	time.Sleep(1100 * time.Millisecond) // confirmed running longer than the reconcile interval

	killed := time.Now()
	killAtModal(t, fake, ref)
	waitTerminated(t, c, ws.WorkspaceID, "failed")
	found := time.Now()
	// The reaper passes every 2 s and compares every 1 s: the end is
	// recorded at the listing that missed the sandbox.
	if found.Sub(killed) > 20*time.Second {
		t.Errorf("the end was recorded %v after the vendor's kill; want within the reaper's period", found.Sub(killed))
	}
	wantEndedBy(t, c, ws.WorkspaceID, killed, found)

	// It is no longer live.
	list, err := c.ListWorkspaces(context.Background(), "live", "", 100)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	for _, w := range list.Workspaces {
		if w.WorkspaceID == ws.WorkspaceID {
			t.Errorf("the ended workspace is still listed live: %s", mustJSON(t, w))
		}
	}
}

// TestVendorGoneOnExec: the first exec after Modal ended the sandbox
// answers 410 workspace_gone and, by the time it answers, the workspace
// reads terminated (failed) with its slot free, with the reaper's
// comparison turned off.
func TestVendorGoneOnExec(t *testing.T) {
	t.Parallel()
	fake, c, ws := vendorTruthWorkspace(t, "-1s", "vendor-gone-exec")

	killed := time.Now()
	killAtModal(t, fake, modalSandboxOf(t, fake, ws.WorkspaceID))
	_, err := c.Exec(context.Background(), ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"true"}})
	var cerr *client.Error
	if !errors.As(err, &cerr) || cerr.Status != 410 || cerr.Code != protocol.WorkspaceGone {
		t.Fatalf("exec after the vendor's end: %v; want 410 workspace_gone", err)
	}
	answered := time.Now()
	w, err := c.Workspace(context.Background(), ws.WorkspaceID)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	if w.State != "terminated" || w.TerminationReason == nil || *w.TerminationReason != "failed" {
		t.Fatalf("workspace after the 410 = %s; want terminated, failed", mustJSON(t, w))
	}
	wantEndedBy(t, c, ws.WorkspaceID, killed, answered)
}

// TestForeignUnconfirmedCreateSwept: a gateway with its own broker id,
// SIGKILLed after Modal created a sandbox and before the record was
// confirmed, leaves a starting record and a running sandbox tagged with
// that broker id; the only gateway left, with another broker id, records
// the workspace failed and ends the sandbox on Modal.
func TestForeignUnconfirmedCreateSwept(t *testing.T) {
	t.Parallel()
	unconfirmedModalCreate(t, "foreign-unknown-create", []string{"SANDGATE_BROKER_ID=sandgate-crashed"}, []string{"SANDGATE_BROKER_ID=sandgate-survivor"})
}

// unconfirmedModalCreate SIGKILLs a gateway (with crashedEnv) after Modal
// created a workspace's sandbox and before the record was confirmed, then
// starts another (with survivorEnv) and checks that it records the
// workspace failed and ends the sandbox on Modal.
func unconfirmedModalCreate(t *testing.T, name string, crashedEnv, survivorEnv []string) {
	t.Helper()
	ctx := context.Background()
	fake, env, _, cfg := startModalServe(t)
	appendConfig(t, cfg, "admission:\n  pending_timeout: 3s\n")
	pause := t.TempDir()
	gwA := startServeEnv(t, cfg, slices.Concat(env, crashedEnv, []string{"SANDGATE_TEST_PAUSE_AFTER_CREATE=" + pause})...)
	_, _, tok := obligationsInstance(t, gwA, "e2e-"+name, 1, time.Hour)

	id, acqDone := acquirePausedAfterCreate(ctx, t, gwA, tok, pause, name)
	gwA.kill()
	<-acqDone
	ref := modalSandboxOf(t, fake, id)
	if sb := fakeSandboxByID(fake, ref); sb == nil || sb.Result != nil {
		t.Fatalf("Modal runs no sandbox tagged with workspace %s", id)
	}

	gwB := startServeEnv(t, cfg, slices.Concat(env, survivorEnv)...)
	waitTerminated(t, gwB.Client(t, tok), id, "failed")
	waitModalEnded(t, fake, ref)
}

// fakeSandboxByID returns the fake Modal's sandbox ref, nil when none.
func fakeSandboxByID(fake *modaltest.Server, ref string) *modaltest.Sandbox {
	for _, sb := range fake.Sandboxes() {
		if sb.ID == ref {
			return &sb
		}
	}
	return nil
}

// waitModalEnded waits until the fake Modal has ended sandbox ref.
func waitModalEnded(t testing.TB, fake *modaltest.Server, ref string) {
	t.Helper()
	waitFor(t, "Modal to end sandbox "+ref, func() (bool, error) {
		sb := fakeSandboxByID(fake, ref)
		if sb == nil {
			return false, errors.New("no such sandbox")
		}
		return sb.Result != nil, errors.New("still running")
	})
}

// TestModalLifetimeClamped: an instance whose scope allows 48 h on Modal,
// which ends every sandbox within 24 h, has a lease advertising 24 h, and
// its acquire runs (201) with expires_at 24 h away at most, instead of a
// 502 on every try.
func TestModalLifetimeClamped(t *testing.T) {
	t.Parallel()
	_, env, _, cfg := startModalServe(t)
	gw := startServeEnv(t, cfg, env...)
	_, _, tok := obligationsInstance(t, gw, "e2e-modal-48h", 1, 48*time.Hour)
	c := gw.Client(t, tok)
	lease, err := c.Lease(context.Background())
	if err != nil {
		t.Fatalf("lease: %v", err)
	}
	if got := lease.Limits.MaxLifetimeSeconds; got != 24*3600 {
		t.Errorf("lease max_lifetime_seconds = %d; want 86400, what Modal honours", got)
	}
	if got := lease.Limits.IdleTimeoutSeconds; got > 24*3600 {
		t.Errorf("lease idle_timeout_seconds = %d; want at most 86400", got)
	}
	before := time.Now()
	ws := acquire(t, c, "modal-48h-1")
	expires, err := time.Parse(time.RFC3339, ws.ExpiresAt)
	if err != nil {
		t.Fatalf("expires_at %q: %v", ws.ExpiresAt, err)
	}
	if expires.After(before.Add(24*time.Hour + time.Second)) {
		t.Errorf("expires_at %s; want within 24 h of the acquire", ws.ExpiresAt)
	}
	if _, err := c.Exec(context.Background(), ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Errorf("exec: %v", err)
	}
}
