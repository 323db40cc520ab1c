package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/providers/local/internal/forward"
)

// Egress for a workspace with allowed domains (README.md, "Network"): its
// sandboxes keep a network namespace of their own with only loopback and
// no resolver. The broker's egress proxy ([Config.Egress]) serves one Unix
// socket per workspace, egress/egress.sock in the workspace's directory
// on the host, so every connection on it is the workspace's whatever the
// sandbox says. The directory is bound read-only at egressMount in every
// exec and durable command of the workspace (not the file helpers), and
// the forwarder (forward.go) bridges forwardAddr in the sandbox to it;
// the proxy variables name forwardAddr.
//
// The socket belongs to the workspace's uid, mode 0600, in a directory
// only root may change, below the workspace's 0700 directory: only that
// uid (its sandboxes) and root reach it. No other workspace's sandbox has
// it mounted, nor may its uid search the path on the host.
//
// The socket is served by the Provider that made it. A Provider serves
// the socket of every workspace with allowed domains it finds at New (a
// restarted broker; durable commands ran on), and any Provider takes it
// over before it runs an exec or a command of a workspace whose socket it
// does not serve (another broker process on the same data directory made
// it): the sandbox binds the directory, not the socket, so a running
// sandbox reaches the new socket too.

// egressSockName is the socket's name in the workspace's egress/.
const egressSockName = "egress.sock"

// proxyEnv are the variables every exec and durable command of a workspace
// with egress gets: both cases, as tools read either.
var proxyEnv = func() [][2]string {
	url := "http://" + forwardAddr
	var out [][2]string
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"} {
		out = append(out, [2]string{k, url})
	}
	for _, k := range []string{"http_proxy", "https_proxy", "all_proxy"} {
		out = append(out, [2]string{k, url})
	}
	out = append(out, [2]string{"NO_PROXY", "localhost,127.0.0.1,::1"}, [2]string{"no_proxy", "localhost,127.0.0.1,::1"})
	return out
}()

// errNoEgress refuses a workspace with allowed domains on a provider
// without the broker's egress proxy.
var errNoEgress = errors.New("local: create: cannot filter egress by domain without the broker's egress proxy; only an empty allowlist (no network) is supported")

// egressServer is one workspace's socket as this Provider serves it.
type egressServer struct {
	ln     *net.UnixListener
	ino    uint64 // the socket file's inode: another Provider may replace it
	cancel context.CancelFunc
	done   chan struct{} // closed when Serve has returned
}

// egressStopWait bounds how long stopping a server waits for Serve to
// return (every connection it served closed, so that the proxy's count
// of the workspace's bytes is final when Terminate returns).
const egressStopWait = 5 * time.Second

// serveEgress makes sure this Provider serves the egress socket of the
// workspace ref at l, whose record is rec; nothing for a workspace without
// allowed domains.
func (p *Provider) serveEgress(ref string, l layout, rec record) error {
	if len(rec.AllowedDomains) == 0 {
		return nil
	}
	if p.cfg.Egress == nil {
		return errNoEgress
	}
	sock := filepath.Join(l.egress(), egressSockName)
	p.egressMu.Lock()
	defer p.egressMu.Unlock()
	if s := p.egress[ref]; s != nil {
		if inode(sock) == s.ino {
			return nil
		}
		s.stop() // replaced by another Provider's: take it back
		delete(p.egress, ref)
	}
	if err := os.Mkdir(l.egress(), 0o711); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("egress: %w", scrub(err))
	}
	// Only root may change the directory (replace the socket); the
	// workspace's uid may only search it.
	if err := os.Chmod(l.egress(), 0o711); err != nil {
		return fmt.Errorf("egress: %w", scrub(err))
	}
	if err := os.Remove(sock); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("egress: %w", scrub(err))
	}
	ln, err := listenUnixIn(l.egress(), egressSockName)
	if err != nil {
		return fmt.Errorf("egress: listen: %w", scrubNet(err))
	}
	// Closing must not remove a socket another Provider made since.
	ln.SetUnlinkOnClose(false)
	if rec.UID > 0 {
		err = os.Chown(sock, rec.UID, rec.UID)
	}
	if err == nil {
		err = os.Chmod(sock, 0o600)
	}
	if err != nil {
		ln.Close()
		return fmt.Errorf("egress: %w", scrub(err))
	}
	ctx, cancel := context.WithCancel(p.egressCtx)
	s := &egressServer{ln: ln, ino: inode(sock), cancel: cancel, done: make(chan struct{})}
	p.egress[ref] = s
	ws := egress.Workspace{ID: ref, AccountID: rec.Account, AllowedDomains: rec.AllowedDomains}
	go func() {
		defer close(s.done)
		err := p.cfg.Egress.Serve(ctx, ln, ws)
		if err != nil && ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
			p.log.Error("egress listener stopped", sandgate.WorkspaceAttr(ref), sandgate.KeyError, scrubNet(err))
		}
	}()
	return nil
}

