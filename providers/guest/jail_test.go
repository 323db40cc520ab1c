//go:build linux && (amd64 || arm64)

package guest_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/sandgate/sandgate/providers/internal/fakeserver"
	"golang.org/x/sys/unix"
)

// The vendor's environment, which the agent inherits from the vendor's exec
// agent and the jail must not pass on.
var vendorEnv = []string{"FLY_MACHINE_ID=e784e90ec4", "FLY_APP_NAME=sg-app", "FLY_IMAGE_REF=registry.fly.io/sg:deployment",
	"FLY_PRIVATE_IP=fdaa::3", "SANDGATE_SPRITE=sg-sprite-1"}

func TestJailSeesOnlyItsOwnProcesses(t *testing.T) {
	// A process outside, standing for the guest's init and keeper.
	outside := exec.Command("sleep", "1000")
	if err := outside.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { outside.Process.Kill(); outside.Wait() })
	pid := strconv.Itoa(outside.Process.Pid)

	r := jail(t, agentDir(t), nil, "sh", "-c", "ps -e -o pid=,comm=; echo; "+
		"kill -STOP "+pid+" && echo stopped; kill -9 "+pid+" && echo killed; test -e /proc/"+pid+" && echo visible; "+
		"kill -9 1; kill -STOP 1; kill -TERM 1; kill -HUP 1; echo init-survived")
	if r.status != 0 {
		t.Fatalf("status %d, stderr %q", r.status, r.stderr)
	}
	list, rest, _ := strings.Cut(r.stdout, "\n\n")
	var comms []string
	for line := range strings.Lines(list) {
		f := strings.Fields(line)
		comms = append(comms, f[1])
		if f[0] == "1" && f[1] != "sandgate-guest" {
			t.Errorf("the jail's pid 1 is %q, want the agent", f[1])
		}
	}
	for _, c := range comms {
		if !slices.Contains([]string{"sandgate-guest", "sh", "ps"}, c) {
			t.Errorf("ps in the jail lists %q; want only the jail's own processes: %q", c, comms)
		}
	}
	for _, bad := range []string{"stopped", "killed", "visible"} {
		if strings.Contains(rest, bad) {
			t.Errorf("the tenant reached a process outside the jail: %q", rest)
		}
	}
	if !strings.Contains(rest, "init-survived") {
		t.Errorf("the jail's init did not survive signals from the tenant: %q", rest)
	}
	if s := procState(outside.Process.Pid); s != "S" {
		t.Errorf("the process outside is in state %q, want S (sleeping)", s)
	}
}

