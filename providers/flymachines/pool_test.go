package flymachines_test

import (
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/internal/egresstest"
	"github.com/sandgate/sandgate/internal/guesttest"
	"github.com/sandgate/sandgate/internal/testpki"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/flymachines"
	"github.com/sandgate/sandgate/providers/flymachines/flytest"
	"github.com/sandgate/sandgate/providers/providertest"
)

// acquireCalls creates a workspace of spec on p and returns the vendor
// calls the create made, as "METHOD path" with the app's prefix and the
// Machine's id cut to "/machines" and "{id}", and the request bytes they
// sent.
func acquireCalls(t *testing.T, s *flytest.Server, p *flymachines.Provider, spec providers.CreateSpec) (providers.Sandbox, []string, int64) {
	t.Helper()
	n := len(s.Requests())
	sb := providertest.Create(t, p, spec)
	calls, bytes := callsOf(s.Requests()[n:], sb.Ref)
	return sb, calls, bytes
}

func callsOf(reqs []flytest.Request, id string) ([]string, int64) {
	var out []string
	var n int64
	for _, r := range reqs {
		path := strings.TrimPrefix(r.Path, "/v1/apps/sandgate-test")
		out = append(out, r.Method+" "+strings.ReplaceAll(path, id, "{id}"))
		n += r.BodyBytes
	}
	return out, n
}

// secretSpec is a workspace spec whose env holds secret.
func secretSpec(t *testing.T, secret string) providers.CreateSpec {
	spec := providertest.Spec(t)
	spec.Env = map[string]string{"TENANT_SECRET": secret}
	return spec
}

// seesOwnSecret checks that sb's commands see spec's secret, and that the
// vendor labels the Machine as spec's workspace (once relabelled).
func seesOwnSecret(t *testing.T, s *flytest.Server, p *flymachines.Provider, sb providers.Sandbox, spec providers.CreateSpec) {
	t.Helper()
	secret := spec.Env["TENANT_SECRET"]
	if res := providertest.Exec(t, p, sb, "sh", "-c", `echo "$TENANT_SECRET"`); string(res.Stdout) != secret+"\n" {
		t.Errorf("the workspace sees TENANT_SECRET=%q; want its own %q", res.Stdout, secret)
	}
	waitUntil(t, time.Minute, "the Machine labelled as its workspace", func() bool {
		m, _ := s.Machine(sb.Ref)
		md := m.Config.Metadata
		_, pooled := md["sandgate-pool"]
		return md[providers.LabelWorkspace] == spec.WorkspaceID && md[providers.LabelInstance] == spec.InstanceID && !pooled
	})
}

func waitPoolReady(t *testing.T, p *flymachines.Provider, n int) {
	t.Helper()
	waitUntil(t, 2*time.Minute, "the pool to fill", func() bool {
		st := p.PoolStats()
		return len(st.Ready) == 1 && st.Ready[0].Ready == n
	})
}

