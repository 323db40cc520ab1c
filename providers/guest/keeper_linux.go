package guest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// keeperTick bounds how long the keeper sleeps between looks at the wall
// clock: a suspended VM does not advance a monotonic timer.
const keeperTick = 30 * time.Second

// Keep runs the keeper: it serves c.Forward (if any) until c.Until, or
// until SIGTERM or SIGINT (the vendor's stop) or ctx ends, then kills
// every jail and returns 0. It runs outside every jail, so no tenant
// process can see, signal or outlive it.
func Keep(ctx context.Context, c KeeperConfig) int {
	// Nothing of the vendor's or the client's environment (SSL_CERT_FILE,
	// say) steers the keeper: it is built from nothing.
	os.Clearenv()
	os.Setenv("PATH", outsidePath)
	if c.AgentDir == "" {
		c.AgentDir = DefaultAgentDir
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if c.Forward != nil {
		fw, err := newForwarder(*c.Forward)
		if err != nil {
			fmt.Fprintln(os.Stderr, "sandgate-guest keeper:", err)
			return 1
		}
		ln, err := listenUnix(c.Forward.Sock)
		if err != nil {
			fmt.Fprintln(os.Stderr, "sandgate-guest keeper: cannot listen for the jails:", cause(err))
			return 1
		}
		defer ln.Close()
		go fw.serve(ln)
	}
	if err := writeKeeperFile(c.AgentDir, c.Until); err != nil {
		fmt.Fprintln(os.Stderr, "sandgate-guest keeper: cannot record itself:", cause(err))
		return 1
	}
	defer os.Remove(filepath.Join(c.AgentDir, keeperFile))
	if c.ReadyFD > 0 {
		os.NewFile(uintptr(c.ReadyFD), "ready").Close()
	}
	for {
		left := time.Until(c.Until)
		if left <= 0 {
			break
		}
		t := time.NewTimer(min(left, keeperTick))
		select {
		case <-ctx.Done():
			t.Stop()
			killJails()
			return 0
		case <-t.C:
		}
	}
	killJails()
	return 0
}

// cause is err's innermost error (an errno, not the path or address the
// wrappers add), for messages that must not carry paths.
func cause(err error) error {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return err
		}
		err = u
	}
}

// listenUnix listens on the Unix socket name, mode 0600 (root only),
// replacing a stale one.
func listenUnix(name string) (net.Listener, error) {
	if err := os.Remove(name); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	ln, err := net.Listen("unix", name)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(name, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// killJails sends SIGKILL to every process in another pid namespace than
// the keeper's (every jail's pid 1, and with it all it holds), until none
// is left. A jail's pid 1 takes SIGKILL from outside its namespace.
func killJails() {
	own, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return
	}
	for {
		n := 0
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return
		}
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			ns, err := os.Readlink("/proc/" + e.Name() + "/ns/pid")
			if err != nil || ns == own {
				continue
			}
			syscall.Kill(pid, syscall.SIGKILL)
			n++
		}
		if n == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Detach starts the agent again with args in a new session, stdio on
// /dev/null, and returns 0 once it has started: when ready, once it
// closes the descriptor --ready-fd names (it serves).
func Detach(args []string, ready bool) int {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandgate-guest:", cause(err))
		return 1
	}
	defer null.Close()
	cmd := exec.Command(selfExe())
	cmd.Args = append([]string{"sandgate-guest"}, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = null, null, null
	cmd.Env = []string{"PATH=" + outsidePath}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	var r *os.File
	if ready {
		var w *os.File
		if r, w, err = os.Pipe(); err != nil {
			fmt.Fprintln(os.Stderr, "sandgate-guest:", err)
			return 1
		}
		defer r.Close()
		cmd.ExtraFiles = []*os.File{w}
		cmd.Args = append(cmd.Args[:2:2], append([]string{"--ready-fd", "3"}, args[1:]...)...)
		defer w.Close()
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "sandgate-guest: cannot start:", cause(err))
		return 1
	}
	if r != nil {
		cmd.ExtraFiles[0].Close()
		// EOF once the child closes its end: it serves, or it died.
		var b [1]byte
		r.Read(b[:])
		var ws syscall.WaitStatus
		if pid, _ := syscall.Wait4(cmd.Process.Pid, &ws, syscall.WNOHANG, nil); pid == cmd.Process.Pid {
			fmt.Fprintln(os.Stderr, "sandgate-guest: the detached keeper ended at once")
			return 1
		}
	}
	cmd.Process.Release()
	return 0
}

// keeperFile, in the agent's directory, names the running keeper: "PID
// STARTTIME UNTIL", its pid, its start time in clock ticks after boot
// (/proc/PID/stat, so that a reused pid does not pass for it) and the
// guest's deadline in Unix seconds.
const keeperFile = "keeper"

// keeperStartWait bounds how long run waits for a starting keeper to
// record itself.
const keeperStartWait = 10 * time.Second

// errNoKeeper is why run refuses a jail: nothing would end it at the
// guest's deadline.
var errNoKeeper = errors.New("the guest's lifetime keeper is not running: no jail starts without it")

// errExpired is why run refuses a jail after the guest's deadline.
var errExpired = errors.New("the workspace's lifetime has ended")

// statFields are the fields of /proc/PID/stat after the command's name:
// [0] is the state, [19] the start time.
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return nil, errors.New("malformed stat")
	}
	return f, nil
}

// writeKeeperFile records the calling keeper in agentDir, whole or not at
// all.
func writeKeeperFile(agentDir string, until time.Time) error {
	st, err := statFields(os.Getpid())
	if err != nil {
		return err
	}
	name := filepath.Join(agentDir, keeperFile)
	line := fmt.Sprintf("%d %s %d\n", os.Getpid(), st[19], until.Unix())
	if err := os.WriteFile(name+".tmp", []byte(line), 0o600); err != nil {
		return err
	}
	return os.Rename(name+".tmp", name)
}

// KeeperStatus is `sandgate-guest keeper-status`: 0 when the keeper
// agentDir names (DefaultAgentDir when empty) is alive and the guest's
// deadline has not passed, ExitKeeperGone when either fails, which the
// provider reads as the workspace's end.
func KeeperStatus(agentDir string) int {
	if agentDir == "" {
		agentDir = DefaultAgentDir
	}
	if _, err := liveKeeper(agentDir); err != nil {
		fmt.Fprintf(os.Stderr, "sandgate-guest: %v\n", err)
		return ExitKeeperGone
	}
	return 0
}

// liveKeeper returns the guest's deadline once it has checked that the
// keeper agentDir names is alive and the deadline has not passed.
func liveKeeper(agentDir string) (time.Time, error) {
	// A keeper that is starting (a Machine's main process, just booted)
	// records itself within moments: wait a little for the file, never
	// for a keeper it names to come back.
	name := filepath.Join(agentDir, keeperFile)
	b, err := os.ReadFile(name)
	for wait := time.Now().Add(keeperStartWait); errors.Is(err, os.ErrNotExist) && time.Now().Before(wait); {
		time.Sleep(50 * time.Millisecond)
		b, err = os.ReadFile(name)
	}
	if err != nil {
		return time.Time{}, errNoKeeper
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return time.Time{}, errNoKeeper
	}
	pid, err1 := strconv.Atoi(f[0])
	until, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 {
		return time.Time{}, errNoKeeper
	}
	if st, err := statFields(pid); err != nil || st[19] != f[1] || st[0] == "Z" || st[0] == "X" {
		return time.Time{}, errNoKeeper
	}
	t := time.Unix(until, 0)
	if !time.Now().Before(t) {
		return time.Time{}, errExpired
	}
	return t, nil
}
