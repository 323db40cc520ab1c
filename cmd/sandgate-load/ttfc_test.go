package main

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sandgate/sandgate/internal/bwrapfloor"
	"github.com/sandgate/sandgate/protocol"
)

// TestTTFC runs the -ttfc core against a real `sandgate dev` (local
// provider, bwrap) for three cycles, so that the tool cannot rot: every
// cycle's exec printed "ready" (ttfcCycle checks it), each step and the
// floor have a duration per cycle, and every request went over one
// keep-alive connection (a new one would add a TLS handshake to a step).
func TestTTFC(t *testing.T) {
	ctx := context.Background()
	b, floor := startTTFCTest(t, 0, startTTFC)
	dials := countDials(t, b)
	const n = 3
	s, err := measureTTFC(ctx, b, floor, n)
	if err != nil {
		t.Fatal(err)
	}
	if got := dials.Load(); got != 1 {
		t.Errorf("connections opened by %d cycles and the warm-up: %d, want 1", n, got)
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

// TestTTFCPool runs the -ttfc core with -pool 3 for three cycles, on
// `sandgate dev` and (-redis) on `sandgate serve` with a redis-server of
// its own: the broker starts with three warm workspaces ready, and every
// cycle's create (and the warm-up's) is served by the pool, not made on
// the request path.
func TestTTFCPool(t *testing.T) {
	for name, start := range map[string]func(context.Context, string, string, int) (*broker, error){
		"dev": startTTFC, "redis": startTTFCServe,
	} {
		t.Run(name, func(t *testing.T) { testTTFCPool(t, start) })
	}
}

func testTTFCPool(t *testing.T, start func(context.Context, string, string, int) (*broker, error)) {
	ctx := context.Background()
	const n = 3
	b, floor := startTTFCTest(t, n, start)
	m, err := scrape(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if got := m[`sandgate_pool_ready{image="host",provider="local",size="small"}`]; got != n {
		t.Fatalf("warm workspaces ready before the cycles: %v, want %d", got, n)
	}
	s, err := measureTTFC(ctx, b, floor, n)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.steps[3]) != n || len(s.floor) != n {
		t.Fatalf("%d cycles and %d floor samples, want %d", len(s.steps[3]), len(s.floor), n)
	}
	taken, err := poolTaken(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if taken != n+1 { // and the warm-up's
		t.Errorf("creates served by the pool: %d, want %d", taken, n+1)
	}
}

// TestTTFCFlyUnsupported: -fly fails at once and says why, instead of
// measuring the local provider under its name.
func TestTTFCFlyUnsupported(t *testing.T) {
	err := runTTFC(context.Background(), ttfcOptions{n: 1, fly: true})
	if err == nil || !strings.Contains(err.Error(), "-fly") {
		t.Errorf("runTTFC(-fly) = %v, want a -fly refusal", err)
	}
}

// countDials drops b's idle connections and counts those its client
// opens from then on.
func countDials(t *testing.T, b *broker) *atomic.Int64 {
	t.Helper()
	tr, ok := b.hc.Transport.(*http.Transport)
	if !ok {
		t.Fatalf("the broker's client has a %T, want an *http.Transport", b.hc.Transport)
	}
	tr.CloseIdleConnections()
	var n atomic.Int64
	var d net.Dialer
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		n.Add(1)
		return d.DialContext(ctx, network, addr)
	}
	return &n
}

// startTTFCTest builds sandgate and starts it with start as -ttfc does, with pool
// warm workspaces; it returns the broker, stopped by t.Cleanup, and the
// floor's command line.
func startTTFCTest(t *testing.T, pool int, start func(context.Context, string, string, int) (*broker, error)) (*broker, []string) {
	t.Helper()
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
	b, err := start(ctx, bin, filepath.Join(dir, "data"), pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.stop)
	return b, floor
}