// With the pool on, an acquire starts a Machine made beforehand: a start
// and the wait, sending no config and no agent, where a create sends both
// (megabytes) and waits; the workspace's env, egress and lifetime reach
// the Machine after the acquire (one exec) and its labels with one
// metadata update. The pool is off by default.
func TestPoolStartsNotCreates(t *testing.T) {
	s := startFake(t, flytest.Options{})
	off := newProvider(t, config(t, s), "broker-off")
	if st := off.PoolStats(); len(st.Ready) != 0 || st.Taken != 0 {
		t.Errorf("pool stats with no pool configured: %+v; want none", st)
	}
	coldSpec := secretSpec(t, "cold-secret")
	sb, cold, coldBytes := acquireCalls(t, s, off, coldSpec)
	if want := []string{"POST /machines", "GET /machines/{id}/wait"}; strings.Join(cold, ", ") != strings.Join(want, ", ") {
		t.Errorf("vendor calls of an acquire with no pool: %q; want %q", cold, want)
	}
	seesOwnSecret(t, s, off, sb, coldSpec)

	cfg := config(t, s)
	cfg.Pool = providers.PoolConfig{Per: []providers.PoolEntry{{Size: "small", Count: 2}}}
	on := newProvider(t, cfg, "broker-pool")
	waitPoolReady(t, on, 2)
	flymachines.PauseRefill(on)
	release := flymachines.HoldSettle(on)
	aSpec := secretSpec(t, "alpha-secret")
	a, warm, warmBytes := acquireCalls(t, s, on, aSpec)
	want := []string{"POST /machines/{id}/start", "GET /machines/{id}/wait"}
	if strings.Join(warm, ", ") != strings.Join(want, ", ") {
		t.Errorf("vendor calls of an acquire from the pool: %q; want %q (no create, no update)", warm, want)
	}
	if warmBytes > 1<<10 || coldBytes < 1<<20 {
		t.Errorf("bytes sent on the acquire path: pool off %d, pool on %d; want the agent's megabytes off, nothing on", coldBytes, warmBytes)
	}
	t.Logf("vendor calls per acquire: pool off %d %q (%d bytes sent), pool on %d %q (%d bytes sent)", len(cold), cold, coldBytes, len(warm), warm, warmBytes)
	// The taken Machine is listed as its workspace before its relabel.
	if refs := providertest.ListRefs(t, on, "broker-pool"); len(refs) != 1 || refs[0] != a.Ref {
		t.Errorf("List after a take = %v; want the taken Machine %s", refs, a.Ref)
	}
	n := len(s.Requests())
	release()
	seesOwnSecret(t, s, on, a, aSpec)
	after, _ := callsOf(s.Requests()[n:], a.Ref)
	if c := strings.Count(strings.Join(after, ","), "PATCH /machines/{id}/metadata"); c != 1 {
		t.Errorf("calls after the take %q: %d metadata updates; want 1", after, c)
	}
	if strings.Contains(strings.Join(after, ","), "POST /machines/{id},") {
		t.Errorf("calls after the take %q: the Machine's config was updated; want no update", after)
	}
	bSpec := secretSpec(t, "bravo-secret")
	b, _, _ := acquireCalls(t, s, on, bSpec)
	if a.Ref == b.Ref {
		t.Fatalf("two acquires got the same Machine %s", a.Ref)
	}
	seesOwnSecret(t, s, on, b, bSpec)
	if st := on.PoolStats(); st.Taken != 2 || st.Ready[0].Ready != 0 {
		t.Errorf("pool stats %+v; want 2 taken, none left (refill paused)", st)
	}
	// Another broker process, which did not take it, reads the binding
	// from the Machine: the same env.
	other := newProvider(t, config(t, s), "broker-pool")
	if res := providertest.Exec(t, other, b, "sh", "-c", `echo "$TENANT_SECRET"`); string(res.Stdout) != "bravo-secret\n" {
		t.Errorf("another broker process sees TENANT_SECRET=%q; want bravo-secret", res.Stdout)
	}
	if refs := providertest.ListRefs(t, other, "broker-pool"); !slices.Contains(refs, b.Ref) || !slices.Contains(refs, a.Ref) {
		t.Errorf("List of another broker process = %v; want both taken Machines as workspaces", refs)
	}
	// A taken Machine is destroyed at release like any other: it never
	// serves a second workspace.
	if err := on.Terminate(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	if m, _ := s.Machine(a.Ref); m.State != "destroyed" {
		t.Errorf("a released pooled Machine is %s; want destroyed", m.State)
	}
}

// poolProvider is a provider over s with a full pool of two small
// Machines and its refill paused, whose guests reach ve.
func poolProvider(t *testing.T, s *flytest.Server, broker string, ve *providers.VendorEgress) *flymachines.Provider {
	t.Helper()
	cfg := config(t, s)
	cfg.Pool = providers.PoolConfig{Per: []providers.PoolEntry{{Size: "small", Count: 2}}}
	p, err := flymachines.New(t.Context(), cfg, providers.Env{BrokerID: broker, GuestBinary: guesttest.Binary(t), VendorEgress: ve})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	waitPoolReady(t, p, 2)
	flymachines.PauseRefill(p)
	return p
}

// A taken Machine gets its workspace's lifetime and egress, and nothing
// of another's: the keeper it runs ends it at the workspace's
// expires_at and forwards with the workspace's own credential; a
// workspace without egress gets no forwarder and no credential file.
func TestPoolTakeBindsLifetimeAndEgress(t *testing.T) {
	t.Parallel() // mostly waiting on the clock: beside the others
	s := startFake(t, flytest.Options{})
	ve, _, _ := proxyEgress(t)
	p := poolProvider(t, s, "broker-bind", ve)

	withEgress := providertest.Spec(t)
	withEgress.Egress.AllowedDomains = []string{"example.com"}
	withEgress.ExpiresAt = time.Now().Add(40 * time.Second)
	e, calls, _ := acquireCalls(t, s, p, withEgress)
	if len(calls) != 2 {
		t.Errorf("vendor calls of a take: %q; want a start and the wait", calls)
	}
	none := providertest.Spec(t)
	n := providertest.Create(t, p, none)

	proxyVars := `env | grep -ci '^https*_proxy=' || true`
	if res := providertest.Exec(t, p, e, "sh", "-c", proxyVars); strings.TrimSpace(string(res.Stdout)) == "0" {
		t.Errorf("the workspace with egress has no proxy variables in its jail")
	}
	if res := providertest.Exec(t, p, n, "sh", "-c", proxyVars); strings.TrimSpace(string(res.Stdout)) != "0" {
		t.Errorf("the workspace without egress has proxy variables in its jail")
	}
	// As the guest's root: the credential and the keeper.
	if got := rawExec(t, s, e.Ref, "cat", providers.GuestCredFile); got != "cred-"+withEgress.WorkspaceID+"\n" {
		t.Errorf("the credential in the Machine with egress is %q; want its own", got)
	}
	if got := rawExec(t, s, n.Ref, "sh", "-c", "cat "+providers.GuestCredFile+" 2>/dev/null; true"); got != "" {
		t.Errorf("the Machine without egress holds a credential %q; want none", got)
	}
	keeper := func(id string) []string {
		return strings.Fields(rawExec(t, s, id, "cat", providers.GuestDir+"/keeper"))
	}
	if k := keeper(e.Ref); len(k) != 3 || k[2] != strconvUnix(withEgress.ExpiresAt.Add(time.Second-1)) {
		t.Errorf("the keeper of the Machine with egress: %q; want its workspace's deadline %s", k, strconvUnix(withEgress.ExpiresAt.Add(time.Second-1)))
	}
	if k := keeper(n.Ref); len(k) != 3 || k[2] != strconvUnix(none.ExpiresAt.Add(time.Second-1)) {
		t.Errorf("the keeper of the Machine without egress: %q; want its workspace's deadline", k)
	}
	cmdline := func(id string) string {
		return rawExec(t, s, id, "sh", "-c", `p=$(cut -d" " -f1 `+providers.GuestDir+`/keeper); tr "\0" " " </proc/$p/cmdline`)
	}
	if c := cmdline(e.Ref); !strings.Contains(c, "--egress-user "+withEgress.WorkspaceID+" ") {
		t.Errorf("the keeper of the Machine with egress runs %q; want it to forward as its own workspace", c)
	}
	if c := cmdline(n.Ref); strings.Contains(c, "--egress") {
		t.Errorf("the keeper of the Machine without egress runs %q; want no forwarder", c)
	}
	// With no broker from here on, the Machine ends at its workspace's
	// expires_at, not the pool's.
	p.Close()
	waitUntil(t, time.Until(withEgress.ExpiresAt)+60*time.Second, "the taken Machine destroyed at expires_at", func() bool {
		m, _ := s.Machine(e.Ref)
		return m.State == "destroyed"
	})
	if m, _ := s.Machine(e.Ref); m.DestroyedAt.Before(withEgress.ExpiresAt.Add(-time.Second)) || m.ExitCode == nil || *m.ExitCode != 0 {
		t.Errorf("destroyed at %v with exit %v; want after expires_at %v, the keeper's exit 0", m.DestroyedAt, m.ExitCode, withEgress.ExpiresAt)
	}
}

// A Provider's own pooled Machines are not listed (they are no
// workspace); those of a Provider that is gone are, labelled like a
// workspace nobody has a record of, so the reaper's orphan sweep destroys
// them. Close destroys its own.
func TestPoolMachinesOfAGoneBrokerAreOrphans(t *testing.T) {
	s := startFake(t, flytest.Options{})
	cfg := config(t, s)
	cfg.Pool = providers.PoolConfig{Per: []providers.PoolEntry{{Size: "small", Count: 1}}}
	live := newProvider(t, cfg, "broker-restart")
	waitPoolReady(t, live, 1)
	if refs := providertest.ListRefs(t, live, "broker-restart"); len(refs) != 0 {
		t.Errorf("List with only a warm Machine = %v; want none", refs)
	}
	// The same broker id after a crash: a Provider of its own.
	after := newProvider(t, config(t, s), "broker-restart")
	sbs, err := after.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs) != 1 || !strings.HasPrefix(sbs[0].Labels[providers.LabelWorkspace], "pool-") || sbs[0].Labels[providers.LabelInstance] != "" {
		t.Fatalf("List after a restart = %+v; want the warm Machine as a workspace of no instance", sbs)
	}
	if err := after.Terminate(t.Context(), sbs[0]); err != nil {
		t.Fatal(err)
	}
	waitPoolReady(t, live, 1) // the refill replaced it
	live.Close()
	for _, m := range s.Machines() {
		if m.State != "destroyed" {
			t.Errorf("machine %s is %s after Close; want every pooled Machine destroyed", m.ID, m.State)
		}
	}
}

