//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/modal"
	"github.com/sandgate/sandgate/providers/modal/modaltest"
	"github.com/sandgate/sandgate/providers/modal/proto/clientpb"
)

// Credentials of the fake Modal; the secret is planted for the log scans.
const (
	modalTokenID     = "ak-e2e-modal-id"
	modalTokenSecret = "as-e2e-modal-secret-PLANTED"
)

// startModal runs a fake Modal server in the test process and returns the
// environment a broker needs to use it: the variables Modal's SDKs read,
// and SSL_CERT_FILE naming the fake's CA.
func startModal(t testing.TB) (*modaltest.Server, []string) {
	t.Helper()
	fake, err := modaltest.Start(t.Context(), modaltest.Config{TokenID: modalTokenID, TokenSecret: modalTokenSecret, DataDir: t.TempDir()})
	if err != nil {
		t.Fatalf("modaltest.Start: %v", err)
	}
	t.Cleanup(fake.Close)
	return fake, []string{
		"MODAL_SERVER_URL=" + fake.URL,
		"MODAL_TOKEN_ID=" + modalTokenID,
		"MODAL_TOKEN_SECRET=" + modalTokenSecret,
		"SSL_CERT_FILE=" + fake.CAFile,
	}
}

// TestModalWalkthrough runs the README's curl walk-through verbatim, with
// its snapshot, warm start and durable command block before the release,
// against `sandgate dev --provider modal` pointed at a fake Modal over TLS
// (MODAL_SERVER_URL, the token variables and SSL_CERT_FILE), with the real
// binaries and curl. Then it checks what Modal saw and scans the broker's
// output for the credentials.
func TestModalWalkthrough(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "curl", "sed", "date"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the walk-through needs %s: %v", tool, err)
		}
	}
	fake, env := startModal(t)
	d := startDevWith(t, env, "--provider", "modal")

	// The walk-through, then its "Snapshots and durable commands" section,
	// in the same shell, as the README says.
	script := "set -euo pipefail\n" + readmeBlock(t, "## Walk-through with curl") + readmeBlock(t, "### Snapshots and durable commands")
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = d.workDir
	cmd.Env = cleanEnv()
	out, stderr := runScript(t, "walk-through", cmd, d.Logs)
	for _, want := range []string{
		`"admission":{"state":"open"}`,
		"workspace: ws_",
		`"stdout_b64":"aGkK"`,
		`"contents_b64":"aGVsbG8K"`,
		`"state":"running"`, // the warm start
		`"state":"terminated"`,
		`"termination_reason":"released"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("walk-through output lacks %s", want)
		}
	}
	// The file read back in the walk-through, and again in the warm start.
	if n := strings.Count(out, `"contents_b64":"aGVsbG8K"`); n < 2 {
		t.Errorf("the file was read back %d times; want 2 (the warm start has it too)", n)
	}
	if n := strings.Count(out, `"workspace_id":"ws_`); n < 2 {
		t.Errorf("walk-through output has %d workspace ids; want the warm start and the release", n)
	}
	if t.Failed() {
		t.Logf("walk-through output:\n%s\nstderr:\n%s", out, stderr)
	}

	// What Modal saw: sandboxes tagged with the broker's ids only, with
	// limits equal to requests and no public egress.
	sbs := fake.Sandboxes()
	if len(sbs) < 2 {
		t.Fatalf("Modal saw %d sandboxes; want the workspace and the warm start", len(sbs))
	}
	for _, sb := range sbs {
		tags := map[string]string{}
		for _, tg := range sb.Request.GetTags() {
			tags[tg.GetTagName()] = tg.GetTagValue()
		}
		if len(tags) != 3 || tags[providers.LabelBroker] != "sandgate-dev" || !strings.HasPrefix(tags[providers.LabelWorkspace], "ws_") ||
			!strings.HasPrefix(tags[providers.LabelInstance], "inst_") {
			t.Errorf("sandbox %s tags = %v; want the broker, instance and workspace ids only", sb.ID, tags)
		}
		def := sb.Request.GetDefinition()
		r := def.GetResources()
		if r.GetMilliCpu() == 0 || r.GetMilliCpu() != r.GetMilliCpuMax() || r.GetMemoryMb() != r.GetMemoryMbMax() {
			t.Errorf("sandbox %s resources = %v; want limits equal to requests", sb.ID, r)
		}
		if na := def.GetNetworkAccess(); na.GetNetworkAccessType() != clientpb.NetworkAccess_ALLOWLIST || len(na.GetAllowedDomains()) != 0 {
			t.Errorf("sandbox %s network = %v; want an empty allowlist", sb.ID, na)
		}
		if def.GetTimeoutSecs() == 0 || def.IdleTimeoutSecs == nil {
			t.Errorf("sandbox %s: timeout %d, idle %v; want both vendor-side", sb.ID, def.GetTimeoutSecs(), def.IdleTimeoutSecs)
		}
	}

	d.stop()
	logs := d.Logs()
	for what, secret := range map[string]string{"the Modal token secret": modalTokenSecret, "the Modal token id": modalTokenID} {
		if strings.Contains(logs, secret) {
			t.Errorf("the broker's output contains %s", what)
		}
	}
}

