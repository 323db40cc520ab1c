package residentd

import (
	"sync"

	"golang.org/x/sys/unix"
)

// The egress forwarder of a workspace with allowed domains: the resident
// listens on 127.0.0.1:3128 of the sandbox's own loopback (the local
// provider's forwardAddr, which HTTP_PROXY and the others name) and pipes
// every connection to the workspace's proxy socket, as the local
// provider's forwarder does for an exec of its own. It enforces nothing:
// the proxy behind the socket does. Plain system calls rather than
// package net, whose initialisation would hold up every resident's start.

// forwardPort is forwardAddr's port.
const forwardPort = 3128

// forward listens on 127.0.0.1:3128 and serves it in the background.
func forward(sock string) error {
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	if err := unix.SetsockoptInt(ln, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		unix.Close(ln)
		return err
	}
	if err := unix.Bind(ln, &unix.SockaddrInet4{Port: forwardPort, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		unix.Close(ln)
		return err
	}
	if err := unix.Listen(ln, unix.SOMAXCONN); err != nil {
		unix.Close(ln)
		return err
	}
	go func() {
		for {
			c, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
			if err == unix.EINTR || err == unix.ECONNABORTED {
				continue
			}
			if err != nil {
				return
			}
			go pipeTo(c, sock)
		}
	}()
	return nil
}

// pipeTo copies between the connection c and a new connection to the
// Unix socket sock until both directions are done, passing each end of
// stream on as a half-close, and closes both.
func pipeTo(c int, sock string) {
	defer unix.Close(c)
	u, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(u)
	for {
		err = unix.Connect(u, &unix.SockaddrUnix{Name: sock})
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return // the client sees the connection close: no proxy
	}
	var wg sync.WaitGroup
	wg.Go(func() { copyHalf(u, c) })
	copyHalf(c, u)
	wg.Wait()
}

// copyHalf copies src to dst until src's end of stream, which it passes on
// as dst's half-close. A reset or broken connection shuts both of the
// connection's sockets down, which ends the other direction's blocked
// read too.
func copyHalf(dst, src int) {
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Read(src, buf)
		if err == unix.EINTR {
			continue
		}
		if n == 0 && err == nil {
			unix.Shutdown(dst, unix.SHUT_WR)
			return
		}
		if err != nil || !writeAll(dst, buf[:n]) {
			unix.Shutdown(src, unix.SHUT_RDWR)
			unix.Shutdown(dst, unix.SHUT_RDWR)
			return
		}
	}
}

func writeAll(fd int, b []byte) bool {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false
		}
		b = b[n:]
	}
	return true
}