// Two workspaces taken from the pool reach the broker's egress proxy
// (credential mode, over TLS) each with its own credential: each reaches
// the host its allowlist names and is refused the other's.
func TestPoolTakeEgressIsItsOwn(t *testing.T) {
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "site %s\n", r.Host)
	}))
	t.Cleanup(site.Close)
	sitePort := site.Listener.Addr().(*net.TCPAddr).Port
	loop := netip.MustParseAddr("127.0.0.1")
	proxy, err := egress.New(egress.Config{
		Ports: []uint16{uint16(sitePort)},
		Hosts: map[string]netip.Addr{"alpha.sg.test": loop, "bravo.sg.test": loop},
	}, egress.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	pki := testpki.Issue(t, "vendor listener CA", nil, []net.IP{net.IPv4(127, 0, 0, 1)})
	addr := egresstest.ServeVendor(t, proxy, pki)
	ve, err := providers.NewVendorEgress("https://"+addr.String(), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pki.CADER}), proxy)
	if err != nil {
		t.Fatal(err)
	}

	s := startFake(t, flytest.Options{})
	p := poolProvider(t, s, "broker-own-egress", ve)
	take := func(host string) providers.Sandbox {
		spec := providertest.Spec(t)
		spec.Egress.AllowedDomains = []string{host}
		sb, calls, _ := acquireCalls(t, s, p, spec)
		if len(calls) != 2 {
			t.Fatalf("vendor calls of a take: %q; want a start and the wait", calls)
		}
		return sb
	}
	// Each take's own calls, without the other's bind and relabel.
	release := flymachines.HoldSettle(p)
	a, b := take("alpha.sg.test"), take("bravo.sg.test")
	release()
	get := func(sb providers.Sandbox, host string) string {
		url := "http://" + host + ":" + strconv.Itoa(sitePort) + "/"
		res := providertest.Exec(t, p, sb, "sh", "-c", "curl -sS --max-time 60 -o /dev/null -w '%{http_code}' "+url)
		return string(res.Stdout)
	}
	for _, c := range []struct {
		sb         providers.Sandbox
		host, want string
	}{{a, "alpha.sg.test", "200"}, {a, "bravo.sg.test", "403"}, {b, "bravo.sg.test", "200"}, {b, "alpha.sg.test", "403"}} {
		if got := get(c.sb, c.host); got != c.want {
			t.Errorf("workspace %s to %s: %q; want %s", c.sb.Labels[providers.LabelWorkspace], c.host, got, c.want)
		}
	}
}
