package local_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// TestExecBornInCgroups: every process of an exec runs in its workspace's
// cgroups, in every controller, and no thread of the broker is left in
// any of them while it runs (the launching thread joins them for the fork
// alone, where the kernel lets it: cgroupHost.selfJoin).
func TestExecBornInCgroups(t *testing.T) {
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
	// bwrap, the sandbox's pid 1, sh and two sleeps. Until bwrap is
	// forked, this process is listed too: its launching thread is in them.
	// It leaves them before bwrap gets its options, so before the
	// sandbox's processes exist.
	self := strconv.Itoa(os.Getpid())
	var procs []string
	waitUntil(t, "the exec's processes", func() bool {
		procs = slices.DeleteFunc(members("cgroup.procs"), func(p string) bool { return p == self })
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
	threads, _ := os.ReadDir("/proc/self/task")
	tasks := members("tasks")
	for _, th := range threads {
		if slices.Contains(tasks, th.Name()) {
			t.Errorf("thread %s of the broker is in the workspace's cgroups while its exec runs", th.Name())
		}
	}
	cancel()
	if err := <-done; err == nil {
		t.Errorf("exec cut short by its context: no error")
	}
}

// leaderExitEnv makes the test binary a process whose main thread exits
// while its other threads go on: its value is a cgroup.procs to join
// first. Go runs main.main on the main thread when an init locks it.
const leaderExitEnv = "SANDGATE_LOCAL_TEST_LEADER_EXIT"

func init() {
	procs := os.Getenv(leaderExitEnv)
	if procs == "" {
		return
	}
	runtime.LockOSThread()
	if err := os.WriteFile(procs, []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		os.Exit(3)
	}
	go func() {
		for {
			time.Sleep(time.Hour)
		}
	}()
	syscall.RawSyscall(syscall.SYS_EXIT, 0, 0, 0) // this thread only
}

// TestKillCgroup: a cgroup's processes are killed, one whose main thread
// has exited (leaving its others) too, but not a process of which only a
// thread passes through it, as the broker's launching thread does.
func TestKillCgroup(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	if !local.SelfJoin(p) {
		t.Skip("cgroup v1 only: on v2 no thread of the broker joins a workspace's cgroup")
	}
	sb := providertest.Create(t, p, providertest.Spec(t))
	var pids string
	for _, d := range local.CgroupDirs(p, sb.Ref) {
		if strings.Contains(d, "/pids/") {
			pids = d
		}
	}
	if pids == "" {
		t.Fatalf("no pids cgroup in %v", local.CgroupDirs(p, sb.Ref))
	}

	plain := exec.Command("sleep", "300")
	if err := plain.Start(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pids, "cgroup.procs"), []byte(strconv.Itoa(plain.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	headless := exec.Command(os.Args[0], "-test.run=^$")
	headless.Env = append(os.Environ(), leaderExitEnv+"="+filepath.Join(pids, "cgroup.procs"))
	if err := headless.Start(); err != nil {
		t.Fatal(err)
	}
	hpid := strconv.Itoa(headless.Process.Pid)
	waitUntil(t, "the helper's main thread to exit, in the cgroup", func() bool {
		b, _ := os.ReadFile("/proc/" + hpid + "/stat")
		procs, _ := os.ReadFile(filepath.Join(pids, "cgroup.procs"))
		i := strings.LastIndexByte(string(b), ')')
		return i > 0 && strings.HasPrefix(string(b[i:]), ") Z") && slices.Contains(strings.Fields(string(procs)), hpid)
	})

	// A thread of this process joins the cgroup, as an exec's launching
	// thread does, and stays until the kill is over.
	in, out := make(chan error), make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		in <- os.WriteFile(filepath.Join(pids, "tasks"), []byte("0"), 0)
		<-out
		os.WriteFile(filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(pids))), "tasks"), []byte("0"), 0)
	}()
	if err := <-in; err != nil {
		t.Fatal(err)
	}
	procs, _ := os.ReadFile(filepath.Join(pids, "cgroup.procs"))
	if !slices.Contains(strings.Fields(string(procs)), strconv.Itoa(os.Getpid())) {
		t.Fatalf("this process is not listed in cgroup.procs with one thread in the cgroup: %s", procs)
	}
	local.KillCgroup(pids) // returns once only this process's thread is left (bounded)
	close(out)

	for _, c := range []*exec.Cmd{plain, headless} {
		var ws syscall.WaitStatus
		waitUntil(t, c.Path+" to die", func() bool {
			pid, _ := syscall.Wait4(c.Process.Pid, &ws, syscall.WNOHANG, nil)
			return pid == c.Process.Pid
		})
		if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			c.Process.Kill()
			t.Errorf("%s: %v; want killed by SIGKILL", c.Path, ws)
		}
	}
}