// stop ends the server: its listener closes, and Serve returns.
func (s *egressServer) stop() {
	s.cancel()
	s.ln.Close()
}

// wait waits, a bounded time, for Serve to return.
func (s *egressServer) wait() {
	t := time.NewTimer(egressStopWait)
	defer t.Stop()
	select {
	case <-s.done:
	case <-t.C:
	}
}

// stopEgress stops serving the egress socket of ref, if this Provider
// does, and waits for its connections to close.
func (p *Provider) stopEgress(ref string) {
	p.egressMu.Lock()
	s := p.egress[ref]
	delete(p.egress, ref)
	p.egressMu.Unlock()
	if s != nil {
		s.stop()
		s.wait()
	}
}

// reopen takes up the workspaces in the data directory, which survived a
// broker restart: it counts the CPUs each is pinned to (placement.go) and
// serves the egress socket of each with allowed domains.
func (p *Provider) reopen() {
	entries, _ := os.ReadDir(filepath.Join(p.dataDir, workspacesDir))
	for _, e := range entries {
		ref := e.Name()
		if !e.IsDir() || checkRef(ref) != nil {
			continue
		}
		l := p.layout(ref)
		var rec record
		if readJSON(l.sandbox(), &rec) != nil || ended(l) {
			continue
		}
		p.notePlaced(ref, rec)
		if len(rec.AllowedDomains) == 0 || p.cfg.Egress == nil {
			continue
		}
		if err := p.serveEgress(ref, l, rec); err != nil {
			// Its sandboxes have no network until an exec retries.
			p.log.Error("egress listener not reopened", sandgate.WorkspaceAttr(ref), sandgate.KeyError, err)
		}
	}
}

// ensureEgress is serveEgress before an exec or a command of w. A failure
// is logged, not returned: the command then runs with no network, which
// is never more than it was admitted with.
func (p *Provider) ensureEgress(ref string, w opened) {
	if err := p.serveEgress(ref, w.layout, w.rec); err != nil {
		p.log.Error("egress listener not served", sandgate.WorkspaceAttr(ref), sandgate.KeyError, err)
	}
}

// listenUnixIn listens on the Unix socket name in dir. It binds through
// the directory's descriptor (/proc/self/fd/N/name): a socket's path is
// limited to 107 bytes, which a data directory's may pass alone.
func listenUnixIn(dir, name string) (*net.UnixListener, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return net.ListenUnix("unix", &net.UnixAddr{Name: "/proc/self/fd/" + strconv.Itoa(int(d.Fd())) + "/" + name, Net: "unix"})
}

// inode is the inode number of the file at name, 0 when there is none.
func inode(name string) uint64 {
	fi, err := os.Lstat(name)
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Ino)
	}
	return 0
}

// scrubNet drops the socket's path from a listen error.
func scrubNet(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return fmt.Errorf("%s: %w", oe.Op, scrub(oe.Err))
	}
	return scrub(err)
}

// sandboxArgv is the argv bwrap runs for j: j.argv, below the forwarder
// when j has egress.
func sandboxArgv(j job) []string {
	if !j.egress {
		return j.argv
	}
	return append([]string{forwardBin, "--" + forward.Name, egressSock, forwardAddr, "--"}, j.argv...)
}
