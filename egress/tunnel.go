package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// maxHello bounds what is read to find a ClientHello's SNI.
const maxHello = 64 << 10

var (
	dirOut = metric.WithAttributeSet(attribute.NewSet(attribute.String(AttrDirection, "out")))
	dirIn  = metric.WithAttributeSet(attribute.NewSet(attribute.String(AttrDirection, "in")))
)

// countIn counts n bytes that came from a destination to st's workspace,
// in its tally and in the proxy's metric.
func (p *Proxy) countIn(st *wsState, n int) {
	if n > 0 {
		st.in.Add(int64(n))
		p.bytes.Add(context.Background(), int64(n), dirIn)
	}
}

// countOut counts n bytes that st's workspace sent to a destination.
func (p *Proxy) countOut(st *wsState, n int) {
	if n > 0 {
		st.out.Add(int64(n))
		p.bytes.Add(context.Background(), int64(n), dirOut)
	}
}

// acquire takes one of st's destination connections; false when all
// MaxConnsPerWorkspace are in use.
func (p *Proxy) acquire(st *wsState) bool {
	if st.conns.Add(1) > int64(p.cfg.MaxConnsPerWorkspace) {
		st.conns.Add(-1)
		return false
	}
	return true
}

func (p *Proxy) release(st *wsState) { st.conns.Add(-1) }

// tunnel answers a CONNECT: check the destination, dial the checked
// address, answer 200, check the first flight (a ClientHello must name the
// CONNECT host; on a TLS port there must be one), then copy both ways
// until both ends are done or the tunnel idles out.
func (s *session) tunnel(w http.ResponseWriter, r *http.Request, ws Workspace, st *wsState) {
	p := s.p
	ctx := r.Context()
	host, port, d := parseHostPort(r.Host, 0)
	if d == nil {
		// Counted before the lookup, which a tenant's own DNS can make
		// slow.
		if !p.acquire(st) {
			d = deny(ReasonLimit, http.StatusTooManyRequests)
		} else {
			if !s.counted(r, st) {
				defer p.release(st)
			}
			var t target
			if t, d = p.check(ctx, ws, host, port); d == nil {
				var up net.Conn
				if up, d = p.dial(ctx, t); d == nil {
					s.splice(w, r, ws, st, host, port, up)
					return
				}
			}
		}
	}
	p.refuse(w, r, ws.ID, host, port, d)
}

// splice hijacks the sandbox's connection and joins it to up.
func (s *session) splice(w http.ResponseWriter, r *http.Request, ws Workspace, st *wsState, host string, port uint16, up net.Conn) {
	p := s.p
	hj, ok := w.(http.Hijacker)
	if !ok {
		_ = up.Close()
		p.refuse(w, r, ws.ID, host, port, deny(ReasonBadRequest, http.StatusBadRequest))
		return
	}
	conn, rw, err := hj.Hijack()
	if err != nil {
		_ = up.Close()
		return
	}
	if !s.track(conn, up) {
		return
	}
	defer s.untrack(conn, up)
	_ = conn.SetDeadline(time.Time{})
	_ = conn.SetWriteDeadline(time.Now().Add(p.cfg.IdleTimeout))
	if _, err := rw.WriteString("HTTP/1.1 200 Connection established\r\n\r\n"); err != nil || rw.Flush() != nil {
		return
	}
	// Everything the sandbox sends is read through br, whose first bytes
	// are the ClientHello being checked.
	br := bufio.NewReaderSize(rw.Reader, 4096)
	var last atomic.Int64 // unix nanoseconds of the last byte either way
	last.Store(time.Now().UnixNano())
	var wg sync.WaitGroup
	startIn := func() {
		wg.Add(1)
		go func() { // exits when up ends, idles out or is closed
			defer wg.Done()
			p.pipe(conn, up, &last, func(n int) { p.countIn(st, n) })
		}()
	}
	tlsPort := p.tls[port]
	if !tlsPort {
		// A server may speak first (SSH, SMTP): it need not wait for the
		// sandbox's first flight.
		startIn()
	}
	hello, reason, ok := p.checkHello(conn, br, host, tlsPort, &last)
	if !ok {
		if reason != "" {
			p.refused(r.Context(), ws.ID, host, port, reason)
		}
		_ = up.Close()
		_ = conn.Close()
		wg.Wait()
		return
	}
	countOut := func(n int) { p.countOut(st, n) }
	if len(hello) > 0 {
		_ = up.SetWriteDeadline(time.Now().Add(p.cfg.IdleTimeout))
		n, err := up.Write(hello)
		countOut(n)
		if err != nil {
			_ = conn.Close()
			_ = up.Close()
			wg.Wait()
			return
		}
	}
	if tlsPort {
		startIn()
	}
	p.pipe(up, readerConn{Conn: conn, r: br}, &last, countOut)
	wg.Wait()
}

