//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/internal/broker"
	"github.com/sandgate/sandgate/internal/fakeprovider"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/saga"
	"github.com/sandgate/sandgate/token"
)

// inProcess is one broker run in this test process with the real wiring
// (New, Run) and a provider registry of the test's.
type inProcess struct {
	URL, AdminURL string
	cancel        context.CancelFunc
	done          chan error
}

// startInProcess runs b until the test ends or stop is called.
func startInProcess(t *testing.T, cfg *broker.Config, rdb *redis.Client, reg providers.Registry, adminTok string) (*inProcess, func()) {
	t.Helper()
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	discardWorkspaces(t, cfg.DataDir, cfg.BrokerID)
	cert, _, err := broker.DevCerts(cfg.DataDir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Operators = append(cfg.Operators, broker.OperatorConfig{Name: "t", Role: "admin", TokenSHA256: token.Hash(sandgate.Secret(adminTok))})
	public, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b, err := broker.New(ctx, *cfg, broker.Options{Redis: rdb, Log: log, TLS: broker.ServerTLS(cert), Kinds: reg, Getenv: func(string) string { return "" },
		Public: public, Admin: adminLn})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		err := b.Run(ctx)
		b.Close()
		done <- err
	}()
	p := &inProcess{URL: "https://" + public.Addr().String(), AdminURL: "http://" + adminLn.Addr().String(), cancel: cancel, done: done}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("broker.run: %v", err)
		}
	}
	t.Cleanup(stop)
	return p, stop
}

// fakeKind is a registry entry that opens the one fake: a broker restarted
// over the same registry finds the sandboxes it created before.
func fakeKind(fake *fakeprovider.Provider) providers.Opener {
	return func(_ context.Context, _ string, raw yaml.Node, env providers.Env) (providers.Provider, error) {
		var s struct{}
		if err := providers.DecodeSettings(raw, &s); err != nil {
			return nil, err
		}
		fake.Set(func(p *fakeprovider.Provider) { p.BrokerID = env.BrokerID })
		return fake, nil
	}
}

// twoProviderConfig is a broker config with the local provider (the
// default) and the fake as "second"; acceptNew is the second's accept_new.
func twoProviderConfig(t *testing.T, dataDir, redisAddr string, acceptNew bool) *broker.Config {
	t.Helper()
	y := fmt.Sprintf(`
data_dir: %s
broker_id: sandgate-two
redis: {addr: %q}
providers:
  - {name: local, kind: local}
  - {name: second, kind: fake, accept_new: %t}
default_provider: local
`, dataDir, redisAddr, acceptNew)
	return loadConfigText(t, y)
}

// loadConfigText loads the broker config y, with no environment.
func loadConfigText(t *testing.T, y string) *broker.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sandgate.yaml")
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := broker.LoadConfig(path, func(string) string { return "" })
	if err != nil {
		t.Fatalf("loadConfig: %v", err)
	}
	return cfg
}

