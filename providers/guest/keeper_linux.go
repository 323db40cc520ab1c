package guest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
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
