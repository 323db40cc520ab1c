package local_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// echoEgress answers every connection with the id of the workspace the
// connection was served for: it shows which listener a sandbox reached.
type echoEgress struct {
	mu     sync.Mutex
	served []string
}

func (e *echoEgress) Serve(ctx context.Context, l net.Listener, ws egress.Workspace) error {
	e.mu.Lock()
	e.served = append(e.served, ws.ID)
	e.mu.Unlock()
	go func() { <-ctx.Done(); l.Close() }()
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		fmt.Fprintf(c, "workspace %s domains %s\n", ws.ID, strings.Join(ws.AllowedDomains, ","))
		c.Close()
	}
}

func newEgressProvider(t *testing.T, eg local.Egress) *local.Provider {
	t.Helper()
	p, err := local.New(t.Context(), local.Config{DataDir: t.TempDir(), Egress: eg}, providers.Env{BrokerID: broker})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { closeProvider(p) })
	return p
}

func TestEgressPlumbing(t *testing.T) {
	t.Parallel()
	eg := &echoEgress{}
	p := newEgressProvider(t, eg)
	if got := p.Capabilities().Egress; got != providers.EgressProxy {
		t.Errorf("Capabilities().Egress = %v; want proxy", got)
	}
	spec := providertest.Spec(t)
	spec.Egress.AllowedDomains = []string{"allowed.sg.test"}
	sb := providertest.Create(t, p, spec)
	res := providertest.Exec(t, p, sb, "sh", "-c", `echo "$HTTPS_PROXY $no_proxy"; exec 3<>/dev/tcp/127.0.0.1/3128 2>&1 || echo no-bash; cat /proc/net/tcp | wc -l`)
	t.Logf("stdout %q stderr %q", res.Stdout, res.Stderr)
	res = providertest.Exec(t, p, sb, "bash", "-c", `exec 3<>/dev/tcp/127.0.0.1/3128 && cat <&3`)
	t.Logf("stdout %q stderr %q code %d", res.Stdout, res.Stderr, res.ExitCode)
}
