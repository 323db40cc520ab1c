package main

// -ttfc: time to first command, the figure agent users compare sandboxes
// by. One keep-alive HTTPS client runs n sequential cycles against a
// `sandgate dev` broker with the local provider: acquire, exec
// `echo ready`, release. Each cycle is followed by one bare bwrap spawn of
// `echo ready` with the local provider's namespaces (the floor), so that
// both see the same load, and the tool prints p50, p90 and p99 of each step
// and of the whole beside the floor's.

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/sandgate/sandgate/internal/bwrapfloor"
	"github.com/sandgate/sandgate/protocol"
)

// ttfcOptions bound a -ttfc run.
type ttfcOptions struct {
	bin  string // sandgate binary; "" builds ./cmd/sandgate
	n    int    // cycles
	pool int    // warm workspaces per (size, image); 0 is the pool off
	fly  bool   // Fly Machines on the flytest fake instead of the local provider
}

// ttfcSteps are the steps of a cycle, in order, and the whole.
var ttfcSteps = [...]string{"acquire", "exec", "release", "cycle"}

// ttfcSamples are the durations of n cycles, per step (ttfcSteps), and of
// the floor spawned after each cycle.
type ttfcSamples struct {
	steps [len(ttfcSteps)][]time.Duration
	floor []time.Duration
}

func runTTFC(ctx context.Context, o ttfcOptions) error {
	if o.pool > 0 {
		return errors.New("-pool: this broker has no warm workspace pool setting yet; run -ttfc without -pool")
	}
	if o.fly {
		return errors.New("-fly: not supported yet; -ttfc measures the local provider")
	}
	floor, err := bwrapfloor.Command("echo", "ready")
	if err != nil {
		return err
	}
	dir, bin, err := workDir(ctx, "sandgate-load-ttfc-", o.bin)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	b, err := startDev(ctx, bin, filepath.Join(dir, "data"))
	if err != nil {
		return err
	}
	defer b.stop()
	fmt.Printf("workload: %d sequential cycles (acquire, exec `echo ready`, release) over one keep-alive HTTPS client, "+
		"sandgate dev, local provider, pool off; after each cycle one bare bwrap `echo ready` with the same namespaces (the floor)\n\n", o.n)
	s, err := measureTTFC(ctx, b, floor, o.n)
	if err != nil {
		return err
	}
	s.print()
	// As every (F) command of `make figures`: a missed target fails.
	p50, p99 := quantile(s.steps[3], 0.5), quantile(s.steps[3], 0.99)
	if p50 > 3*quantile(s.floor, 0.5) || p99 > 2*p50 {
		return errors.New("time to first command misses its target (p50 ≤ 3 × the floor, p99 ≤ 2 × p50)")
	}
	return nil
}

// measureTTFC runs one warm-up cycle, then n measured cycles, each
// followed by one run of the floor command.
func measureTTFC(ctx context.Context, b *broker, floor []string, n int) (ttfcSamples, error) {
	var s ttfcSamples
	if _, err := ttfcCycle(ctx, b, -1); err != nil {
		return s, fmt.Errorf("warm-up: %w", err)
	}
	if _, err := spawn(ctx, floor); err != nil {
		return s, err
	}
	for i := range n {
		d, err := ttfcCycle(ctx, b, i)
		if err != nil {
			return s, fmt.Errorf("cycle %d: %w", i+1, err)
		}
		for j := range d {
			s.steps[j] = append(s.steps[j], d[j])
		}
		f, err := spawn(ctx, floor)
		if err != nil {
			return s, err
		}
		s.floor = append(s.floor, f)
	}
	return s, nil
}

// ttfcCycle runs one cycle and returns the duration of each step and of
// the whole (ttfcSteps).
func ttfcCycle(ctx context.Context, b *broker, i int) ([len(ttfcSteps)]time.Duration, error) {
	var d [len(ttfcSteps)]time.Duration
	t0 := time.Now()
	var w protocol.Workspace
	key := "ttfc-" + strconv.Itoa(i) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := b.call(ctx, http.MethodPost, "/v1/workspaces", protocol.AcquireRequest{Label: "ttfc",
		Egress: &protocol.Egress{AllowedDomains: []string{}}}, key, &w); err != nil {
		return d, fmt.Errorf("acquire: %w", err)
	}
	t1 := time.Now()
	var res protocol.ExecResponse
	err := b.call(ctx, http.MethodPost, "/v1/workspaces/"+w.WorkspaceID+"/exec", protocol.ExecRequest{Argv: []string{"echo", "ready"}}, "", &res)
	t2 := time.Now()
	if err == nil {
		err = checkReady(res)
	}
	if err != nil {
		b.call(context.WithoutCancel(ctx), http.MethodDelete, "/v1/workspaces/"+w.WorkspaceID, nil, "", nil)
		return d, fmt.Errorf("exec: %w", err)
	}
	if err := b.call(ctx, http.MethodDelete, "/v1/workspaces/"+w.WorkspaceID, nil, "", nil); err != nil {
		return d, fmt.Errorf("release: %w", err)
	}
	t3 := time.Now()
	d[0], d[1], d[2], d[3] = t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), t3.Sub(t0)
	return d, nil
}

// checkReady checks that the exec printed "ready" and exited 0.
func checkReady(res protocol.ExecResponse) error {
	out, err := base64.StdEncoding.DecodeString(res.StdoutB64)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || string(out) != "ready\n" {
		return fmt.Errorf("echo ready: exit %d, stdout %q", res.ExitCode, out)
	}
	return nil
}

// spawn runs argv to its end and returns how long it took.
func spawn(ctx context.Context, argv []string) (time.Duration, error) {
	t0 := time.Now()
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	d := time.Since(t0)
	if err != nil {
		return 0, fmt.Errorf("bare bwrap: %w: %s", err, out)
	}
	return d, nil
}

// quantile is the q-quantile of ds (nearest rank), which it sorts.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(q*float64(len(ds))+0.5) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

// print writes the table of s and the ratios the acceptance names.
func (s ttfcSamples) print() {
	ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) }
	fmt.Printf("| step | p50 ms | p90 ms | p99 ms |\n| --- | ---: | ---: | ---: |\n")
	row := func(name string, ds []time.Duration) {
		fmt.Printf("| %s | %s | %s | %s |\n", name, ms(quantile(ds, 0.5)), ms(quantile(ds, 0.9)), ms(quantile(ds, 0.99)))
	}
	for i, name := range ttfcSteps {
		row(name, s.steps[i])
	}
	row("floor: bare bwrap `echo ready`", s.floor)
	p50, p99, f50 := quantile(s.steps[3], 0.5), quantile(s.steps[3], 0.99), quantile(s.floor, 0.5)
	fmt.Printf("\ntime to first command: p50 %s ms = %.2f × the floor's p50 (target ≤ 3); p99 %s ms = %.2f × its own p50 (target ≤ 2)\n",
		ms(p50), float64(p50)/float64(f50), ms(p99), float64(p99)/float64(p50))
}
