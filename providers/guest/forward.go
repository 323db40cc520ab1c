package guest

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

// forwarder carries the jails' proxy requests to the broker's egress proxy
// in credential mode: a TLS connection to one address, each request with
// the workspace's Proxy-Authorization (replacing any the tenant sent).
// It reaches that proxy and nothing else; the proxy enforces the
// workspace's allowlist.
type forwarder struct {
	// addrs are the proxy's addresses, resolved once at the keeper's
	// start, before any tenant code runs: nothing the guest's resolver or
	// /etc/hosts says later moves them.
	addrs []string
	tls   *tls.Config
	auth  string // the Proxy-Authorization value; never logged
}

// halfCloser is a connection that can end its write side alone.
type halfCloser interface{ CloseWrite() error }

// dialTimeout bounds reaching the broker's proxy.
const dialTimeout = 30 * time.Second

// resolveTimeout bounds resolving the proxy's host at the keeper's start.
const resolveTimeout = 5 * time.Second

// maxHeaderBytes bounds a request header read from a jail.
const maxHeaderBytes = 64 << 10

// headerTimeout bounds the wait for a jail's request header.
const headerTimeout = 30 * time.Second

// maxJailConns bounds the jails' connections to the forwarder open at
// once; more are closed as they arrive. The proxy admits fewer per
// workspace (egress.Config.MaxConnsPerWorkspace).
const maxJailConns = 256

func newForwarder(c ForwardConfig) (*forwarder, error) {
	cred, err := os.ReadFile(c.CredFile)
	if err != nil {
		return nil, errors.New("cannot read the egress credential file")
	}
	secret := strings.TrimSpace(string(cred))
	if secret == "" || strings.ContainsAny(secret, "\r\n") {
		return nil, errors.New("the egress credential file holds no credential")
	}
	host, port, err := net.SplitHostPort(c.Proxy)
	if err != nil {
		return nil, errors.New("--egress-proxy is not host:port")
	}
	// Resolved once, now: a forwarder that could not resolve its proxy
	// answers every jail 502 for the guest's life (the keeper still keeps
	// the lifetime), never resolving later.
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	cancel()
	var addrs []string
	for _, ip := range ips {
		addrs = append(addrs, net.JoinHostPort(ip.IP.String(), port))
	}
	if err != nil || len(addrs) == 0 {
		fmt.Fprintln(os.Stderr, "sandgate-guest keeper: cannot resolve the egress proxy's host: the jails get no egress")
	}
	conf := &tls.Config{ServerName: c.ServerName, MinVersion: tls.VersionTLS12}
	if conf.ServerName == "" {
		conf.ServerName = host
	}
	if c.CAFile == "" {
		// The system's roots, loaded now rather than at the first
		// connection.
		if conf.RootCAs, err = x509.SystemCertPool(); err != nil {
			return nil, errors.New("cannot load the system's TLS roots")
		}
	} else {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, errors.New("cannot read the egress CA file")
		}
		conf.RootCAs = x509.NewCertPool()
		if !conf.RootCAs.AppendCertsFromPEM(pem) {
			return nil, errors.New("the egress CA file holds no certificate")
		}
	}
	return &forwarder{
		addrs: addrs,
		tls:   conf,
		auth:  "Basic " + base64.StdEncoding.EncodeToString([]byte(c.User+":"+secret)),
	}, nil
}

// serve forwards every connection to ln until ln is closed.
func (f *forwarder) serve(ln net.Listener) {
	slots := make(chan struct{}, maxJailConns)
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			c.Close()
			continue
		}
		go func() {
			defer func() { <-slots }()
			f.handle(c)
		}()
	}
}

// handle forwards one jail connection: request by request (absolute-form
// HTTP, kept alive as long as the proxy keeps its side) until a CONNECT
// the proxy accepts, which turns the connection into a tunnel.
func (f *forwarder) handle(c net.Conn) {
	defer c.Close()
	// Each request's header is bounded, its body is not.
	lr := &io.LimitedReader{R: c}
	cr := bufio.NewReader(lr)
	var up net.Conn
	var ur *bufio.Reader
	defer func() {
		if up != nil {
			up.Close()
		}
	}()
	for {
		lr.N = maxHeaderBytes
		c.SetReadDeadline(time.Now().Add(headerTimeout))
		if _, err := cr.Peek(1); err != nil {
			return
		}
		req, err := http.ReadRequest(cr)
		c.SetReadDeadline(time.Time{})
		lr.N = 1 << 62
		if err != nil {
			io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			return
		}
		// The proxy is dialled once a whole request has come: a jail's
		// connection that sends nothing holds none of the connections the
		// proxy's shared listener keeps for requests not yet attributed
		// (egress.Proxy.ServeShared), which every workspace shares.
		if up == nil {
			if up, err = f.dial(); err != nil {
				io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
				return
			}
			ur = bufio.NewReader(up)
		}
		req.Header.Del("Proxy-Authorization")
		req.Header.Set("Proxy-Authorization", f.auth)
		if req.Method == http.MethodConnect {
			f.tunnel(c, cr, up, ur, req)
			return
		}
		if err := req.WriteProxy(up); err != nil {
			return
		}
		resp, err := http.ReadResponse(ur, req)
		if err != nil {
			io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			return
		}
		err = resp.Write(c)
		resp.Body.Close()
		if err != nil || resp.Close || req.Close {
			return
		}
	}
}

// dial reaches the proxy at the first of its addresses that answers.
func (f *forwarder) dial() (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	d := tls.Dialer{Config: f.tls}
	err := errors.New("the proxy's address was not resolved at the keeper's start")
	for _, a := range f.addrs {
		var c net.Conn
		if c, err = d.DialContext(ctx, "tcp", a); err == nil {
			return c, nil
		}
	}
	return nil, err
}

// tunnel sends the CONNECT req to the proxy, relays its answer, and, if it
// is a 2xx, pipes both ways.
func (f *forwarder) tunnel(c net.Conn, cr *bufio.Reader, up net.Conn, ur *bufio.Reader, req *http.Request) {
	if _, err := fmt.Fprintf(up, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n\r\n", req.Host, req.Host, f.auth); err != nil {
		return
	}
	resp, err := http.ReadResponse(ur, req)
	if err != nil {
		io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return
	}
	if resp.StatusCode/100 != 2 {
		resp.Close = true
		resp.Write(c)
		resp.Body.Close()
		return
	}
	if _, err := fmt.Fprintf(c, "HTTP/1.1 %s\r\n\r\n", resp.Status); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		io.Copy(up, cr) // what the client sent beyond the header, then the rest
		if hc, ok := up.(halfCloser); ok {
			hc.CloseWrite()
		}
		close(done)
	}()
	io.Copy(c, ur)
	if hc, ok := c.(halfCloser); ok {
		hc.CloseWrite()
	}
	<-done
}
