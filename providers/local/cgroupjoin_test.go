package local_test

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// TestExecBornInCgroups: every process of an exec runs in its workspace's
// cgroups, in every controller, and no thread of the broker is ever in
// any of them: on v1 bwrap joins them itself as it starts (joinAsStarted),
// unless a hierarchy is mounted with favordynmods (a mount table saying
// so, here), where the broker moves it in by its pid.
func TestExecBornInCgroups(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	v1 := false
	for i, l := range lines {
		if strings.Contains(l, " - cgroup cgroup ") {
			lines[i], v1 = l+",favordynmods", true
		}
	}
	dynmods := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(dynmods, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, mountinfo string
		joinsItself     bool
	}{
		{"host", "", v1},
		{"favordynmods", dynmods, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := local.Config{DataDir: t.TempDir()}
			if tc.mountinfo != "" {
				local.SetMountinfo(&c, tc.mountinfo)
			}
			p, err := local.New(t.Context(), c, providers.Env{BrokerID: broker})
			if err != nil {
				t.Fatalf("local.New: %v", err)
			}
			t.Cleanup(func() { providertest.Discard(p) })
			if got := local.JoinsItself(p); got != tc.joinsItself {
				t.Errorf("bwrap joins its cgroups itself: %v; want %v", got, tc.joinsItself)
			}
			execInCgroups(t, p)
		})
	}
}

// execInCgroups runs an exec in a new workspace of p and checks that each
// of its processes is in each of the workspace's cgroups, and that no
// thread of this process is in any of them.
func execInCgroups(t *testing.T, p *local.Provider) {
	t.Helper()
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
	// sh and two sleeps; bwrap and the sandbox's pid 1 too on an exec
	// of its own (a resident, which runs no tenant code, joins none of
	// them: README.md, "The resident").
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
		sleeps := 0
		for _, pid := range procs {
			if b, _ := os.ReadFile("/proc/" + pid + "/cmdline"); string(b) == "sleep\x0060\x00" {
				sleeps++
			}
		}
		return len(procs) >= 3 && sleeps == 2
	})
	for _, pid := range procs {
		if b, _ := os.ReadFile("/proc/" + pid + "/cmdline"); strings.Contains(string(b), "\x00--sandgate-exec-resident\x00") {
			// The resident, listed while the thread that forks a
			// command is in the exec's cgroups; the resident itself
			// is in none (TestResidentOutsideTenantLimits).
			continue
		}
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

// TestJoinAsStarted: the sh in front of bwrap joins the cgroups it is
// handed, passes none of their descriptors (nor its status pipe's) on,
// and says so when a join fails instead of running the command.
func TestJoinAsStarted(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	sb := providertest.Create(t, p, providertest.Spec(t))
	var pids string
	for _, d := range local.CgroupDirs(p, sb.Ref) {
		if strings.Contains(d, "/pids/") {
			pids = d
		}
	}
	if pids == "" {
		t.Skip("cgroup v2: bwrap is moved in by its pid")
	}
	// run runs argv as bwrap would be, behind the sh that joins tasks.
	run := func(t *testing.T, tasks *os.File, argv ...string) (out string, status []byte, err error) {
		cmd := exec.Command(argv[0], argv[1:]...)
		var stdout strings.Builder
		cmd.Stdout = &stdout
		st, stW, err := local.JoinAsStarted(cmd, []*os.File{tasks})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		err = cmd.Start()
		stW.Close()
		if err != nil {
			t.Fatal(err)
		}
		err = cmd.Wait()
		status, _ = io.ReadAll(st)
		return stdout.String(), status, err
	}
	open := func(t *testing.T, dir string) *os.File {
		f, err := os.OpenFile(filepath.Join(dir, "tasks"), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}

	t.Run("joined", func(t *testing.T) {
		out, status, err := run(t, open(t, pids), "/bin/sh", "-c", `cat /proc/self/cgroup; echo --; ls /proc/self/fd`)
		if err != nil || len(status) != 0 {
			t.Fatalf("%v, status %q; want a clean exit and no status", err, status)
		}
		cgroups, fds, _ := strings.Cut(out, "--\n")
		rel := pids[strings.Index(pids, "/sandgate/"):]
		if !strings.Contains(cgroups, ":pids:"+rel+"\n") {
			t.Errorf("the command's cgroups: %s; want pids %s", cgroups, rel)
		}
		// 0, 1, 2 and ls's own directory: nothing of the join.
		if f := strings.Fields(fds); len(f) > 4 {
			t.Errorf("descriptors open in the command: %v; want only 0, 1, 2 and ls's own", f)
		}
	})
	t.Run("refused", func(t *testing.T) {
		gone := filepath.Join(pids, "gone")
		if err := os.Mkdir(gone, 0o755); err != nil {
			t.Fatal(err)
		}
		tasks := open(t, gone)
		if err := os.Remove(gone); err != nil {
			t.Fatal(err)
		}
		out, status, err := run(t, tasks, "/bin/echo", "ran")
		if len(status) == 0 || out != "" {
			t.Errorf("join of a removed cgroup: %v, output %q, status %q; want a status and nothing run", err, out, status)
		}
	})
}
