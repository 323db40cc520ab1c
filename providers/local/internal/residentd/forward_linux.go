package residentd

import (
	"sync"
	"syscall"
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
	ln, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	if err := syscall.SetsockoptInt(ln, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		syscall.Close(ln)
		return err
	}
	if err := syscall.Bind(ln, &syscall.SockaddrInet4{Port: forwardPort, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(ln)
		return err
	}
	if err := syscall.Listen(ln, syscall.SOMAXCONN); err != nil {
		syscall.Close(ln)
		return err
	}
	go func() {
		for {
			c, _, err := syscall.Accept4(ln, syscall.SOCK_CLOEXEC)
			if err == syscall.EINTR || err == syscall.ECONNABORTED {
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
	defer syscall.Close(c)
	u, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer syscall.Close(u)
	for {
		err = syscall.Connect(u, &syscall.SockaddrUnix{Name: sock})
		if err != syscall.EINTR {
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
		n, err := syscall.Read(src, buf)
		if err == syscall.EINTR {
			continue
		}
		if n == 0 && err == nil {
			syscall.Shutdown(dst, syscall.SHUT_WR)
			return
		}
		if err != nil || !writeAll(dst, buf[:n]) {
			syscall.Shutdown(src, syscall.SHUT_RDWR)
			syscall.Shutdown(dst, syscall.SHUT_RDWR)
			return
		}
	}
}

func writeAll(fd int, b []byte) bool {
	for len(b) > 0 {
		n, err := syscall.Write(fd, b)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return false
		}
		b = b[n:]
	}
	return true
}
