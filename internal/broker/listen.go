package broker

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sandgate/sandgate/httpapi"
	"github.com/sandgate/sandgate/protocol"
)

// This file makes every answer the broker's listeners give the protocol's
// JSON envelope (spec §Errors), including the two kinds net/http would
// otherwise write by itself, in plain text, without calling a handler:
//
//   - its refusals of requests it cannot parse (431 for headers over
//     MaxHeaderBytes, 400 for a malformed request line, 501 for an unknown
//     transfer coding, 417 for an unknown Expect), which it writes straight
//     to the connection: a [conn] recognizes them by their fixed shape and
//     writes the envelope instead;
//   - its "Client sent an HTTP request to an HTTPS server" on a TLS port: a
//     [tlsListener] tells TLS from plaintext by the first byte a client
//     sends, so a plaintext request reaches [withConnInfo], which refuses it
//     with the envelope.
//
// Since the connections the server sees are then not *tls.Conn, the TLS
// state of each is passed to requests through the connection's context
// (Server.ConnContext = [connContext]) and set as Request.TLS.

// conn is a connection served by an http.Server of the broker.
type conn struct {
	net.Conn
	tls        *tls.ConnectionState // after the handshake; nil on plaintext
	plainOnTLS bool                 // a plaintext client on a TLS port
}

// Write replaces an error answer of net/http's own by the envelope.
func (c *conn) Write(b []byte) (int, error) {
	if env, ok := envelopeFor(b); ok {
		if _, err := c.Conn.Write(env); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	return c.Conn.Write(b)
}

// CloseWrite lets net/http half-close after an error answer, as it does on
// a bare TCP or TLS connection.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// netHTTPErrorHeaders is what net/http writes right after the status line
// of an answer it gives without a handler (net/http/server.go, conn.serve).
// A handler's answer never has it there: ours always carry Cache-Control
// and a JSON Content-Type, and net/http adds Date.
const netHTTPErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// netHTTPExpectationFailed starts the answer net/http gives, without a
// handler, to an Expect header other than 100-continue; no handler of the
// broker answers 417.
const netHTTPExpectationFailed = "HTTP/1.1 417 Expectation Failed\r\n"

// envelopeFor returns the envelope answer to write instead of b, when b is
// one of net/http's own error answers.
func envelopeFor(b []byte) ([]byte, bool) {
	const proto = "HTTP/1.1 "
	if bytes.HasPrefix(b, []byte(netHTTPExpectationFailed)) {
		return envelopeAnswer(http.StatusExpectationFailed, "unsupported Expect header"), true
	}
	if !bytes.HasPrefix(b, []byte(proto)) {
		return nil, false
	}
	eol := bytes.Index(b, []byte("\r\n"))
	if eol < len(proto)+3 || !bytes.HasPrefix(b[eol:], []byte(netHTTPErrorHeaders)) {
		return nil, false
	}
	status, err := strconv.Atoi(string(b[len(proto) : len(proto)+3]))
	if err != nil || status < 400 || status > 599 {
		return nil, false
	}
	var msg string
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		msg = "request headers are too large"
	case http.StatusNotImplemented:
		msg = "unsupported transfer encoding"
	default:
		msg = "malformed HTTP request"
	}
	return envelopeAnswer(status, msg), true
}

// envelopeAnswer is a whole HTTP/1.1 answer carrying the envelope of an
// invalid_request with status, after which the connection closes. Like
// every answer of the broker it carries no-store and a request id.
func envelopeAnswer(status int, msg string) []byte {
	body := httpapi.EnvelopeBody(protocol.InvalidRequest, msg)
	var out bytes.Buffer
	out.WriteString("HTTP/1.1 " + strconv.Itoa(status) + " " + http.StatusText(status) + "\r\n")
	out.WriteString("Cache-Control: no-store\r\nConnection: close\r\n")
	out.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n")
	out.WriteString("Content-Type: application/json; charset=utf-8\r\n")
	out.WriteString(protocol.HeaderRequestID + ": " + httpapi.NewRequestID() + "\r\n\r\n")
	out.Write(body)
	return out.Bytes()
}