func TestJailEnvironmentAndHostname(t *testing.T) {
	dir := agentDir(t)
	r := run(t, vendorEnv, "run", "--agent-dir", dir, "--env", "FOO=bar", "--", "sh", "-c",
		"hostname; cat /proc/self/environ | tr '\\0' '\\n'; echo; cat "+filepath.Join(dir, "egress.cred")+" && echo cred-visible")
	if r.status == 0 {
		t.Errorf("status 0: the tenant read the agent's credential: %q", r.stdout)
	}
	host, env, _ := strings.Cut(r.stdout, "\n")
	if host != "sandbox" {
		t.Errorf("hostname %q, want sandbox", host)
	}
	vars := strings.Fields(strings.TrimSpace(env))
	slices.Sort(vars)
	want := []string{"FOO=bar", "HOME=/root", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PWD=/root", "SHLVL=1"}
	// sh adds PWD and maybe SHLVL; cat's environ is what sh gives it:
	// nothing the agent did not.
	for _, v := range vars {
		if !slices.Contains(want, v) {
			t.Errorf("the tenant's environment holds %q; want only %q", v, want)
		}
	}
	if !slices.Contains(vars, "FOO=bar") {
		t.Errorf("the tenant's environment lacks FOO=bar: %q", vars)
	}
	if strings.Contains(r.stdout, "not-for-the-tenant") || strings.Contains(r.stdout, "cred-visible") {
		t.Errorf("the tenant read the credential: %q", r.stdout)
	}
}

func TestJailInitEnvironHasNoVendorVariables(t *testing.T) {
	dir := agentDir(t)
	cmd := guestFor(t, dir).command("run", "--agent-dir", dir, "--env", "FOO=bar", "--", "sleep", "1000")
	cmd.Env = append(os.Environ(), vendorEnv...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// The tenant is the jail's sleep, and the jail's init its parent:
	// found by name rather than as each process's first child, which may
	// be a helper gone by the time it is read.
	var tenant int
	waitFor(t, "the tenant's sleep", func() bool { tenant = descendantNamed(cmd.Process.Pid, "sleep"); return tenant > 0 })
	init := parentOf(t, tenant)
	for _, pid := range []int{init, tenant} {
		// The host's root can read what the tenant cannot (pid 1 is not
		// dumpable).
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			t.Fatal(err)
		}
		vars := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		slices.Sort(vars)
		want := []string{"FOO=bar", "HOME=/root", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
		if !slices.Equal(vars, want) {
			t.Errorf("environ of pid %d is %q, want %q", pid, vars, want)
		}
	}
	if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", init)); strings.Contains(string(cmdline), "FOO") {
		t.Errorf("the jail's init carries its configuration on its command line: %q", cmdline)
	}
}

// inFakeGuest runs script as the root of a disposable guest built as the
// fake vendors build theirs (bwrap, package local, and
// fakeserver.GuestBoot): a user namespace whose writable /usr and /etc
// are overlays of the host's, so that a jail that failed to keep the
// tenant off the guest's root damages nothing of the host's. The agent is
// /opt/sandgate-guest, its directory /.sandgate, with a keeper for an
// hour; script's stdout is returned.
func inFakeGuest(t *testing.T, script string) string {
	t.Helper()
	until := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	boot := fakeserver.GuestBoot + "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n" +
		"/opt/sandgate-guest keeper --detach --until " + until + " || exit 1\n"
	cmd := exec.Command("bwrap", "--unshare-user", "--uid", "0", "--gid", "0", "--cap-add", "ALL", "--unshare-pid", "--unshare-ipc",
		"--unshare-uts", "--share-net", "--die-with-parent", "--proc", "/proc", "--dev", "/dev", "--ro-bind", "/usr", "/usr",
		"--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
		"--ro-bind", "/etc", "/etc", "--ro-bind", "/sys", "/sys", "--bind", agentDir(t), "/.sandgate", "--ro-bind", agent, "/opt/sandgate-guest",
		"--tmpfs", "/tmp", "--dir", "/root", "--dir", "/var/lib", "sh", "-c", boot+script)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: stdout %q, stderr %q", err, out.String(), errb.String())
	}
	return out.String()
}

func TestJailRootWritesPersist(t *testing.T) {
	out := inFakeGuest(t, `sg=/opt/sandgate-guest
$sg run -- sh -c 'echo installed > /etc/sg-pkg && chmod 640 /etc/sg-pkg && mkdir -p /var/lib/sg-pkg && echo state > /var/lib/sg-pkg/db && id -u' || exit 1
echo --
$sg run -- sh -c 'cat /etc/sg-pkg /var/lib/sg-pkg/db && stat -c %a /etc/sg-pkg'
echo --
test -e /etc/sg-pkg && echo guest-etc; test -e /var/lib/sg-pkg && echo guest-var-lib; true
`)
	want := "0\n--\ninstalled\nstate\n640\n--\n"
	if out != want {
		t.Errorf("a write in one jail, read in the next, and the guest's own root:\n%s\nwant:\n%s", out, want)
	}
}

// TestJailCannotReachTheGuestsRoot overwrites, in the jail, the tools the
// broker's outside scripts run as the guest's root (timeout, head,
// base64, sh early in PATH, a sudo, ld.so.preload) with ones that leave a
// marker, and then runs more jails, a durable command and those tools
// outside: no marker appears and everything still works.
func TestJailCannotReachTheGuestsRoot(t *testing.T) {
	out := inFakeGuest(t, `sg=/opt/sandgate-guest
trap='#!/bin/sh
touch /tmp/pwned
'
$sg run -- sh -c 'for p in /usr/bin/timeout /usr/bin/head /usr/bin/base64 /usr/local/bin/sudo /usr/local/sbin/sh; do
	mkdir -p "${p%/*}" && printf "%s" "$1" > "$p" && chmod 755 "$p" || exit 1
done; echo /no/such/lib.so > /etc/ld.so.preload && echo poisoned' sh "$trap" || exit 1
$sg run -- grep -c pwned /usr/bin/timeout
$sg run --detach --stdout-file /tmp/out --status-file /tmp/status -- echo durable || exit 1
while ! test -e /tmp/status; do sleep 0.05; done
cat /tmp/out
echo hello | head -c 5 | base64 && timeout 10 true && sh -c 'echo sh-ok' && sudo -n true 2>/dev/null; true
test -e /etc/ld.so.preload && echo preload-reached-the-guest
test -e /tmp/pwned && echo PWNED; true
`)
	want := "poisoned\n1\ndurable\naGVsbG8=\nsh-ok\n"
	if out != want {
		t.Errorf("after the tenant poisoned its tools:\n%s\nwant:\n%s", out, want)
	}
}

