package egress

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"time"
)

// forward answers a plain-HTTP proxy request (absolute form, http only):
// check the destination and send the request to the checked address over a
// connection of its own, which no other request (nor workspace) reuses.
// The Host header sent is the checked host: net/http sets a server
// request's Host from an absolute URL, whatever header the sandbox sent.
func (s *session) forward(w http.ResponseWriter, r *http.Request, ws Workspace, st *wsState) {
	p := s.p
	if !r.URL.IsAbs() || r.URL.Scheme != "http" || r.URL.Host == "" {
		// An origin-form request is for the proxy itself, which serves
		// nothing; https:// is reached with CONNECT.
		p.refuse(w, r, ws.ID, "", 0, deny(ReasonBadRequest, http.StatusBadRequest))
		return
	}
	if r.Header.Get("Upgrade") != "" {
		// A protocol switch (WebSocket) goes through CONNECT, where the
		// tunnel is bounded and closed with the listener.
		p.refuse(w, r, ws.ID, "", 0, deny(ReasonBadRequest, http.StatusBadRequest))
		return
	}
	host, port, d := parseHostPort(r.URL.Host, 80)
	if d != nil {
		p.refuse(w, r, ws.ID, "", 0, d)
		return
	}
	// Counted before the lookup, which a tenant's own DNS can make slow.
	if !p.acquire(st) {
		p.refuse(w, r, ws.ID, host, port, deny(ReasonLimit, http.StatusTooManyRequests))
		return
	}
	if !s.counted(r, st) {
		defer p.release(st)
	}
	t, d := p.check(r.Context(), ws, host, port)
	if d != nil {
		p.refuse(w, r, ws.ID, host, port, d)
		return
	}
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, d := p.dial(ctx, t)
			if d != nil {
				return nil, d
			}
			return &countConn{Conn: c, p: p, st: st}, nil
		},
		DisableKeepAlives:      true,
		MaxResponseHeaderBytes: int64(p.cfg.MaxHeaderBytes),
		ResponseHeaderTimeout:  p.cfg.IdleTimeout,
	}
	defer tr.CloseIdleConnections()
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.Host = "" // the URL's host, the one checked
		},
		Transport: tr,
		ErrorLog:  log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var d *denial
			if !errors.As(err, &d) {
				d = deny(ReasonUnreached, http.StatusBadGateway)
			}
			p.refuse(w, r, ws.ID, host, port, d)
		},
	}
	rp.ServeHTTP(w, r)
}

// countConn counts the bytes of a forwarded request's connection and
// closes it when it idles out.
type countConn struct {
	net.Conn
	p  *Proxy
	st *wsState
}

func (c *countConn) Read(b []byte) (int, error) {
	_ = c.Conn.SetReadDeadline(time.Now().Add(c.p.cfg.IdleTimeout))
	n, err := c.Conn.Read(b)
	c.p.countIn(c.st, n)
	return n, err
}

func (c *countConn) Write(b []byte) (int, error) {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(c.p.cfg.IdleTimeout))
	n, err := c.Conn.Write(b)
	c.p.countOut(c.st, n)
	return n, err
}
