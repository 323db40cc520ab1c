package fakeserver

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
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

// GuestRoot returns /proc/PID/root of a process of the guest whose mount
// namespace is ns ("mnt:[N]", as readlink /proc/self/ns/mnt shows it in
// the guest), the guest's pid 1 preferred: the host reaches the guest's
// whole file system through it, as a vendor's in-VM agent does. pid is
// the process's host pid, for [GuestRootValid].
func GuestRoot(ns string) (root string, pid int, err error) {
	des, err := os.ReadDir("/proc")
	if err != nil {
		return "", 0, err
	}
	for _, de := range des {
		n, err := strconv.Atoi(de.Name())
		if err != nil || !GuestRootValid(n, ns) {
			continue
		}
		if pid == 0 || isNSInit(n) {
			pid = n
		}
		if isNSInit(n) {
			break
		}
	}
	if pid == 0 {
		return "", 0, fmt.Errorf("fakeserver: no process in the guest's mount namespace %s", ns)
	}
	return "/proc/" + strconv.Itoa(pid) + "/root", pid, nil
}

// GuestRootValid reports whether pid is still in mount namespace ns.
func GuestRootValid(pid int, ns string) bool {
	l, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/mnt")
	return err == nil && l == ns
}

// isNSInit reports whether pid is the init of its own pid namespace.
func isNSInit(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for l := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(l, "NSpid:"); ok {
			f := strings.Fields(rest)
			return len(f) > 1 && f[len(f)-1] == "1"
		}
	}
	return false
}
