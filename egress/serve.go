package egress

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate"
)

// Serve answers proxy requests on l, every one attributed to ws (the local
// provider: a listener per workspace, so nothing the sandbox says decides
// whose request it is). It returns an error at once when ws is not valid
// ([Workspace.Validate]). At most MaxConnsPerWorkspace connections to l are
// served at once; more are closed as they arrive. Serve returns nil when
// l is closed or ctx is done, once every connection it served is closed:
// the workspace's [Proxy.Usage] is then final.
func (p *Proxy) Serve(ctx context.Context, l net.Listener, ws Workspace) error {
	if err := ws.Validate(); err != nil {
		return err
	}
	st := p.workspace(ws)
	var open atomic.Int64
	ll := &limitListener{Listener: l, open: &open, max: int64(p.cfg.MaxConnsPerWorkspace), refused: func() {
		p.refused(ctx, ws.ID, "", 0, ReasonLimit)
	}}
	return p.serve(ctx, ll, false, func(*http.Request) (Workspace, *wsState, *denial) { return ws, st, nil })
}

// Register lets ws use the shared listener of [Proxy.ServeShared] and
// returns its credential: the password of a Proxy-Authorization Basic
// header whose user is the workspace id. The credential names that
// workspace and no other: with Config.CredentialKey it is derived from
// the id (every proxy with the key accepts it while Config.Lookup finds
// the workspace live), else random. Registering an id twice is an error.
func (p *Proxy) Register(ws Workspace) (credential string, err error) {
	if strings.ContainsAny(ws.ID, ":\r\n") {
		return "", errors.New("egress: register: a workspace id must not hold ':'")
	}
	if err := ws.Validate(); err != nil {
		return "", err
	}
	if p.cfg.CredentialKey != nil {
		credential = p.derive(ws.ID)
	} else {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return "", fmt.Errorf("egress: register: %w", err)
		}
		credential = base64.RawURLEncoding.EncodeToString(b)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, dup := p.creds[ws.ID]; dup {
		return "", fmt.Errorf("egress: register: workspace %s is already registered", ws.ID)
	}
	p.creds[ws.ID] = registration{ws: ws, cred: []byte(credential)}
	delete(p.lookup, ws.ID)
	if p.state[ws.ID] == nil {
		p.state[ws.ID] = &wsState{}
	}
	if ws.AccountID != "" {
		p.state[ws.ID].account = ws.AccountID
	}
	return credential, nil
}

// Unregister revokes the credential of workspace id: its next request is
// refused, here at once, elsewhere once Config.Lookup no longer finds it
// live. Tunnels already open run on until they end or idle out (the
// workspace's sandbox is normally gone by then). Its counters stay until
// [Proxy.Forget].
func (p *Proxy) Unregister(id string) {
	p.mu.Lock()
	delete(p.creds, id)
	if p.cfg.CredentialKey != nil {
		p.remember(id, looked{at: time.Now()}) // not live, whatever Lookup still says
	}
	p.mu.Unlock()
}

// ServeShared answers proxy requests on l, each attributed to the
// workspace its Proxy-Authorization names (credential mode, for remote
// vendors that reach the proxy over a private network); a request without
// a valid credential gets 407. At most MaxSharedConns connections that no
// request has yet attributed to a workspace are open at once. Once its
// request's credential is checked a connection is its workspace's, and
// its request or tunnel counts against that workspace's
// MaxConnsPerWorkspace alone: every connection serves one request (no
// keep-alive), so one tenant's connections, idle or not, never hold the
// slots every other workspace shares. It returns nil when l is closed or
// ctx is done, once every connection it served is closed.
func (p *Proxy) ServeShared(ctx context.Context, l net.Listener) error {
	var open atomic.Int64
	ll := &limitListener{Listener: l, open: &open, max: int64(p.cfg.MaxSharedConns), refused: func() {
		p.refused(ctx, "", "", 0, ReasonLimit)
	}}
	return p.serve(ctx, ll, true, p.authenticate)
}

// authenticate finds the workspace r's Proxy-Authorization names. The
// credential is compared in constant time, and only with the one the
// named workspace was registered with or, for a workspace registered
// elsewhere, the one derived from its id.
func (p *Proxy) authenticate(r *http.Request) (Workspace, *wsState, *denial) {
	user, pass, ok := parseBasic(r.Header.Get("Proxy-Authorization"))
	if !ok {
		return Workspace{}, nil, deny(ReasonAuth, http.StatusProxyAuthRequired)
	}
	p.mu.Lock()
	reg, found := p.creds[user]
	st := p.state[user]
	p.mu.Unlock()
	if !found && p.cfg.CredentialKey != nil {
		return p.authenticateDerived(r.Context(), user, pass)
	}
	want := reg.cred
	if !found {
		want = make([]byte, len(pass)) // compare anyway: the same work for a known and an unknown id
	}
	if subtle.ConstantTimeCompare([]byte(pass), want) != 1 || !found || st == nil {
		return Workspace{}, nil, deny(ReasonAuth, http.StatusProxyAuthRequired)
	}
	return reg.ws, st, nil
}

// parseBasic parses a Basic Proxy-Authorization value.
func parseBasic(h string) (user, pass string, ok bool) {
	scheme, enc, found := strings.Cut(h, " ")
	if !found || !strings.EqualFold(scheme, "Basic") {
		return "", "", false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return "", "", false
	}
	user, pass, ok = strings.Cut(string(b), ":")
	return user, pass, ok && user != "" && pass != ""
}

