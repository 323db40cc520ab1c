package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// selfExe is the agent's own binary, run again as the jail's pid 1 and
// as a detached child: by its name, so that ps shows sandgate-guest.
func selfExe() string {
	if p, err := os.Executable(); err == nil {
		return p
	}
	return "/proc/self/exe"
}

// jailCloneFlags are the namespaces of a jail. No user namespace: the
// guest's root stays root (with fewer capabilities) on the guest's own file
// system, as package installs need.
const jailCloneFlags = syscall.CLONE_NEWPID | syscall.CLONE_NEWNET | syscall.CLONE_NEWNS |
	syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS

// initConfig is what the agent tells the jail's pid 1, on a pipe rather
// than on its command line, which the tenant can read in /proc/1/cmdline.
type initConfig struct {
	Argv       []string
	Dir        string
	EgressSock string
	ProxyPort  int
	AgentDir   string
}

// Run runs c.Argv in a fresh jail with the agent's stdio (or c's files)
// and returns its exit status: the tenant's; 128+N when a signal N ended
// it; 124 when c.Timeout passed; 127 or 126 when c.Argv[0] is not found
// or not executable; 125 when the jail could not be built. SIGTERM, SIGINT
// and SIGHUP, and ctx, end the jail.
func Run(ctx context.Context, c RunConfig) int {
	if c.ProxyPort == 0 {
		c.ProxyPort = DefaultProxyPort
	}
	if c.AgentDir == "" {
		c.AgentDir = DefaultAgentDir
	}
	stdout, stderr := os.Stdout, os.Stderr
	for _, o := range []struct {
		name string
		f    **os.File
	}{{c.StdoutFile, &stdout}, {c.StderrFile, &stderr}} {
		if o.name == "" {
			continue
		}
		f, err := os.OpenFile(o.name, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			fmt.Fprintln(os.Stderr, "sandgate-guest: cannot open an output file:", cause(err))
			return exitJailFailure
		}
		defer f.Close()
		*o.f = f
	}
	status := runJail(ctx, c, stdout, stderr)
	if c.StatusFile != "" {
		if err := writeStatus(c.StatusFile, status); err != nil {
			fmt.Fprintln(os.Stderr, "sandgate-guest: cannot write the status file:", cause(err))
		}
	}
	return status
}

// writeStatus writes status to name whole or not at all: a reader that
// finds the file finds the status.
func writeStatus(name string, status int) error {
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(status)+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}

// runJail starts the jail's pid 1 in its new namespaces, hands it its
// configuration, and waits for it, a signal, ctx or the timeout.
func runJail(ctx context.Context, c RunConfig, stdout, stderr *os.File) int {
	until, err := liveKeeper(c.AgentDir)
	if err != nil {
		fmt.Fprintln(stderr, "sandgate-guest: refused:", err)
		return exitJailFailure
	}
	if err := ensureRoot(c.AgentDir); err != nil {
		fmt.Fprintln(stderr, "sandgate-guest: cannot build the jail:", err)
		return exitJailFailure
	}
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		fmt.Fprintln(stderr, "sandgate-guest:", err)
		return exitJailFailure
	}
	defer cfgW.Close()
	cmd := &exec.Cmd{
		Path:        selfExe(),
		Args:        []string{"sandgate-guest", InitCommand},
		Env:         tenantEnv(c.Env, c.EgressSock != "", c.ProxyPort),
		Dir:         "/",
		Stdin:       os.Stdin,
		Stdout:      stdout,
		Stderr:      stderr,
		ExtraFiles:  []*os.File{cfgR},
		SysProcAttr: &syscall.SysProcAttr{Cloneflags: jailCloneFlags, Pdeathsig: syscall.SIGKILL},
	}
	// The jail's parent-death signal follows the thread that forks it:
	// keep that thread until the jail has ended.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	err = cmd.Start()
	cfgR.Close()
	if err != nil {
		fmt.Fprintln(stderr, "sandgate-guest: cannot start the jail:", cause(err))
		return exitJailFailure
	}
	ic := initConfig{Argv: c.Argv, Dir: c.Dir, EgressSock: c.EgressSock, ProxyPort: c.ProxyPort, AgentDir: c.AgentDir}
	if err := json.NewEncoder(cfgW).Encode(ic); err != nil {
		cmd.Process.Kill()
	}
	cfgW.Close()

	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	var timeout <-chan time.Time
	if c.Timeout > 0 {
		t := time.NewTimer(c.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	// The jail ends at the guest's deadline even if the keeper does not
	// end it: this agent is outside the jail, out of the tenant's reach.
	end := time.NewTimer(time.Until(until))
	defer end.Stop()
	timedOut := false
	select {
	case <-done:
	case <-end.C:
	case <-timeout:
		timedOut = true
	case <-sigs:
	case <-ctx.Done():
	}
	// SIGKILL to the jail's pid 1 (the only signal its init takes from
	// outside unless it handles one) ends everything in its namespace.
	cmd.Process.Kill()
	<-done
	if timedOut {
		return ExitTimeout
	}
	return exitStatus(cmd.ProcessState)
}

// exitStatus is a process's status as a shell reports it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ExitSignalBase + int(ws.Signal())
	}
	return ps.ExitCode()
}