// plainListener wraps every connection of a plaintext port in a [conn].
type plainListener struct{ net.Listener }

func (l plainListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c}, nil
}

// tlsListener serves TLS on a port, and hands on plaintext connections
// marked as such, for [withConnInfo] to refuse with the envelope. The first
// byte of a TLS client is a handshake record (0x16); that of a plaintext
// HTTP client is a method's letter.
// Each connection is sniffed and its handshake done in a goroutine of its
// own, bounded by timeout, so a slow client never holds up Accept.
type tlsListener struct {
	net.Listener
	cfg     *tls.Config
	timeout time.Duration

	start sync.Once
	conns chan net.Conn
	done  chan struct{} // closed when the accept loop has ended; err is set then
	err   error
}

func newTLSListener(ln net.Listener, cfg *tls.Config, timeout time.Duration) *tlsListener {
	return &tlsListener{Listener: ln, cfg: cfg, timeout: timeout, conns: make(chan net.Conn), done: make(chan struct{})}
}

// Accept returns the next connection that is ready to be served: a TLS
// connection whose handshake is done, or a plaintext one.
func (l *tlsListener) Accept() (net.Conn, error) {
	l.start.Do(func() { go l.loop() })
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, l.err
	}
}

// loop accepts until the listener is closed. Other errors (out of file
// descriptors) are retried with a backoff, as http.Server does.
func (l *tlsListener) loop() {
	defer close(l.done)
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				l.err = err
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			time.Sleep(delay)
			continue
		}
		delay = 0
		go l.sniff(c)
	}
}

// sniff reads the first byte of c and hands the connection to Accept: TLS
// after its handshake, plaintext as it is. It exits once it did, or when
// the client is too slow, or when the listener is closed.
func (l *tlsListener) sniff(raw net.Conn) {
	_ = raw.SetDeadline(time.Now().Add(l.timeout))
	br := bufio.NewReader(raw)
	first, err := br.Peek(1)
	if err != nil {
		raw.Close()
		return
	}
	pc := &peekedConn{Conn: raw, r: br}
	var c *conn
	if first[0] == 0x16 {
		tc := tls.Server(pc, l.cfg)
		ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			tc.Close()
			return
		}
		st := tc.ConnectionState()
		c = &conn{Conn: tc, tls: &st}
	} else {
		c = &conn{Conn: pc, plainOnTLS: true}
	}
	_ = raw.SetDeadline(time.Time{}) // the http.Server sets its own from here on
	select {
	case l.conns <- c:
	case <-l.done:
		c.Close()
	}
}

// peekedConn is a connection whose first bytes were read into r.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

type connKey struct{}

// connContext is the http.Server's ConnContext: it lets [withConnInfo] find
// the request's [conn].
func connContext(ctx context.Context, c net.Conn) context.Context {
	if cc, ok := c.(*conn); ok {
		return context.WithValue(ctx, connKey{}, cc)
	}
	return ctx
}

// withConnInfo sets Request.TLS from the TLS connection the request came
// on, and refuses a plaintext request on a TLS port with the envelope
// (spec §Conventions: the broker refuses plaintext), whatever its headers:
// a trusted proxy's X-Forwarded-Proto is only believed on a plaintext port.
func withConnInfo(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cc, _ := r.Context().Value(connKey{}).(*conn)
		switch {
		case cc == nil:
		case cc.plainOnTLS:
			h := w.Header()
			h.Set("Cache-Control", "no-store")
			h.Set("Connection", "close")
			h.Set("Content-Type", "application/json; charset=utf-8")
			h.Set(protocol.HeaderRequestID, httpapi.NewRequestID())
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write(httpapi.EnvelopeBody(protocol.InvalidRequest, "plaintext HTTP is refused; use https"))
			return
		case cc.tls != nil && r.TLS == nil:
			r = r.WithContext(r.Context())
			r.TLS = cc.tls
		}
		next.ServeHTTP(w, r)
	})
}
