package local_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// TestHostCeiling: the workspaces of a data directory together stay under
// host_pids_max, set on their parent cgroup. Creates are not refused by
// the tiers' sum (four workspaces of 256 pids under a ceiling of 768);
// fork bombs in two of them leave another's exec running, and the
// processes of all of them together never pass the ceiling.
func TestHostCeiling(t *testing.T) {
	t.Parallel()
	const pids, ceiling = 256, 3 * 256
	p, err := local.New(t.Context(), local.Config{DataDir: t.TempDir(), HostPidsMax: ceiling, HostMemoryMaxMiB: 2048,
		Tiers: map[string]local.Tier{"small": {Pids: pids}}}, providers.Env{BrokerID: broker})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(p) })
	var sbs []providers.Sandbox
	for i := range 4 {
		sb, err := p.Create(t.Context(), providers.CreateSpec{WorkspaceID: "ws_bomb" + strconv.Itoa(i), InstanceID: "inst_x",
			Size: sandgate.Size{Name: "small", CPUCores: 1, MemoryMiB: 128}, ExpiresAt: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatalf("create %d: %v; want every create admitted (pids are overcommitted)", i, err)
		}
		sbs = append(sbs, sb)
	}
	var parent string // the pids controller's parent cgroup
	for _, d := range local.CgroupDirs(p, sbs[0].Ref) {
		if _, err := os.Stat(filepath.Join(filepath.Dir(d), "pids.max")); err == nil {
			parent = filepath.Dir(d)
			break
		}
	}
	if b, _ := os.ReadFile(filepath.Join(parent, "pids.max")); strings.TrimSpace(string(b)) != strconv.Itoa(ceiling) {
		t.Errorf("parent pids.max = %q; want %d", b, ceiling)
	}
	// Fork bombs: xargs keeps forking sleepers, waiting for one to end
	// whenever a fork fails, so it stays at its workspace's cap.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ended []string // how each bomb ended, for a failure's message
	for _, sb := range sbs[:2] {
		wg.Go(func() {
			res, err := p.Exec(t.Context(), sb, providers.ExecSpec{Argv: []string{"sh", "-c", "seq 400 | xargs -P 400 -I{} sleep 8"},
				Timeout: 20 * time.Second, MaxOutputBytes: 1024})
			mu.Lock()
			ended = append(ended, fmt.Sprintf("exit %d, %v: %q", res.ExitCode, err, res.Stderr))
			mu.Unlock()
		})
	}
	deadline := time.Now().Add(time.Minute)
	for {
		b, _ := os.ReadFile(filepath.Join(parent, "pids.current"))
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if n > ceiling {
			t.Fatalf("the workspaces hold %d processes; want at most host_pids_max %d", n, ceiling)
		}
		if n >= 2*pids-4 {
			break // both bombs are at their caps
		}
		if time.Now().After(deadline) {
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("the bombs reached %d processes; want about %d (bombs ended: %q)", n, 2*pids, ended)
		}
		time.Sleep(20 * time.Millisecond)
	}
	res, err := p.Exec(t.Context(), sbs[2], providers.ExecSpec{Argv: []string{"sh", "-c", "echo ok"}, Timeout: time.Minute, MaxOutputBytes: 1024})
	if err != nil || res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != "ok" {
		t.Errorf("exec of the third workspace while two bomb: %+v, %v; want exit 0 and ok", res, err)
	}
	for _, sb := range sbs[:2] {
		p.Terminate(t.Context(), sb)
	}
	wg.Wait()
}