// JailInit is the jail's pid 1: it builds the jail from inside its new
// namespaces, starts the tenant, reaps every orphan, and returns the
// tenant's status once the tenant's main process ends (its exit then
// kills everything left in the jail).
func JailInit() int {
	// Capabilities and the bounding set belong to a thread: the one that
	// drops them also starts the tenant.
	runtime.LockOSThread()
	// A pid namespace's init gets only the signals it handles; handling
	// every one and doing nothing ignores them without passing SIG_IGN on
	// to the tenant, as signal.Ignore would.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs)
	go func() {
		for range sigs {
		}
	}()
	f := os.NewFile(3, "config")
	var ic initConfig
	err := json.NewDecoder(f).Decode(&ic)
	f.Close()
	if err != nil || len(ic.Argv) == 0 {
		fmt.Fprintln(os.Stderr, "sandgate-guest: jail: bad configuration")
		return exitJailFailure
	}
	if err := buildJail(ic); err != nil {
		fmt.Fprintln(os.Stderr, "sandgate-guest: cannot build the jail:", err)
		return exitJailFailure
	}
	dir := ic.Dir
	if dir == "" {
		dir = os.Getenv("HOME")
	}
	if err := os.Chdir(dir); err != nil {
		fmt.Fprintln(os.Stderr, "sandgate-guest: cannot enter the working directory:", cause(err))
		return exitJailFailure
	}
	if err := harden(); err != nil {
		fmt.Fprintln(os.Stderr, "sandgate-guest: cannot build the jail:", err)
		return exitJailFailure
	}
	p, status := startTenant(ic.Argv)
	if p == nil {
		return status
	}
	return reap(p.Pid)
}

// startTenant starts argv with the jail's stdio and environment (the
// agent's own, built from scratch by Run). When it cannot, it says so on
// stderr in one line and returns the shell's status: 127 not found, 126
// not executable.
func startTenant(argv []string) (*os.Process, int) {
	path := argv[0]
	if !strings.Contains(path, "/") {
		lp, err := exec.LookPath(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "sandgate-guest: %s: command not found\n", path)
			return nil, ExitNotFound
		}
		path = lp
	}
	p, err := os.StartProcess(path, argv, &os.ProcAttr{
		Env:   os.Environ(),
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
	})
	switch {
	case err == nil:
		return p, 0
	case errors.Is(err, fs.ErrNotExist):
		fmt.Fprintf(os.Stderr, "sandgate-guest: %s: command not found\n", argv[0])
		return nil, ExitNotFound
	default:
		fmt.Fprintf(os.Stderr, "sandgate-guest: %s: cannot execute: %v\n", argv[0], cause(err))
		return nil, ExitNotExec
	}
}

// reap waits for every child (orphans of the jail become pid 1's) until
// pid ends, and returns pid's status.
func reap(pid int) int {
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return exitJailFailure
		}
		if got != pid {
			continue
		}
		if ws.Signaled() {
			return ExitSignalBase + int(ws.Signal())
		}
		return ws.ExitStatus()
	}
}

