package local_test

import (
	"slices"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
)

// TestCPUWeightDecision: a workspace gets the background weight after two
// busy ticks in a row (not after one, nor after two apart), keeps it while
// it stays busy or half busy, and gets its normal weight back after three
// quiet ticks in a row.
func TestCPUWeightDecision(t *testing.T) {
	for _, c := range []struct {
		name   string
		shares []float64
		want   []bool
	}{
		{"one busy tick", []float64{1, 0.1, 1, 0.1}, []bool{false, false, false, false}},
		{"two busy ticks", []float64{0.9, 0.8, 0.9}, []bool{false, true, true}},
		{"half busy keeps background", []float64{1, 1, 0.5, 0.3, 0.5}, []bool{false, true, true, true, true}},
		{"quiet gives it back", []float64{1, 1, 0.1, 0.1, 0.2, 0.1}, []bool{false, true, true, true, false, false}},
		{"quiet ticks must follow one another", []float64{1, 1, 0.1, 0.1, 0.5, 0.1, 0.1}, []bool{false, true, true, true, true, true, true}},
		{"exec after exec is not busy", []float64{0.5, 0.6, 0.55, 0.7}, []bool{false, false, false, false}},
	} {
		if got := local.ObserveCPU(c.shares...); !slices.Equal(got, c.want) {
			t.Errorf("%s: shares %v gave background %v; want %v", c.name, c.shares, got, c.want)
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
	t.Cleanup(func() { closeProvider(p) })
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