// checkHello reads the sandbox's first flight when it is a TLS ClientHello
// (or must be one, on a TLS port) and checks that its SNI names host. It
// returns the bytes read, to be sent on; or ok false, with the reason of
// the refusal, or with "" when the sandbox closed the tunnel or it idled
// out before its first byte. On a TLS port the ClientHello must come
// within HeaderTimeout; on another port the server may speak first, and
// the wait lasts as long as the tunnel is not idle (last).
func (p *Proxy) checkHello(conn net.Conn, br *bufio.Reader, host string, tlsPort bool, last *atomic.Int64) (hello []byte, reason string, ok bool) {
	defer func() { _ = conn.SetReadDeadline(time.Time{}) }()
	var first []byte
	for {
		timeout := p.cfg.IdleTimeout
		if tlsPort {
			timeout = p.cfg.HeaderTimeout
		}
		_ = conn.SetReadDeadline(time.Now().Add(timeout))
		var err error
		if first, err = br.Peek(1); err == nil {
			break
		}
		var ne net.Error
		if !tlsPort && errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, last.Load())) < p.cfg.IdleTimeout {
			continue // the server is talking: keep waiting
		}
		if tlsPort {
			return nil, ReasonNotTLS, false
		}
		return nil, "", false
	}
	if first[0] != 0x16 { // not a TLS handshake record
		if tlsPort {
			return nil, ReasonNotTLS, false
		}
		return nil, "", true
	}
	rec := &recorder{r: br, max: maxHello}
	var sni string
	var saw bool
	errStop := errors.New("hello read")
	srv := tls.Server(helloConn{Conn: conn, r: rec}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni, saw = h.ServerName, true
			return nil, errStop
		},
	})
	_ = conn.SetReadDeadline(time.Now().Add(p.cfg.HeaderTimeout))
	_ = srv.Handshake()
	if !saw {
		return nil, ReasonNotTLS, false
	}
	if sni == "" || !strings.EqualFold(strings.TrimSuffix(sni, "."), host) {
		return nil, ReasonSNI, false
	}
	return rec.buf.Bytes(), "", true
}

// recorder keeps everything read through it, up to max bytes.
type recorder struct {
	r   io.Reader
	buf bytes.Buffer
	max int
}

func (r *recorder) Read(b []byte) (int, error) {
	if r.buf.Len() >= r.max {
		return 0, errors.New("egress: client hello too long")
	}
	if len(b) > r.max-r.buf.Len() {
		b = b[:r.max-r.buf.Len()]
	}
	n, err := r.r.Read(b)
	r.buf.Write(b[:n])
	return n, err
}

// helloConn is what crypto/tls parses a ClientHello from: reads come
// through the recorder, writes (its alert) go nowhere, Close does nothing.
type helloConn struct {
	net.Conn
	r io.Reader
}

func (c helloConn) Read(b []byte) (int, error)  { return c.r.Read(b) }
func (c helloConn) Write(b []byte) (int, error) { return len(b), nil }
func (c helloConn) Close() error                { return nil }

// readerConn reads through r (a buffer in front of Conn).
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c readerConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// pipe copies src to dst until src ends, or neither direction moved a byte
// for IdleTimeout (last is shared by both directions), then half-closes
// dst (or closes both when it cannot).
func (p *Proxy) pipe(dst, src net.Conn, last *atomic.Int64, count func(int)) {
	idle := p.cfg.IdleTimeout
	buf := make([]byte, 32<<10)
	for {
		_ = src.SetReadDeadline(time.Now().Add(idle))
		n, err := src.Read(buf)
		if n > 0 {
			last.Store(time.Now().UnixNano())
			_ = dst.SetWriteDeadline(time.Now().Add(idle))
			m, werr := dst.Write(buf[:n])
			count(m)
			if werr != nil {
				_ = dst.Close()
				_ = src.Close()
				return
			}
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, last.Load())) < idle {
				continue // the other direction is busy
			}
			break
		}
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); !ok || cw.CloseWrite() != nil {
		_ = dst.Close()
		_ = src.Close()
	}
}
