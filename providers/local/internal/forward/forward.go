// Package forward is the local provider's egress forwarder: inside a
// sandbox whose workspace has domains to reach, the command runs below the
// broker's own binary, bound read-only into the sandbox and recognised in
// this package's init by its first argument:
//
//	/run/sandgate/forward --sandgate-egress-forward SOCKET ADDR -- ARGV…
//
// It listens on ADDR (the sandbox's own loopback), starts ARGV with the
// sandbox's stdio and environment, pipes every connection to ADDR to the
// Unix socket SOCKET (the workspace's proxy listener on the host, bound
// into the sandbox), and exits with ARGV's status once ARGV exits: 128+n
// for a signal n, as bwrap reports it; 1 when ARGV cannot be started, as
// bwrap's own execvp failure. It enforces nothing: the proxy behind SOCKET
// does, and the sandbox could reach SOCKET without it.
//
// The package needs the standard library's net and little else, so the
// forwarder starts before the binary's HTTP, TLS and telemetry packages
// are initialised, as package step does for the step.
package forward

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"

	"github.com/sandgate/sandgate/providers/local/internal/step"
)

// Name is the forwarder's first argument, with "--" before it.
const Name = "sandgate-egress-forward"

func init() {
	if len(os.Args) > 1 && os.Args[1] == "--"+Name {
		os.Exit(run(os.Args[2:]))
	}
}

// run is the forwarder's main; it returns the exit code.
func run(args []string) int {
	if len(args) < 4 || args[2] != "--" {
		fmt.Fprintln(os.Stderr, "sandgate: egress forwarder: bad arguments")
		return step.ExitUsage
	}
	sock, addr, argv := args[0], args[1], args[3:]
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandgate: egress forwarder:", err)
		return step.ExitStart
	}
	go forwardAll(ln, sock)

	// Signals that reach the forwarder are the command's.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "sandgate:", err)
		return 1
	}
	go func() {
		for s := range sigs {
			cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		fmt.Fprintln(os.Stderr, "sandgate:", err)
		return 1
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return cmd.ProcessState.ExitCode()
}

// forwardAll pipes every connection accepted on ln to the Unix socket sock.
func forwardAll(ln net.Listener, sock string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			u, err := net.Dial("unix", sock)
			if err != nil {
				return // the client sees the connection close: no proxy
			}
			defer u.Close()
			pipe(c, u)
		}()
	}
}

// pipe copies a to b and b to a until both directions are done, passing
// each end of stream on as a half-close.
func pipe(a, b net.Conn) {
	var wg sync.WaitGroup
	one := func(dst, src net.Conn) {
		defer wg.Done()
		_, err := io.Copy(dst, src)
		if err != nil {
			// Reset or broken: the other direction ends too.
			a.Close()
			b.Close()
		} else if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	wg.Add(2)
	go one(a, b)
	go one(b, a)
	wg.Wait()
}
