package local_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/internal/fakeserver"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// A GuestVM sandbox stands for a fake vendor's VM: the host's network,
// a root that may create namespaces and mount, a writable root
// directory; every other sandbox keeps none of that (TestNoNetwork).
func TestGuestVM(t *testing.T) {
	t.Parallel()
	if _, err := local.New(t.Context(), local.Config{DataDir: t.TempDir(), GuestVM: true}, providers.Env{}); err == nil {
		t.Error("New with GuestVM but no HostDirs = nil error; want one")
	}
	p, err := local.New(t.Context(), local.Config{DataDir: t.TempDir(), GuestVM: true, HostDirs: true}, providers.Env{BrokerID: broker})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(p) })
	c := fakeserver.StartCanary(t)
	sb := providertest.Create(t, p, providertest.Spec(t))
	res := providertest.Exec(t, p, sb, "sh", "-c",
		"curl -sS --max-time 30 http://"+c.Addr()+"/ && echo && "+
			"unshare --pid --fork --mount-proc --net --mount true && echo ns && "+
			"mkdir -p /var/lib/x && echo root && grep -E '^Cap(Eff|Bnd)' /proc/self/status")
	out := string(res.Stdout)
	rest, ok := strings.CutPrefix(out, "sandgate-canary\nns\nroot\n")
	if res.ExitCode != 0 || !ok {
		t.Fatalf("guest: exit %d, %q %q", res.ExitCode, out, res.Stderr)
	}
	// Every capability the kernel has, CAP_SYS_ADMIN (21) among them.
	caps := map[string]uint64{}
	for l := range strings.Lines(rest) {
		k, v, _ := strings.Cut(strings.TrimSpace(l), ":")
		caps[k], _ = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
	}
	if caps["CapEff"] != caps["CapBnd"] || caps["CapEff"]&(1<<21) == 0 {
		t.Fatalf("guest's root capabilities: %q", rest)
	}
}
