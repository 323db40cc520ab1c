package flymachines_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/flymachines"
	"github.com/sandgate/sandgate/providers/flymachines/flytest"
	"github.com/sandgate/sandgate/providers/providertest"
)

// acquireCalls creates a workspace on p with env secret and returns the
// vendor calls the create made, as "METHOD path" with the app's prefix
// and the Machine's id cut to "/machines" and "{id}".
func acquireCalls(t *testing.T, s *flytest.Server, p *flymachines.Provider, secret string) (providers.Sandbox, []string) {
	t.Helper()
	n := len(s.Requests())
	spec := providertest.Spec(t)
	spec.Env = map[string]string{"TENANT_SECRET": secret}
	sb := providertest.Create(t, p, spec)
	var out []string
	for _, r := range s.Requests()[n:] {
		path := strings.TrimPrefix(r.Path, "/v1/apps/sandgate-test")
		out = append(out, r.Method+" "+strings.ReplaceAll(path, sb.Ref, "{id}"))
	}
	if res := providertest.Exec(t, p, sb, "sh", "-c", `echo "$TENANT_SECRET"`); string(res.Stdout) != secret+"\n" {
		t.Errorf("the workspace sees TENANT_SECRET=%q; want its own %q", res.Stdout, secret)
	}
	if m, _ := s.Machine(sb.Ref); m.Config.Metadata[providers.LabelWorkspace] != spec.WorkspaceID {
		t.Errorf("the Machine's workspace label is %q; want %q", m.Config.Metadata[providers.LabelWorkspace], spec.WorkspaceID)
	}
	return sb, out
}

func waitPoolReady(t *testing.T, p *flymachines.Provider, n int) {
	t.Helper()
	waitUntil(t, 2*time.Minute, "the pool to fill", func() bool {
		st := p.PoolStats()
		return len(st.Ready) == 1 && st.Ready[0].Ready == n
	})
}

// With the pool on, an acquire starts a Machine made beforehand (an
// update with the workspace's config, a start, the wait) instead of
// creating one; the pool is off by default.
func TestPoolStartsNotCreates(t *testing.T) {
	s := startFake(t, flytest.Options{})
	off := newProvider(t, config(t, s), "broker-off")
	if st := off.PoolStats(); len(st.Ready) != 0 || st.Taken != 0 {
		t.Errorf("pool stats with no pool configured: %+v; want none", st)
	}
	_, cold := acquireCalls(t, s, off, "cold-secret")
	if want := []string{"POST /machines", "GET /machines/{id}/wait"}; strings.Join(cold, ", ") != strings.Join(want, ", ") {
		t.Errorf("vendor calls of an acquire with no pool: %q; want %q", cold, want)
	}

	cfg := config(t, s)
	cfg.Pool = providers.PoolConfig{Per: []providers.PoolEntry{{Size: "small", Count: 2}}}
	on := newProvider(t, cfg, "broker-pool")
	waitPoolReady(t, on, 2)
	flymachines.PauseRefill(on)
	a, warm := acquireCalls(t, s, on, "alpha-secret")
	want := []string{"POST /machines/{id}", "POST /machines/{id}/start", "GET /machines/{id}/wait"}
	if strings.Join(warm, ", ") != strings.Join(want, ", ") {
		t.Errorf("vendor calls of an acquire from the pool: %q; want %q (no create)", warm, want)
	}
	t.Logf("vendor calls per acquire: pool off %d %q, pool on %d %q", len(cold), cold, len(warm), warm)
	b, _ := acquireCalls(t, s, on, "bravo-secret")
	if a.Ref == b.Ref {
		t.Fatalf("two acquires got the same Machine %s", a.Ref)
	}
	if st := on.PoolStats(); st.Taken != 2 || st.Ready[0].Ready != 0 {
		t.Errorf("pool stats %+v; want 2 taken, none left (refill paused)", st)
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
