package local_test

import (
	"slices"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// TestCPUWeightDecision: a workspace gets the background weight after two
// busy ticks in a row (its cores mostly used, or long-running work using
// CPU), not after one or two apart; keeps it while long-running work
// goes on, however little CPU it gets; and gets its normal weight back
// after three quiet ticks in a row.
func TestCPUWeightDecision(t *testing.T) {
	type tk = local.CPUTick
	share := func(s ...float64) []tk {
		var out []tk
		for _, v := range s {
			out = append(out, tk{Share: v})
		}
		return out
	}
	for _, c := range []struct {
		name  string
		ticks []tk
		want  []bool
	}{
		{"one busy tick", share(1, 0.1, 1, 0.1), []bool{false, false, false, false}},
		{"two busy ticks", share(0.9, 0.8, 0.9), []bool{false, true, true}},
		{"half busy keeps background", share(1, 1, 0.5, 0.3, 0.5), []bool{false, true, true, true, true}},
		{"quiet gives it back", share(1, 1, 0.1, 0.1, 0.2, 0.1), []bool{false, true, true, true, false, false}},
		{"quiet ticks must follow one another", share(1, 1, 0.1, 0.1, 0.5, 0.1, 0.1), []bool{false, true, true, true, true, true, true}},
		{"exec after exec is not busy", share(0.5, 0.6, 0.55, 0.7), []bool{false, false, false, false}},
		{"a hog on a crowded host", []tk{{0.2, true}, {0.15, true}, {0.1, true}, {0.1, true}}, []bool{false, true, true, true}},
		{"long-running work keeps it", []tk{{0.2, true}, {0.2, true}, {0.05, true}, {0.05, true}, {0.05, true}, {0.05, false}}, []bool{false, true, true, true, true, true}},
		{"long-running work ends", []tk{{0.2, true}, {0.2, true}, {0, false}, {0, false}, {0, false}}, []bool{false, true, true, true, false}},
	} {
		if got := local.ObserveCPU(c.ticks...); !slices.Equal(got, c.want) {
			t.Errorf("%s: ticks %v gave background %v; want %v", c.name, c.ticks, got, c.want)
		}
	}
}

// TestBusyWorkspaceYields: on real cgroups, a workspace whose durable
// command spins gets the background CPU weight while a quiet neighbour
// keeps its normal one, and gets its normal weight back once the command
// is cancelled.
func TestBusyWorkspaceYields(t *testing.T) {
	t.Parallel()
	c := local.Config{DataDir: t.TempDir()}
	local.SetCPUTick(&c, 100*time.Millisecond)
	p, err := local.New(t.Context(), c, providers.Env{BrokerID: broker})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(p) })
	size := sandgate.Size{Name: "small", CPUCores: 1, MemoryMiB: 256}
	busy, err := p.Create(t.Context(), providers.CreateSpec{WorkspaceID: "ws_busy", InstanceID: "inst_x", Size: size, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	quiet, err := p.Create(t.Context(), providers.CreateSpec{WorkspaceID: "ws_quiet", InstanceID: "inst_x", Size: size, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if got, normal := local.CPUWeight(p, busy.Ref, 1); got != normal {
		t.Fatalf("a new workspace's CPU weight = %d; want the normal %d", got, normal)
	}
	if err := p.StartCommand(t.Context(), busy, "spin", providers.ExecSpec{Argv: []string{"sh", "-c", "while :; do :; done"}, Timeout: time.Minute}); err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
	waitWeight(t, p, busy.Ref, func(got, normal int) bool { return got < normal }, "the spinning workspace to get the background weight")
	if got, normal := local.CPUWeight(p, quiet.Ref, 1); got != normal {
		t.Errorf("the quiet workspace's CPU weight = %d; want the normal %d", got, normal)
	}
	if err := p.CancelCommand(t.Context(), busy, "spin"); err != nil {
		t.Fatalf("CancelCommand: %v", err)
	}
	waitWeight(t, p, busy.Ref, func(got, normal int) bool { return got == normal }, "the cancelled workspace to get its normal weight back")
}

// waitWeight polls ref's CPU weight until ok holds (at most a minute).
func waitWeight(t *testing.T, p *local.Provider, ref string, ok func(got, normal int) bool, what string) {
	t.Helper()
	for range 600 {
		if ok(local.CPUWeight(p, ref, 1)) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	got, normal := local.CPUWeight(p, ref, 1)
	t.Fatalf("waited for %s: weight %d (normal %d)", what, got, normal)
}