// TestTwoProvidersOneBroker: instances pinned to each of two providers get
// their workspaces there; once the second takes no new work, its existing
// workspaces are still exec'd, released, reaped at expiry and its orphans
// swept through it, while new acquires on its instances are refused.
func TestTwoProvidersOneBroker(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	dataDir := t.TempDir()
	fake := fakeprovider.New()
	reg := providers.Registry{"local": local.Open, "fake": fakeKind(fake)}
	const adminTok = "sgo_two-provider-test-admin-token"
	ctx := context.Background()

	b1, stop1 := startInProcess(t, twoProviderConfig(t, dataDir, rs.Addr, true), rs.Client(), reg, adminTok)
	roots := loadPool(t, filepath.Join(dataDir, "ca.pem"))
	adm := newAdminClient(t, b1.AdminURL, adminTok)
	acct := createAccount(t, adm, "two")
	mkInstance := func(provider string, lifetime int64) adminapi.Instance {
		t.Helper()
		req := adminapi.CreateInstanceRequest{AccountID: acct, Name: "two", Provider: provider}
		req.Scope.Limits.MaxConcurrentWorkspaces = 10
		req.Scope.Limits.MaxLifetimeSeconds = lifetime
		if provider == "second" {
			req.Scope.AnyEgress = true // the fake filters egress natively
		}
		var in adminapi.Instance
		if err := adm.Do(ctx, http.MethodPost, "/instances", req, &in); err != nil {
			t.Fatalf("create instance on %q: %v", provider, err)
		}
		return in
	}
	onLocal, onSecond, shortLived := mkInstance("", 0), mkInstance("second", 0), mkInstance("second", 3)
	if onLocal.Provider != "local" || onSecond.Provider != "second" {
		t.Fatalf("instance providers = %q, %q; want local, second", onLocal.Provider, onSecond.Provider)
	}
	cl := func(b *inProcess, in adminapi.Instance) *client.Client {
		return newClient(t, b.URL, roots, issueToken(t, adm, in.ID))
	}
	cLocal, cSecond, cShort := cl(b1, onLocal), cl(b1, onSecond), cl(b1, shortLived)

	// The lease shows each provider's own sizes and images.
	lease, err := cSecond.Lease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lease.Images.Default != "fake" || lease.Admission.State != protocol.AdmissionOpen {
		t.Errorf("second's lease: images.default %q, admission %q; want fake, open", lease.Images.Default, lease.Admission.State)
	}
	lease, err = cLocal.Lease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lease.Images.Default != local.Image || lease.Egress.Ceiling == nil || len(lease.Egress.Ceiling) != 0 {
		t.Errorf("local's lease: images.default %q, ceiling %v; want %q, []", lease.Images.Default, lease.Egress.Ceiling, local.Image)
	}

	wLocal := acquire(t, cLocal, "k-local")
	wSecond := acquire(t, cSecond, "k-second")
	wGone := acquire(t, cSecond, "k-second-released")
	wShort := acquire(t, cShort, "k-short")
	if _, err := cLocal.Exec(ctx, wLocal.WorkspaceID, protocol.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatalf("exec on local: %v", err)
	}
	listed := func() map[string]bool {
		sbs, err := fake.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, sb := range sbs {
			out[sb.Labels[providers.LabelWorkspace]] = true
		}
		return out
	}
	at := listed()
	if !at[wSecond.WorkspaceID] || !at[wShort.WorkspaceID] || at[wLocal.WorkspaceID] {
		t.Fatalf("fake holds %v; want %s and %s, not the local %s", at, wSecond.WorkspaceID, wShort.WorkspaceID, wLocal.WorkspaceID)
	}
	stop1()

	// The second provider stops taking new work; one broker restarts with
	// that config over the same Redis and the same sandboxes.
	b2, _ := startInProcess(t, twoProviderConfig(t, dataDir, rs.Addr, false), rs.Client(), reg, adminTok)
	adm = newAdminClient(t, b2.AdminURL, adminTok)
	cSecond, cLocal, cShort = cl(b2, onSecond), cl(b2, onLocal), cl(b2, shortLived)

	res, err := cSecond.Exec(ctx, wSecond.WorkspaceID, protocol.ExecRequest{Argv: []string{"echo", "still", "served"}})
	if err != nil {
		t.Fatalf("exec on the closed provider's workspace: %v", err)
	}
	if res.ExitCode != 0 {
		t.Errorf("exec exit code %d; want 0", res.ExitCode)
	}
	_, _, err = cSecond.Acquire(ctx, "k-new-on-closed", protocol.AcquireRequest{Label: "e2e", Egress: noEgress()})
	wantCode(t, "acquire on a provider with accept_new: false", err, http.StatusForbidden, protocol.Paused)
	var ce *client.Error
	if errors.As(err, &ce) && ce.Details["reason"] != saga.ReasonProviderClosed {
		t.Errorf("refusal details %v; want reason %q", ce.Details, saga.ReasonProviderClosed)
	}
	if lease, err := cSecond.Lease(ctx); err != nil || lease.Admission.State != protocol.AdmissionPaused || lease.Admission.Reason != saga.ReasonProviderClosed {
		t.Errorf("closed provider's lease admission = %+v, %v; want paused %s", lease, err, saga.ReasonProviderClosed)
	}
	acquire(t, cLocal, "k-local-2") // the default provider still takes new work

	rel, err := cSecond.Release(ctx, wGone.WorkspaceID)
	if err != nil || rel.State != "terminated" {
		t.Fatalf("release on the closed provider: %+v, %v; want terminated", rel, err)
	}
	if listed()[wGone.WorkspaceID] {
		t.Errorf("released workspace %s still at the closed provider", wGone.WorkspaceID)
	}

	// An orphan at the closed provider: a sandbox with this broker's labels
	// and no record.
	orphan := providers.CreateSpec{WorkspaceID: sandgate.NewID(sandgate.PrefixWorkspace), InstanceID: onSecond.ID}
	if _, err := fake.Create(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reaper to end the expired workspace and the orphan at the closed provider", func() (bool, error) {
		at := listed()
		return !at[wShort.WorkspaceID] && !at[orphan.WorkspaceID], nil
	})
	if !listed()[wSecond.WorkspaceID] {
		t.Errorf("the live workspace %s was swept from the closed provider", wSecond.WorkspaceID)
	}
	// Past its expires_at a client reads 410 (spec: every operation); the
	// record itself is the operator's to read.
	var w adminapi.Workspace
	waitFor(t, "the expired workspace's record to end", func() (bool, error) {
		err := adm.Do(ctx, http.MethodGet, "/workspaces/"+wShort.WorkspaceID, nil, &w)
		return err == nil && w.State == "terminated", fmt.Errorf("state %s, %v", w.State, err)
	})
	if w.TerminationReason == nil || *w.TerminationReason != string(sandgate.ReasonExpired) {
		t.Errorf("short-lived workspace reason %v; want expired", w.TerminationReason)
	}
	_, err = cShort.Workspace(ctx, wShort.WorkspaceID)
	wantCode(t, "the status of the expired workspace", err, http.StatusGone, protocol.WorkspaceGone)
}

