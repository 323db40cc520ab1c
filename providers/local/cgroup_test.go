package local_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// TestExecInCgroups: every process of an exec runs in its workspace's
// cgroups, in every controller, and no thread of the broker is ever in
// any of them.
func TestExecInCgroups(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	sb := providertest.Create(t, p, providertest.Spec(t))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := p.Exec(ctx, sb, providers.ExecSpec{Argv: []string{"sh", "-c", "sleep 60 & sleep 60"}, MaxOutputBytes: 10})
		done <- err
	}()
	dirs := local.CgroupDirs(p, sb.Ref)
	// members lists the pids in d and in its leaves.
	members := func(file string) []string {
		var out []string
		for _, d := range dirs {
			ds, _ := filepath.Glob(filepath.Join(d, "*", file))
			for _, f := range append(ds, filepath.Join(d, file)) {
				b, _ := os.ReadFile(f)
				out = append(out, strings.Fields(string(b))...)
			}
		}
		return out
	}
	// bwrap, the sandbox's pid 1, sh and two sleeps.
	var procs []string
	waitUntil(t, "the exec's processes", func() bool {
		threads, _ := os.ReadDir("/proc/self/task")
		tasks := members("tasks")
		for _, th := range threads {
			if slices.Contains(tasks, th.Name()) {
				t.Fatalf("thread %s of the broker is in the workspace's cgroups", th.Name())
			}
		}
		procs = members("cgroup.procs")
		slices.Sort(procs)
		procs = slices.Compact(procs)
		return len(procs) >= 4
	})
	for _, pid := range procs {
		b, err := os.ReadFile("/proc/" + pid + "/cgroup")
		if err != nil {
			continue // exited meanwhile
		}
		for _, d := range dirs {
			i := strings.Index(d, "/sandgate/")
			ctl, rel := filepath.Base(d[:i]), d[i:] // the hierarchy's mount, the cgroup below it
			in := false
			for _, l := range strings.Split(string(b), "\n") {
				f := strings.SplitN(l, ":", 3)
				if len(f) == 3 && (f[1] == ctl || f[1] == "") && (f[2] == rel || strings.HasPrefix(f[2], rel+"/e-")) {
					in = true
				}
			}
			if !in {
				t.Errorf("process %s is not in %s: %s", pid, d, b)
			}
		}
	}
	cancel()
	if err := <-done; err == nil {
		t.Errorf("exec cut short by its context: no error")
	}
}