// identifyFunc names the workspace of a request, or refuses it.
type identifyFunc func(r *http.Request) (Workspace, *wsState, *denial)

// session is one Serve or ServeShared: the handlers and tunnels it must
// close and wait for before it returns.
type session struct {
	p        *Proxy
	identify identifyFunc
	shared   bool // ServeShared: a connection its workspace counts leaves the listener's count
	wg       sync.WaitGroup
	mu       sync.Mutex
	closed   bool
	conns    map[io.Closer]struct{} // hijacked connections, both ends of each tunnel
}

func (p *Proxy) serve(ctx context.Context, l net.Listener, shared bool, identify identifyFunc) error {
	s := &session{p: p, identify: identify, shared: shared, conns: map[io.Closer]struct{}{}}
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: p.cfg.HeaderTimeout,
		IdleTimeout:       p.cfg.IdleTimeout,
		MaxHeaderBytes:    p.cfg.MaxHeaderBytes,
		// net/http's own messages may quote a request line: none is logged.
		ErrorLog:    log.New(io.Discard, "", 0),
		BaseContext: func(net.Listener) context.Context { return ctx },
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
	}
	// An idle kept-alive connection would be no request's: uncounted by
	// its workspace, it would have to stay in the shared count.
	srv.SetKeepAlivesEnabled(!shared)
	done := make(chan struct{})
	go func() { // exits when ctx is done or Serve returned
		select {
		case <-ctx.Done():
			_ = srv.Close()
		case <-done:
		}
	}()
	err := srv.Serve(l)
	close(done)
	_ = srv.Close()
	s.shutdown()
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// enter starts a handler; false once the session is shutting down.
func (s *session) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// track registers the ends of a tunnel, to be closed at shutdown; false
// (and c closed) once the session is shutting down.
func (s *session) track(cs ...io.Closer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		s.conns[c] = struct{}{}
	}
	return true
}

func (s *session) untrack(cs ...io.Closer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		delete(s.conns, c)
		_ = c.Close()
	}
}

// shutdown closes every tunnel and waits for every handler.
func (s *session) shutdown() {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *session) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.enter() {
		return
	}
	defer s.wg.Done()
	ws, st, d := s.identify(r)
	if d != nil {
		if d.status == http.StatusProxyAuthRequired {
			w.Header().Set("Proxy-Authenticate", `Basic realm="sandgate-egress"`)
		}
		s.p.refuse(w, r, ws.ID, "", 0, d)
		return
	}
	if r.Method == http.MethodConnect {
		s.tunnel(w, r, ws, st)
		return
	}
	s.forward(w, r, ws, st)
}

// refuse counts and logs a refusal and answers it.
func (p *Proxy) refuse(w http.ResponseWriter, r *http.Request, wsID, host string, port uint16, d *denial) {
	p.refused(r.Context(), wsID, host, port, d.reason)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Connection", "close")
	w.WriteHeader(d.status)
	_, _ = io.WriteString(w, "sandgate egress: refused ("+d.reason+")\n")
}

// refused counts a refusal and logs it: the workspace, the destination's
// host (when it names one: namesHost) and port, and the reason; never a
// path, header or body.
func (p *Proxy) refused(ctx context.Context, wsID, host string, port uint16, reason string) {
	p.denied.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(attribute.String(AttrReason, reason)))
	attrs := []slog.Attr{slog.String(sandgate.KeyReason, reason)}
	if wsID != "" {
		attrs = append(attrs, sandgate.WorkspaceAttr(wsID))
	}
	if host != "" {
		if namesHost(host) {
			attrs = append(attrs, slog.String(sandgate.KeyHost, host))
		}
		attrs = append(attrs, slog.Int(sandgate.KeyPort, int(port)))
	}
	p.log.LogAttrs(ctx, slog.LevelInfo, "egress denied", attrs...)
}

// limitListener closes the connections past max open at once.
type limitListener struct {
	net.Listener
	open    *atomic.Int64
	max     int64
	refused func()
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			l.refused() // before the close, so the count is there once the client sees it
			_ = c.Close()
			continue
		}
		return &limitConn{Conn: c, release: sync.OnceFunc(func() { l.open.Add(-1) })}, nil
	}
}

// connKey is the context key of a request's connection.
type connKey struct{}

// counted hands r's connection over from the shared listener's count to
// its workspace's, which st's count (Proxy.acquire) took for the request.
// It reports whether the connection now holds that count: then the
// connection's close gives it back, not the request's end, so a
// connection net/http still writes to after its handler returned (an
// answer's tail to a client that stopped reading) stays counted.
func (s *session) counted(r *http.Request, st *wsState) bool {
	lc, ok := r.Context().Value(connKey{}).(*limitConn)
	if !ok || !s.shared {
		return false
	}
	lc.handOver(func() { s.p.release(st) })
	return true
}

// limitConn gives its slot back when closed, or earlier by handOver.
type limitConn struct {
	net.Conn
	release func() // the listener's slot, once

	mu   sync.Mutex
	then func() // run once at Close: the count handOver took over
}

// handOver gives the listener's slot back now and runs then at Close.
func (c *limitConn) handOver(then func()) {
	c.release()
	c.mu.Lock()
	c.then = sync.OnceFunc(then)
	c.mu.Unlock()
}

func (c *limitConn) Close() error {
	c.release()
	c.mu.Lock()
	then := c.then
	c.mu.Unlock()
	if then != nil {
		then()
	}
	return c.Conn.Close()
}

// CloseWrite half-closes the connection when the one below can.
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
