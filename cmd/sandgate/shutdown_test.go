//go:build linux

package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/internal/fakeprovider"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
)

// TestShutdownCutsRequestsBeforeClosingProviders: a request still in a
// provider at shutdown_timeout has its context ended, and the broker
// closes that provider only after the call has returned, so a provider
// never has a call running into its Close.
func TestShutdownCutsRequestsBeforeClosingProviders(t *testing.T) {
	t.Parallel()
	rs := startRedis(t)
	dataDir := t.TempDir()
	cfg := loadConfigText(t, fmt.Sprintf(`
data_dir: %s
broker_id: sandgate-shutdown
redis: {addr: %q}
shutdown_timeout: 300ms
providers:
  - {name: fake, kind: fake}
default_provider: fake
`, dataDir, rs.Addr))
	fake := fakeprovider.New()
	const adminTok = "sgo_shutdown-test-admin-token"
	b, stop := startInProcess(t, cfg, rs.Client(), providers.Registry{"fake": fakeKind(fake)}, adminTok)
	ctx := context.Background()
	adm := newAdminClient(t, b.AdminURL, adminTok)
	req := adminapi.CreateInstanceRequest{AccountID: createAccount(t, adm, "shutdown"), Name: "shutdown"}
	req.Scope.Limits.MaxConcurrentWorkspaces = 1
	req.Scope.AnyEgress = true // the fake filters egress natively
	var in adminapi.Instance
	if err := adm.Do(ctx, http.MethodPost, "/instances", req, &in); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, b.URL, loadPool(t, filepath.Join(dataDir, "ca.pem")), issueToken(t, adm, in.ID))
	ws := acquire(t, c, "k-shutdown")

	// The exec stays in the provider until its context ends, then takes a
	// while to unwind, as a vendor call being torn down does.
	entered, returned := make(chan struct{}), make(chan struct{})
	var closedAtReturn bool
	fake.Set(func(p *fakeprovider.Provider) {
		p.ExecHook = func(ctx context.Context, _ providers.ExecSpec) error {
			close(entered)
			<-ctx.Done()
			time.Sleep(200 * time.Millisecond)
			closedAtReturn = fake.Closed()
			close(returned)
			return ctx.Err()
		}
	})
	execErr := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"true"}})
		execErr <- err
	}()
	<-entered
	stop()

	select {
	case <-returned:
	default:
		t.Fatal("the broker stopped while its exec was still in the provider, its context never ended")
	}
	if closedAtReturn {
		t.Error("the provider was closed while the exec was still in it")
	}
	if !fake.Closed() {
		t.Error("the broker did not close its provider")
	}
	if err := <-execErr; err == nil {
		t.Error("an exec cut at shutdown answered as if it had run")
	}
}
