package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/bwrapfloor"
	"github.com/sandgate/sandgate/protocol"
)

// TestTTFC runs the -ttfc core against a real `sandgate dev` (local
// provider, bwrap) for three cycles, so that the tool cannot rot: every
// cycle's exec printed "ready" (ttfcCycle checks it), and each step and
// the floor have a duration per cycle.
func TestTTFC(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	bin := filepath.Join(dir, "sandgate")
	if err := build(ctx, "../..", bin); err != nil {
		t.Fatal(err)
	}
	floor, err := bwrapfloor.Command("echo", "ready")
	if err != nil {
		t.Fatal(err)
	}
	b, err := startDev(ctx, bin, filepath.Join(dir, "data"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.stop()
	const n = 3
	s, err := measureTTFC(ctx, b, floor, n)
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range ttfcSteps {
		if len(s.steps[i]) != n {
			t.Fatalf("%s: %d samples, want %d", name, len(s.steps[i]), n)
		}
	}
	for i := range n {
		acq, ex, rel, whole := s.steps[0][i], s.steps[1][i], s.steps[2][i], s.steps[3][i]
		if acq <= 0 || ex <= 0 || rel <= 0 || whole != acq+ex+rel {
			t.Errorf("cycle %d: acquire %v + exec %v + release %v, whole %v", i+1, acq, ex, rel, whole)
		}
	}
	if len(s.floor) != n {
		t.Fatalf("floor: %d samples, want %d", len(s.floor), n)
	}
	// Nothing of the workspaces is left: every cycle released its own.
	var list protocol.WorkspaceList
	if err := b.call(ctx, "GET", "/v1/workspaces?state=all&limit=100", nil, "", &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Workspaces) != n+1 { // and the warm-up's
		t.Errorf("%d workspaces listed, want %d", len(list.Workspaces), n+1)
	}
	for _, w := range list.Workspaces {
		if w.State != "terminated" {
			t.Errorf("a workspace is left %s after the cycles", w.State)
		}
	}
}

// TestTTFCPoolUnsupported: -pool and -fly fail at once and say why while
// the broker has no pool setting, instead of measuring something else.
func TestTTFCPoolUnsupported(t *testing.T) {
	for _, o := range []ttfcOptions{{n: 1, pool: 2}, {n: 1, fly: true}} {
		err := runTTFC(context.Background(), o)
		if err == nil || !(strings.Contains(err.Error(), "-pool") || strings.Contains(err.Error(), "-fly")) {
			t.Errorf("runTTFC(%+v) = %v, want a -pool or -fly refusal", o, err)
		}
	}
}