// buildJail sets up the namespaces pid 1 was born in: private mounts;
// in the jails' root tree (ensureRoot), a proc of the new pid namespace,
// its own /sys, /dev and /run, the agent's directory hidden, its own hosts
// and hostname files; then that tree as /, the guest's own root detached;
// the host name, loopback up, and the proxy relay.
//
// Every mount is made before the pivot, while the guest's root is in this
// mount namespace (a bind's source must be, and a user namespace's root,
// as in the fakes' guests, may mount a proc only while the guest's is
// visible), on a target opened inside the tree (openat2 RESOLVE_IN_ROOT):
// a link the tenant left in its writable root resolves inside the tree,
// never into the guest's own root.
func buildJail(ic initConfig) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("private mounts: %w", err)
	}
	// The forwarder's socket sits in the agent's directory, which the
	// tree hides: keep a handle on it to connect through.
	sockFD := -1
	if ic.EgressSock != "" {
		fd, err := unix.Open(ic.EgressSock, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("egress socket: %w", err)
		}
		sockFD = fd
	}
	merged := filepath.Join(ic.AgentDir, rootMerged)
	rootFD, err := unix.Open(merged, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the jails' root: %w", err)
	}
	t := tree{root: rootFD}
	defer t.close()
	if err := t.mountKernel(); err != nil {
		return err
	}
	if err := t.mountDev(); err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	// The guest's /run holds its services' sockets; the jail's is empty.
	if err := t.mountTmpfs("run", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m"); err != nil {
		return fmt.Errorf("run: %w", err)
	}
	if err := t.mountTmpfs(ic.AgentDir, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_RDONLY, "mode=0700,size=4k"); err != nil {
		return fmt.Errorf("hide the agent: %w", err)
	}
	state := filepath.Join(ic.AgentDir, rootState)
	for _, name := range []string{"hosts", "hostname"} {
		if err := t.bindFile(filepath.Join(state, name), "etc/"+name); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	if err := pivotRoot(merged); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(Hostname)); err != nil {
		return fmt.Errorf("hostname: %w", err)
	}
	if err := unix.Setdomainname([]byte("(none)")); err != nil {
		return fmt.Errorf("domain name: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	if sockFD >= 0 {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(ic.ProxyPort)))
		if err != nil {
			return fmt.Errorf("proxy relay: %w", err)
		}
		go relay(ln, fdPath(sockFD))
	}
	return nil
}

// fdPath names the file fd refers to, for mount(2).
func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// tree is the jails' root tree before the pivot, opened by its root.
type tree struct {
	root int
	fds  []int // to close
}

func (t *tree) close() {
	for _, fd := range t.fds {
		unix.Close(fd)
	}
	unix.Close(t.root)
}

// open opens name (relative, or absolute from the tree's root) inside
// the tree: no link leaves it. The descriptor lives as long as t.
func (t *tree) open(name string, flags uint64, mode uint64) (int, error) {
	fd, err := unix.Openat2(t.root, name, &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Mode:    mode,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, err
	}
	t.fds = append(t.fds, fd)
	return fd, nil
}

// dir opens the directory name in the tree.
func (t *tree) dir(name string) (int, error) {
	return t.open(name, unix.O_PATH|unix.O_DIRECTORY, 0)
}

// mountTmpfs mounts a tmpfs on the directory name in the tree, making it
// first in the tree's root when the image lacks it.
func (t *tree) mountTmpfs(name string, flags uintptr, data string) error {
	fd, err := t.dir(name)
	if errors.Is(err, unix.ENOENT) && !strings.Contains(strings.Trim(name, "/"), "/") {
		if err := unix.Mkdirat(t.root, strings.Trim(name, "/"), 0o755); err != nil {
			return err
		}
		fd, err = t.dir(name)
	}
	if err != nil {
		return err
	}
	return unix.Mount("tmpfs", fdPath(fd), "tmpfs", flags, data)
}

