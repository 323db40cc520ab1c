package fakeserver

import (
	"io"
	"net"
	"sync"
	"testing"
)

// GuestBoot is the first thing a fake vendor's guest runs, as its root,
// before the vendor's agent and the guest's init: it lays a tmpfs-backed
// overlay over /usr and /etc, so that the guest's root writes to them as
// on a VM's root file system (apt-get install), for the guest's life,
// seen by every later exec and never by the host. Guests run as
// local-provider sandboxes with local.Config.GuestVM, whose root
// directory is writable and whose root may mount.
const GuestBoot = `mkdir -p /run/fakevm && mount -t tmpfs -o mode=0700 fakevm /run/fakevm || exit 1
for d in usr etc; do
	mkdir -p "/run/fakevm/$d/u" "/run/fakevm/$d/w" &&
	mount -t overlay overlay -o "lowerdir=/$d,upperdir=/run/fakevm/$d/u,workdir=/run/fakevm/$d/w" "/$d" || exit 1
done
mkdir -p /var/lib /var/tmp /var/log /run/lock
`

// CanaryReply is what a Canary answers every connection with: a whole
// HTTP response, so that curl, a raw read or a shell's /dev/tcp all see
// it.
const CanaryReply = "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 15\r\n\r\nsandgate-canary"

// A Canary is a TCP listener on the host's loopback that counts the
// connections it gets and answers each with CanaryReply: a guest that
// reaches it had network it should not have had (or, with no jail, has
// the open network a real vendor's guest has).
type Canary struct {
	l    net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	hits int
}

// StartCanary starts a Canary on 127.0.0.1 and stops it when the test ends.
func StartCanary(tb testing.TB) *Canary {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("canary: %v", err)
	}
	c := &Canary{l: l}
	c.wg.Add(1)
	go c.serve()
	tb.Cleanup(c.Close)
	return c
}

func (c *Canary) serve() {
	defer c.wg.Done()
	for {
		conn, err := c.l.Accept()
		if err != nil {
			return
		}
		c.mu.Lock()
		c.hits++
		c.mu.Unlock()
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer conn.Close()
			io.WriteString(conn, CanaryReply)
		}()
	}
}

// Addr is the canary's host:port.
func (c *Canary) Addr() string { return c.l.Addr().String() }

// Port is the canary's port.
func (c *Canary) Port() int { return c.l.Addr().(*net.TCPAddr).Port }

// Hits is the number of connections the canary has accepted.
func (c *Canary) Hits() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits
}

// Close stops the canary; it may be called more than once.
func (c *Canary) Close() {
	c.l.Close()
	c.wg.Wait()
}
