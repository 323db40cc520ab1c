package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/protocol"
)

// TestForkBombsLeaveBrokerAnswering: a fork bomb in every workspace the
// instance admits takes their processes to the host ceiling
// (host_pids_max, on their parent cgroup) and no further, and the broker
// keeps answering all the while: /readyz, the lease, the operator API, and
// the bombs' own cancel and release.
func TestForkBombsLeaveBrokerAnswering(t *testing.T) {
	t.Parallel()
	const ceiling, bombs = 400, 3
	parent := "sandgate-e2e-bomb-" + randHex(4)
	rs := startRedis(t)
	cfg := newServeConfig(t, rs.Addr, serveOptions{Providers: fmt.Sprintf(
		"providers:\n  - name: local\n    kind: local\n    cgroup_parent: %s\n    host_pids_max: %d\n    tiers:\n      small: {pids: 256}", parent, ceiling)})
	s := startServe(t, cfg)
	adm := s.Admin(t)
	c := s.Client(t, issueToken(t, adm, createInstance(t, adm, createAccount(t, adm, "forkbomb"), bombs)))
	ctx := context.Background()

	var ids []string
	for i := range bombs {
		ids = append(ids, acquire(t, c, "bomb-"+strconv.Itoa(i)).WorkspaceID)
	}
	// xargs keeps forking sleepers, waiting for one to end whenever a fork
	// fails: each bomb stays at what its workspace and the ceiling allow.
	for _, id := range ids {
		if _, _, err := c.StartCommand(ctx, id, "bomb", protocol.ExecRequest{Argv: []string{"sh", "-c", "seq 5000 | xargs -P 5000 -I{} sleep 60"}}); err != nil {
			t.Fatalf("start the bomb in %s: %v", id, err)
		}
	}
	current := func() (int, error) {
		for _, dir := range []string{filepath.Join("/sys/fs/cgroup/pids", parent), filepath.Join("/sys/fs/cgroup", parent)} {
			if b, err := os.ReadFile(filepath.Join(dir, "pids.current")); err == nil {
				return strconv.Atoi(strings.TrimSpace(string(b)))
			}
		}
		return 0, errors.New("no pids.current under the workspaces' parent cgroup")
	}
	waitFor(t, "the bombs to reach the host ceiling", func() (bool, error) {
		n, err := current()
		if n > ceiling {
			t.Fatalf("the workspaces hold %d processes; want at most host_pids_max %d", n, ceiling)
		}
		return err == nil && n >= ceiling-bombs*4, fmt.Errorf("%d processes, %v", n, err)
	})

	// The broker answers while they bomb.
	resp, err := http.Get(s.AdminURL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz while the workspaces bomb = %d; want 200", resp.StatusCode)
	}
	if _, err := c.Lease(ctx); err != nil {
		t.Errorf("lease while the workspaces bomb: %v", err)
	}
	if out := runCLI(t, s.AdminEnv(), "admin", "workspace", "list", "-q"); strings.Count(out, "ws_") != bombs {
		t.Errorf("admin workspace list while the workspaces bomb = %q; want the %d workspaces", out, bombs)
	}
	if n, err := current(); err != nil || n > ceiling {
		t.Errorf("the workspaces hold %d processes (%v); want at most host_pids_max %d", n, err, ceiling)
	}
	for _, id := range ids {
		if err := c.CancelCommand(ctx, id, "bomb"); err != nil {
			t.Errorf("cancel the bomb in %s: %v", id, err)
		}
		if _, err := c.Release(ctx, id); err != nil {
			t.Errorf("release %s: %v", id, err)
		}
	}
}