// TestJailHidesGuestState: the guest's /run (its services' sockets) is
// not the jail's, and the jail's hosts and hostname name nothing of the
// guest's.
func TestJailHidesGuestState(t *testing.T) {
	out := inFakeGuest(t, `sg=/opt/sandgate-guest
hostname vendor-machine-e784e90ec4 || exit 1
echo '10.0.0.1 vendor-machine-e784e90ec4' >> /etc/hosts
touch /run/docker.sock
$sg run -- sh -c 'ls -A /run; echo --; cat /etc/hostname /etc/hosts; echo --; hostname; echo evil > /etc/hosts && echo wrote; true'
`)
	want := "--\nsandbox\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsandbox\n--\nsandbox\n"
	if out != want {
		t.Errorf("the jail's /run, hostname and hosts:\n%s\nwant:\n%s", out, want)
	}
}

func TestJailNetworkIsLoopbackOnly(t *testing.T) {
	canary, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer canary.Close()
	reached := make(chan struct{}, 1)
	go func() {
		for {
			c, err := canary.Accept()
			if err != nil {
				return
			}
			c.Close()
			reached <- struct{}{}
		}
	}()
	port := strconv.Itoa(canary.Addr().(*net.TCPAddr).Port)
	r := jail(t, agentDir(t), nil, "sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1; "+
		"curl -sS --max-time 20 --noproxy '*' http://127.0.0.1:"+port+"/ && echo reached; ip link set lo down && echo reconfigured; true")
	ifaces := strings.Fields(strings.Split(r.stdout, "reached")[0])
	if len(ifaces) == 0 || ifaces[0] != "lo" {
		t.Errorf("interfaces in the jail: %q, want only lo", r.stdout)
	}
	for _, bad := range []string{"reached", "reconfigured", "eth"} {
		if strings.Contains(r.stdout, bad) {
			t.Errorf("the jail's network: %q", r.stdout)
		}
	}
	select {
	case <-reached:
		t.Error("the canary on the host's loopback was reached from the jail")
	default:
	}
}

func TestRunExitStatuses(t *testing.T) {
	notExec := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"true", []string{"--", "true"}, 0},
		{"false", []string{"--", "false"}, 1},
		{"exit 42", []string{"--", "sh", "-c", "exit 42"}, 42},
		{"not found", []string{"--", "no-such-command-sg"}, 127},
		{"not found by path", []string{"--", "/no/such/command"}, 127},
		{"not executable", []string{"--", notExec}, 126},
		{"timeout", []string{"--timeout", "1", "--", "sleep", "1000"}, 124},
		{"killed", []string{"--", "sh", "-c", "kill -9 $$"}, 128 + 9},
		{"no jail", []string{"--egress-sock", "/no/such/egress.sock", "--", "true"}, 125},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, nil, append([]string{"run", "--agent-dir", agentDir(t)}, tc.args...)...)
			if r.status != tc.want {
				t.Errorf("status %d, want %d (stderr %q)", r.status, tc.want, r.stderr)
			}
			if tc.want == 127 && strings.Count(r.stderr, "\n") != 1 {
				t.Errorf("stderr %q, want one line", r.stderr)
			}
		})
	}
}

func TestRunStdio(t *testing.T) {
	dir := agentDir(t)
	cmd := guestFor(t, dir).command("run", "--agent-dir", dir, "--", "sh", "-c", "tr a-z A-Z; echo err >&2")
	cmd.Stdin = strings.NewReader("hello\n")
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if out.String() != "HELLO\n" || errb.String() != "err\n" {
		t.Errorf("stdout %q, stderr %q", out.String(), errb.String())
	}
}