// remount makes the mount at name in the tree read-only (with flags): a
// descriptor opened after the mount names its root.
func (t *tree) remount(name string, flags uintptr) error {
	fd, err := t.open(name, unix.O_PATH, 0)
	if err != nil {
		return err
	}
	return unix.Mount("", fdPath(fd), "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|flags, "")
}

// bindFile binds src, a file of the guest's, read-only over name in the
// tree, making name first when the image lacks it.
func (t *tree) bindFile(src, name string) error {
	sfd, err := unix.Open(src, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(sfd)
	fd, err := t.open(name, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if errors.Is(err, unix.ENOENT) {
		if fd, err = t.open(name, unix.O_WRONLY|unix.O_CREAT|unix.O_NOFOLLOW, 0o644); err != nil {
			return err
		}
	}
	if err != nil {
		return err
	}
	if err := unix.Mount(fdPath(sfd), fdPath(fd), "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return t.remount(name, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC)
}

// mountKernel mounts the jail's proc (of its own pid namespace, the
// kernel's tunables read-only, no sysrq) and /sys.
func (t *tree) mountKernel() error {
	const nodev = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	fd, err := t.dir("proc")
	if err != nil {
		return fmt.Errorf("proc: %w", err)
	}
	if err := unix.Mount("proc", fdPath(fd), "proc", nodev, ""); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	// As a container runtime does.
	if fd, err = t.dir("proc/sys"); err != nil {
		return fmt.Errorf("proc/sys: %w", err)
	}
	if err := unix.Mount(fdPath(fd), fdPath(fd), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("proc/sys: %w", err)
	}
	if err := t.remount("proc/sys", nodev); err != nil {
		return fmt.Errorf("proc/sys read-only: %w", err)
	}
	if null, err := unix.Open("/dev/null", unix.O_PATH|unix.O_CLOEXEC, 0); err == nil {
		defer unix.Close(null)
		if fd, err := t.open("proc/sysrq-trigger", unix.O_PATH, 0); err == nil {
			if err := unix.Mount(fdPath(null), fdPath(fd), "", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("sysrq: %w", err)
			}
		}
	}
	if err := t.mountSys(); err != nil {
		return fmt.Errorf("sysfs: %w", err)
	}
	return nil
}

// mountSys makes /sys read-only: a fresh sysfs (it shows the jail's
// network only) or, where the kernel refuses one (a guest that is itself a
// user namespace, as the fakes' are, without a fully visible sysfs), the
// guest's own, bound read-only. A guest without /sys gives a jail without.
func (t *tree) mountSys() error {
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_RDONLY
	fd, err := t.dir("sys")
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	err = unix.Mount("sysfs", fdPath(fd), "sysfs", flags, "")
	if err == nil {
		return nil
	}
	if err := unix.Mount("/sys", fdPath(fd), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	return t.remount("sys", flags&^unix.MS_RDONLY)
}

// devices are the nodes of the jail's /dev.
var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// mountDev gives the jail a /dev of its own with the few devices a
// program expects (bound from the guest's, as making nodes needs a
// privilege a guest that is a user namespace lacks), a pty instance of its
// own and a /dev/shm: none of the guest's disks, whose raw blocks hold the
// agent's credential.
func (t *tree) mountDev() error {
	if err := t.mountTmpfs("dev", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return err
	}
	dev, err := t.dir("dev") // the tmpfs now
	if err != nil {
		return err
	}
	for _, d := range devices {
		src, err := unix.Open("/dev/"+d, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // a guest without it: so is the jail
		}
		fd, err := unix.Openat(dev, d, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o666)
		if err == nil {
			unix.Close(fd)
			fd, err = unix.Openat(dev, d, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		}
		if err == nil {
			err = unix.Mount(fdPath(src), fdPath(fd), "", unix.MS_BIND, "")
			unix.Close(fd)
		}
		unix.Close(src)
		if err != nil {
			return err
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := unix.Mkdirat(dev, d, 0o755); err != nil {
			return err
		}
	}
	pts, err := t.dir("dev/pts")
	if err != nil {
		return err
	}
	if err := unix.Mount("devpts", fdPath(pts), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return err
	}
	if err := t.mountTmpfs("dev/shm", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return err
	}
	for link, target := range map[string]string{"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := unix.Symlinkat(target, dev, link); err != nil {
			return err
		}
	}
	return nil
}

// loopbackUp brings the jail's lo up: a new network namespace has it down.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// relay pipes every connection to ln (the proxy variables' address) to
// the forwarder's socket at sock. It enforces nothing: the forwarder
// reaches only the broker's proxy, which does.
func relay(ln net.Listener, sock string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		go func() {
			defer c.Close()
			up, err := net.Dial("unix", sock)
			if err != nil {
				return
			}
			defer up.Close()
			pipe(c, up)
		}()
	}
}

// pipe copies a to b and b to a until both directions end.
func pipe(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		copyHalf(b, a)
		close(done)
	}()
	copyHalf(a, b)
	<-done
}

// copyHalf copies src to dst and then ends dst's write side.
func copyHalf(dst, src net.Conn) {
	io.Copy(dst, src)
	if hc, ok := dst.(halfCloser); ok {
		hc.CloseWrite()
	} else {
		dst.Close()
	}
}