// TestInstanceScopeAgainstProvider: the operator API refuses a scope the
// instance's provider cannot enforce or run, and a provider nobody
// configured, naming the provider and the field.
func TestInstanceScopeAgainstProvider(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	dataDir := t.TempDir()
	const adminTok = "sgo_scope-test-admin-token-000"
	fake := fakeprovider.New()
	fake.Caps = &providers.Capabilities{Egress: providers.EgressNative, Images: []string{"only:1"}, DefaultImage: "only:1",
		Sizes: []sandgate.Size{{Name: "small", CPUCores: 1, MemoryMiB: 512}}}
	b, _ := startInProcess(t, twoProviderConfig(t, dataDir, rs.Addr, true), rs.Client(),
		providers.Registry{"local": local.Open, "fake": fakeKind(fake)}, adminTok)
	adm := newAdminClient(t, b.AdminURL, adminTok)
	acct := createAccount(t, adm, "scope")
	ceiling := []string{"github.com"}
	tests := []struct {
		name  string
		req   adminapi.CreateInstanceRequest
		want  []string // words the refusal must name; nil: created
		field string
	}{
		{"local cannot filter domains", adminapi.CreateInstanceRequest{Scope: adminapi.Scope{EgressCeiling: &ceiling}}, []string{`"local"`, "egress_ceiling"}, ""},
		{"local any egress", adminapi.CreateInstanceRequest{Scope: adminapi.Scope{AnyEgress: true}}, []string{`"local"`, "egress_ceiling"}, ""},
		{"local image", adminapi.CreateInstanceRequest{Scope: adminapi.Scope{Images: []string{"debian:12"}, DefaultImage: "debian:12"}}, []string{`"local"`, "image"}, ""},
		{"second size", adminapi.CreateInstanceRequest{Provider: "second", Scope: adminapi.Scope{Sizes: []string{"small", "xlarge"}}}, []string{`"second"`, "sizes", "xlarge"}, ""},
		{"second image", adminapi.CreateInstanceRequest{Provider: "second", Scope: adminapi.Scope{DefaultImage: "other:2"}}, []string{`"second"`, "default_image"}, ""},
		{"unknown provider", adminapi.CreateInstanceRequest{Provider: "nope"}, []string{`"nope"`}, ""},
		{"second with its size and domains", adminapi.CreateInstanceRequest{Provider: "second", Scope: adminapi.Scope{Sizes: []string{"small"}, EgressCeiling: &ceiling}}, nil, ""},
		{"local with no egress", adminapi.CreateInstanceRequest{}, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.AccountID = acct
			var in adminapi.Instance
			err := adm.Do(context.Background(), http.MethodPost, "/instances", tt.req, &in)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("create: %v; want created", err)
				}
				return
			}
			var ae *adminapi.APIError
			if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Code != protocol.InvalidRequest {
				t.Fatalf("create: %v; want 400 invalid_request", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(ae.Message, w) {
					t.Errorf("message %q does not name %s", ae.Message, w)
				}
			}
		})
	}
}