func TestRunDurable(t *testing.T) {
	dir := t.TempDir()
	stdout, stderr, status := filepath.Join(dir, "out"), filepath.Join(dir, "err"), filepath.Join(dir, "status")
	gate := filepath.Join(dir, "gate")
	adir := agentDir(t)
	r := run(t, nil, "run", "--agent-dir", adir, "--detach", "--stdout-file", stdout, "--stderr-file", stderr,
		"--status-file", status, "--", "sh", "-c", "echo out; echo err >&2; while ! test -e "+gate+"; do sleep 0.05; done; exit 7")
	if r.status != 0 {
		t.Fatalf("--detach: status %d, stderr %q", r.status, r.stderr)
	}
	// The agent that started it has exited; the command runs on.
	waitFor(t, "the durable command's output", func() bool {
		b, _ := os.ReadFile(stdout)
		return string(b) == "out\n"
	})
	if _, err := os.Stat(status); err == nil {
		t.Fatal("the status file exists before the command ended")
	}
	// The gate is in the jails' root: written by a jail, as the guest's
	// own root does not reach it.
	if r := jail(t, adir, nil, "touch", gate); r.status != 0 {
		t.Fatalf("touch the gate: status %d, stderr %q", r.status, r.stderr)
	}
	waitFor(t, "the status file", func() bool { _, err := os.Stat(status); return err == nil })
	if b, _ := os.ReadFile(status); string(b) != "7\n" {
		t.Errorf("status file %q, want 7", b)
	}
	if b, _ := os.ReadFile(stderr); string(b) != "err\n" {
		t.Errorf("stderr file %q", b)
	}
}

// probe runs as a jail's tenant: it tries each syscall the jail refuses
// and prints name=errno for each.
func probe() int {
	nsNet, err := os.Open("/proc/self/ns/net")
	if err != nil {
		fmt.Println("open ns:", err)
		return 1
	}
	var buf [256]byte
	p := uintptr(unsafe.Pointer(&buf[0]))
	for _, c := range []struct {
		name string
		nr   uintptr
		args [6]uintptr
	}{
		{"mount", unix.SYS_MOUNT, [6]uintptr{p, p, p, 0, 0, 0}},
		{"umount2", unix.SYS_UMOUNT2, [6]uintptr{p, 0}},
		{"unshare-user", unix.SYS_UNSHARE, [6]uintptr{unix.CLONE_NEWUSER}},
		{"unshare-net", unix.SYS_UNSHARE, [6]uintptr{unix.CLONE_NEWNET}},
		{"clone-newuser", unix.SYS_CLONE, [6]uintptr{unix.CLONE_NEWUSER | uintptr(syscall.SIGCHLD)}},
		{"clone3", unix.SYS_CLONE3, [6]uintptr{p, 88}},
		{"setns", unix.SYS_SETNS, [6]uintptr{nsNet.Fd(), 0}},
		{"keyctl", unix.SYS_KEYCTL, [6]uintptr{0, ^uintptr(0)}},
		{"add_key", unix.SYS_ADD_KEY, [6]uintptr{p, p, p, 1, ^uintptr(0)}},
		{"io_uring_setup", unix.SYS_IO_URING_SETUP, [6]uintptr{1, p}},
		{"perf_event_open", unix.SYS_PERF_EVENT_OPEN, [6]uintptr{p, 0, ^uintptr(0), ^uintptr(0), 0}},
		{"bpf", unix.SYS_BPF, [6]uintptr{0, p, 0}},
		{"ptrace", unix.SYS_PTRACE, [6]uintptr{unix.PTRACE_TRACEME}},
		{"userfaultfd", unix.SYS_USERFAULTFD, [6]uintptr{0}},
		{"kexec_load", unix.SYS_KEXEC_LOAD, [6]uintptr{0, 0, 0, 0}},
		{"init_module", unix.SYS_INIT_MODULE, [6]uintptr{p, 1, p}},
		{"reboot", unix.SYS_REBOOT, [6]uintptr{0, 0, 0, 0}},
		{"swapon", unix.SYS_SWAPON, [6]uintptr{p, 0}},
		{"settimeofday", unix.SYS_SETTIMEOFDAY, [6]uintptr{p, 0}},
		{"pivot_root", unix.SYS_PIVOT_ROOT, [6]uintptr{p, p}},
	} {
		_, _, e := unix.Syscall6(c.nr, c.args[0], c.args[1], c.args[2], c.args[3], c.args[4], c.args[5])
		fmt.Printf("%s=%d\n", c.name, e)
	}
	return 0
}