// modalServe is the providers block of a serve config with the Modal
// provider as the default.
const modalServe = "providers:\n  - {name: local, kind: local}\n  - {name: modal, kind: modal}\ndefault_provider: modal"

// startModalServe starts a fake Modal and a Redis, and writes a serve
// config for them with Modal the default provider; env is what a gateway
// needs to reach the fake.
func startModalServe(t testing.TB) (fake *modaltest.Server, env []string, rs *redistest.Server, cfg *serveConfig) {
	t.Helper()
	fake, env = startModal(t)
	rs = startRedis(t)
	return fake, env, rs, newServeConfig(t, rs.Addr, serveOptions{Providers: modalServe})
}

// TestModalOrphanSweep: a sandbox created on Modal straight through the
// provider, with this broker's tags and no record, is terminated by the
// running gateway's reaper (found by SandboxList with the broker's tag);
// another broker's sandbox is left alone.
func TestModalOrphanSweep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fake, env, _, cfg := startModalServe(t)
	gw := startServeEnv(t, cfg, env...)
	_, inst, _ := obligationsInstance(t, gw, "e2e-modal-orphans", 1, time.Hour)

	newProv := func(broker string) *modal.Provider {
		p, err := modal.New(ctx, modal.Config{ServerURL: fake.URL, TokenID: modalTokenID, TokenSecret: modalTokenSecret, RootCAs: fake.CertPool},
			providers.Env{BrokerID: broker})
		if err != nil {
			t.Fatalf("modal.New: %v", err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	create := func(p *modal.Provider, inst string) (string, string) {
		id := sandgate.NewID(sandgate.PrefixWorkspace)
		sb, err := p.Create(ctx, providers.CreateSpec{WorkspaceID: id, InstanceID: inst, Size: modal.Sizes[0],
			Egress: sandgate.EgressPolicy{AllowedDomains: []string{}}, ExpiresAt: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatalf("provider create: %v", err)
		}
		return id, sb.Ref
	}
	foreign, foreignRef := create(newProv("another-broker"), inst)
	ours := newProv("sandgate-e2e")
	orphan, orphanRef := create(ours, inst)
	waitFor(t, "orphan "+orphan+" to be terminated and logged", func() (bool, error) {
		logged := false
		for _, l := range logLines(gw.Logs(), "reaper terminated an orphan") {
			logged = logged || l[sandgate.KeyWorkspaceID] == orphan
		}
		for _, sb := range fake.Sandboxes() {
			if sb.ID == orphanRef {
				return logged && sb.Result != nil, fmt.Errorf("logged %v, result %v", logged, sb.Result)
			}
		}
		return false, errors.New("no such sandbox")
	})
	for _, sb := range fake.Sandboxes() {
		if sb.ID == foreignRef && sb.Result != nil {
			t.Errorf("another broker's sandbox (workspace %s) was ended: %v", foreign, sb.Result)
		}
	}
}

// TestModalLifetimeEndsWithoutGateways: a workspace with a short
// lifetime on Modal ends at expires_at with every gateway process stopped,
// by Modal itself (its sandbox timeout), background processes included;
// a gateway started afterwards records it expired.
func TestModalLifetimeEndsWithoutGateways(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fake, env, rs, cfg := startModalServe(t)
	gw := startServeEnv(t, cfg, env...)
	acct, _, tok := obligationsInstance(t, gw, "e2e-modal-lifetime", 1, shortLifetime)
	c := gw.Client(t, tok)
	ws := acquire(t, c, "modal-lifetime-1")
	if _, err := c.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"sh", "-c", "sleep 600 >/dev/null 2>&1 &"}}); err != nil {
		t.Fatalf("Exec: %v", err)
	}
	expires, err := time.Parse(time.RFC3339, ws.ExpiresAt)
	if err != nil {
		t.Fatalf("expires_at %q: %v", ws.ExpiresAt, err)
	}
	gw.kill()

	var ended *modaltest.Sandbox
	waitFor(t, "Modal to end the sandbox with no gateway running", func() (bool, error) {
		for _, sb := range fake.Sandboxes() {
			if sb.Result != nil {
				ended = &sb
				return true, nil
			}
		}
		return false, errors.New("still running")
	})
	if ended.Result.GetStatus() != clientpb.GenericResult_GENERIC_STATUS_TIMEOUT {
		t.Errorf("the sandbox ended %v; want Modal's TIMEOUT", ended.Result.GetStatus())
	}
	if late := time.Since(expires); late > 5*time.Second {
		t.Errorf("the sandbox ended %v after expires_at; want at it", late)
	}

	gw2 := startServeEnv(t, cfg, env...)
	if r := waitRecordTerminated(t, rs.Client(), acct, ws.WorkspaceID); r != "expired" {
		t.Errorf("workspace %s ended %q; want expired", ws.WorkspaceID, r)
	}
	waitTerminated(t, gw2.Client(t, tok), ws.WorkspaceID, "expired")
}

// TestModalUnconfirmedCreate: a gateway SIGKILLed after Modal created the
// sandbox and before the record was confirmed leaves a starting record and
// a running sandbox; a gateway started afterwards finds the sandbox by its
// tags, ends it on Modal and records the workspace failed.
func TestModalUnconfirmedCreate(t *testing.T) {
	t.Parallel()
	unconfirmedModalCreate(t, "modal-unknown-create", nil, nil)
}
