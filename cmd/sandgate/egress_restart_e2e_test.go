//go:build linux

package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"

	"github.com/sandgate/sandgate/protocol"
)

// TestVendorEgressAfterRestart: a Fly Machines workspace's egress through
// the broker's proxy survives the broker: after `sandgate serve` is
// killed (SIGKILL) and started again on the same store, the same
// workspace still fetches allowed.sg.test and still cannot reach
// denied.sg.test (docs/egress.md, "Credentials").
func TestVendorEgressAfterRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	site, siteEnv := egressSite(t)
	f := startFakeFly(t)
	rs := startRedis(t)
	cfg := newServeConfig(t, rs.Addr, serveOptions{Providers: fmt.Sprintf(
		"providers:\n  - {name: local, kind: local}\n  - {name: fly-machines, kind: fly-machines, app: %q, org: sandgate-org}\ndefault_provider: fly-machines",
		"sandgate-egdur-"+randHex(4))})
	// The guests dial the vendor URL they were created with: the restarted
	// broker listens on the same address.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	vendorAddr := l.Addr().String()
	l.Close()
	env := append([]string{"FLY_API_TOKEN=" + f.token, "FLY_FLAPS_BASE_URL=" + f.url, "SSL_CERT_FILE=" + f.caFile,
		"SANDGATE_EGRESS_VENDOR_LISTEN=" + vendorAddr, "SANDGATE_EGRESS_VENDOR_URL=https://" + vendorAddr,
		"SANDGATE_EGRESS_VENDOR_CA_FILE=" + cfg.PKI.CAPath}, siteEnv...)
	gw := startServeEnv(t, cfg, env...)
	_, tok := anyEgressInstance(t, gw.Admin(t))

	ws, _, err := gw.Client(t, tok).Acquire(ctx, "egdur", protocol.AcquireRequest{Label: "egdur",
		Egress: &protocol.Egress{AllowedDomains: []string{"allowed.sg.test"}}})
	if err != nil {
		t.Fatalf("acquire with allowed.sg.test: %v", err)
	}
	port := strconv.Itoa(site.Port)
	// fetch curls allowed.sg.test, then denied.sg.test, through the
	// jail's proxy, and returns the page and denied's curl status.
	fetch := func(gw *serveBroker) (page, denied string) {
		t.Helper()
		c := gw.Client(t, tok)
		if err := c.WriteFile(ctx, ws.WorkspaceID, "/tmp/ca.pem", site.CAPEM); err != nil {
			t.Fatal(err)
		}
		res, err := c.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{TimeoutSeconds: 120, Argv: []string{"sh", "-c",
			`curl -fsS --max-time 30 --cacert /tmp/ca.pem https://allowed.sg.test:$1/; ` +
				`curl -ksS -o /dev/null --max-time 10 https://denied.sg.test:$1/ 2>/dev/null; echo "denied $?"`, "sh", port}})
		if err != nil {
			t.Fatalf("exec: %v", err)
		}
		return string(stdout(*res)), string(stderr(*res))
	}
	const want = "hello allowed.sg.test\ndenied "
	if out, errOut := fetch(gw); len(out) < len(want) || out[:len(want)] != want || out == want+"0\n" {
		t.Fatalf("before the restart: %q (stderr %q); want the page and denied refused", out, errOut)
	}

	gw.kill()
	gw = startServeEnv(t, cfg, env...)
	out, errOut := fetch(gw)
	if len(out) < len(want) || out[:len(want)] != want {
		t.Errorf("after the broker's restart: %q (stderr %q); want allowed.sg.test's page", out, errOut)
	}
	if out == want+"0\n" {
		t.Errorf("after the broker's restart denied.sg.test was reached: %q", out)
	}
	if _, err := gw.Client(t, tok).Release(ctx, ws.WorkspaceID); err != nil {
		t.Errorf("release: %v", err)
	}
}