func TestJailRefusesSyscalls(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, nil, "run", "--agent-dir", agentDir(t), "--env", probeEnv+"=1", "--", self)
	if r.status != 0 {
		t.Fatalf("probe: status %d, stdout %q, stderr %q", r.status, r.stdout, r.stderr)
	}
	got := map[string]string{}
	for line := range strings.Lines(r.stdout) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), "=")
		got[k] = v
	}
	for _, name := range []string{"mount", "umount2", "unshare-user", "unshare-net", "clone-newuser", "setns", "keyctl", "add_key",
		"io_uring_setup", "perf_event_open", "bpf", "ptrace", "userfaultfd", "kexec_load", "init_module", "reboot", "swapon",
		"settimeofday", "pivot_root"} {
		if want := strconv.Itoa(int(syscall.EPERM)); got[name] != want {
			t.Errorf("%s in the jail: errno %s, want EPERM (%s)", name, got[name], want)
		}
	}
	if want := strconv.Itoa(int(syscall.ENOSYS)); got["clone3"] != want {
		t.Errorf("clone3 in the jail: errno %s, want ENOSYS (%s)", got["clone3"], want)
	}
	// The tools a tenant would reach for fail too; the guest's disks are
	// out of reach (no node in /dev, none can be made), /sys is read-only.
	r = jail(t, agentDir(t), nil, "sh", "-c", "unshare -U true && echo unshared; mount -t tmpfs none /mnt && echo mounted; "+
		"nsenter -t $$ -n true && echo entered; ls /dev | grep -E '^(sd|vd|nvme|xvd|loop|mem|kmsg)' && echo disks; "+
		"mknod /tmp/sg-disk-$$ b 8 0 && echo mknod; echo never > /sys/kernel/mm/transparent_hugepage/enabled && echo sysfs; "+
		"echo x > /dev/null && test -c /dev/urandom && echo devices-ok; true")
	if !strings.Contains(r.stdout, "devices-ok") {
		t.Errorf("the jail's /dev lacks null or urandom: %q %q", r.stdout, r.stderr)
	}
	for _, bad := range []string{"unshared", "mounted", "entered", "disks", "mknod", "sysfs"} {
		if strings.Contains(r.stdout, bad) {
			t.Errorf("in the jail: %q", r.stdout)
		}
	}
	// Docker's default capabilities but CAP_MKNOD, no more; no_new_privs.
	r = jail(t, agentDir(t), nil, "grep", "-E", "^(CapBnd|CapEff|CapPrm|CapInh|CapAmb|NoNewPrivs|Seccomp):", "/proc/self/status")
	for _, want := range []string{"CapBnd:\t00000000a00425fb", "CapEff:\t00000000a00425fb", "CapAmb:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"} {
		if !strings.Contains(r.stdout, want+"\n") {
			t.Errorf("the tenant's status lacks %q:\n%s", want, r.stdout)
		}
	}
}

// TestJailInUserNamespaceGuest builds the jail where the guest's root is
// root of a user namespace only, as in the fake vendors' guests: the
// kernel refuses it a fresh sysfs and device nodes of its own making, and
// its overlays keep their metadata in user extended attributes.
func TestJailInUserNamespaceGuest(t *testing.T) {
	out := inFakeGuest(t, "/opt/sandgate-guest run -- sh -c \"ps -e -o comm=; hostname; echo x > /dev/null && test -c /dev/urandom && echo devices-ok; "+
		"echo x > /sys/kernel/mm/transparent_hugepage/enabled && echo sysfs-written; unshare -U true && echo unshared; true\"")
	want := "sandgate-guest\nsh\nps\nsandbox\ndevices-ok\n"
	if out != want {
		t.Errorf("in a user-namespace guest the jail gives %q, want %q", out, want)
	}
}

// descendantNamed returns a descendant of pid whose command name is name,
// or 0.
func descendantNamed(pid int, name string) int {
	for _, c := range children(pid) {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", c)); err == nil && strings.TrimSpace(string(b)) == name {
			return c
		}
		if d := descendantNamed(c, name); d > 0 {
			return d
		}
	}
	return 0
}

// parentOf returns pid's parent.
func parentOf(t testing.TB, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("stat of %d: %q", pid, s)
	}
	return ppid
}
