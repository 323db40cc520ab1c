package egress_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/internal/sgtest"
)

var loopback = netip.MustParseAddr("127.0.0.1")

// env is a proxy in front of test servers on loopback, which the static
// hosts allowed.sg.test, denied.sg.test, sg.test, a.sg.test and
// b.a.sg.test name.
type env struct {
	proxy     *egress.Proxy
	logs      *sgtest.Logs
	reader    *sdkmetric.ManualReader
	tlsSrv    *httptest.Server
	httpSrv   *httptest.Server
	echo      net.Listener
	tlsPort   uint16
	httpPort  uint16
	echoPort  uint16
	otherPort uint16 // a listening port not in Ports
}

func port(t testing.TB, addr net.Addr) uint16 {
	t.Helper()
	return uint16(addr.(*net.TCPAddr).Port)
}

// newEnv starts the servers and a proxy; mod may change its config.
func newEnv(t *testing.T, mod func(*egress.Config)) *env {
	t.Helper()
	e := &env{logs: &sgtest.Logs{}, reader: sdkmetric.NewManualReader()}
	e.tlsSrv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls page for %s", r.Host)
	}))
	e.tlsSrv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are the point
	e.tlsSrv.StartTLS()
	t.Cleanup(e.tlsSrv.Close)
	e.httpSrv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "http page for %s %s got %d bytes; proxy-auth=%q", r.Host, r.URL.Path, len(b), r.Header.Get("Proxy-Authorization"))
	}))
	t.Cleanup(e.httpSrv.Close)
	var err error
	if e.echo, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.echo.Close() })
	go func() {
		for {
			c, err := e.echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	e.tlsPort, e.httpPort = port(t, e.tlsSrv.Listener.Addr()), port(t, e.httpSrv.Listener.Addr())
	e.echoPort, e.otherPort = port(t, e.echo.Addr()), port(t, other.Addr())
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	cfg := egress.Config{
		Ports:    []uint16{e.tlsPort, e.httpPort, e.echoPort},
		TLSPorts: []uint16{e.tlsPort},
		Hosts: map[string]netip.Addr{
			"allowed.sg.test": loopback, "denied.sg.test": loopback, "sg.test": loopback,
			"a.sg.test": loopback, "b.a.sg.test": loopback,
		},
		Meter:    mp.Meter("test"),
		Resolver: noResolver{},
	}
	if mod != nil {
		mod(&cfg)
	}
	if e.proxy, err = egress.New(cfg, egress.Deps{Log: slog.New(slog.NewJSONHandler(e.logs, nil))}); err != nil {
		t.Fatalf("New: %v", err)
	}
	return e
}

// noResolver fails every lookup: a name outside Hosts must not resolve.
type noResolver struct{}

func (noResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return nil, errors.New("no resolver in this test")
}

// serve serves ws on a fresh listener and returns its address.
func (e *env) serve(t *testing.T, ws egress.Workspace) string {
	t.Helper()
	return listen(t, "Serve", func(ctx context.Context, l net.Listener) error { return e.proxy.Serve(ctx, l, ws) })
}

// serveShared serves credential mode on a fresh listener.
func (e *env) serveShared(t *testing.T) string {
	t.Helper()
	return listen(t, "ServeShared", e.proxy.ServeShared)
}

// listen runs serve on a fresh listener until the test ends and returns the
// listener's address; name is serve's, for the failure message.
func listen(t *testing.T, name string, serve func(context.Context, net.Listener) error) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s = %v; want nil", name, err)
		}
	})
	return l.Addr().String()
}

// connectCase is one CONNECT to authority with a Proxy-Authorization
// auth, and the status it must get.
type connectCase struct {
	name, authority, auth string
	status                int
}

// wantConnects runs each case against the proxy at addr.
func wantConnects(t *testing.T, addr string, tests []connectCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if code, _ := connect(t, addr, tt.authority, tt.auth); code != tt.status {
				t.Errorf("CONNECT %s = %d; want %d", tt.authority, code, tt.status)
			}
		})
	}
}

// register registers ws in credential mode and returns its credential.
func (e *env) register(t *testing.T, ws egress.Workspace) string {
	t.Helper()
	cred, err := e.proxy.Register(ws)
	if err != nil {
		t.Fatal(err)
	}
	return cred
}

// connect sends CONNECT authority to the proxy at addr and returns the
// status and, on 200, the tunnel.
func connect(t *testing.T, addr, authority, auth string) (int, net.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	req := "CONNECT " + authority + " HTTP/1.1\r\nHost: " + authority + "\r\n"
	if auth != "" {
		req += "Proxy-Authorization: " + auth + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		c.Close()
		return 0, nil
	}
	if resp.StatusCode != http.StatusOK {
		c.Close()
		return resp.StatusCode, nil
	}
	t.Cleanup(func() { c.Close() })
	return resp.StatusCode, bufConn{Conn: c, r: br} // br may hold the server's first bytes
}

// bufConn reads through r, the buffer that read the CONNECT answer.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c bufConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// fetchTLS fetches https://authority/ through the tunnel at proxy addr
// with sni in the ClientHello; it returns the page, or the error.
func fetchTLS(t *testing.T, addr, authority, sni, auth string) (string, int, error) {
	t.Helper()
	code, c := connect(t, addr, authority, auth)
	if code != http.StatusOK {
		return "", code, fmt.Errorf("CONNECT: status %d", code)
	}
	tc := tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: true}) // the proxy is tested, not the test CA
	if err := tc.Handshake(); err != nil {
		return "", code, err
	}
	host, _, _ := net.SplitHostPort(authority)
	if _, err := fmt.Fprintf(tc, "GET /secret-path-TUNNEL HTTP/1.1\r\nHost: %s\r\nX-Secret: hdr-TUNNEL\r\nConnection: close\r\n\r\n", host); err != nil {
		return "", code, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return "", code, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), code, err
}

func basic(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}

// denied returns the sum of MetricDenied points with reason.
func (e *env) denied(t *testing.T, reason string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := e.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != egress.MetricDenied {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, _ := dp.Attributes.Value(egress.AttrReason); v.AsString() == reason {
					n += dp.Value
				}
			}
		}
	}
	return n
}

func TestConnect(t *testing.T) {
	e := newEnv(t, nil)
	ws := egress.Workspace{ID: "ws_one", AllowedDomains: []string{"allowed.sg.test", "*.a.sg.test"}}
	addr := e.serve(t, ws)
	tp, op := strconv.Itoa(int(e.tlsPort)), strconv.Itoa(int(e.otherPort))
	tests := []struct {
		name, authority, sni string
		status               int    // of the CONNECT
		reason               string // "" when the page is fetched
	}{
		{"allowed", "allowed.sg.test:" + tp, "allowed.sg.test", 200, ""},
		{"allowed, upper case", "ALLOWED.sg.test:" + tp, "allowed.sg.test", 200, ""},
		{"allowed, trailing dot", "allowed.sg.test.:" + tp, "allowed.sg.test", 200, ""},
		{"wildcard subdomain", "b.a.sg.test:" + tp, "b.a.sg.test", 200, ""},
		{"wildcard parent", "a.sg.test:" + tp, "a.sg.test", 403, egress.ReasonDomain},
		{"not allowed", "denied.sg.test:" + tp, "denied.sg.test", 403, egress.ReasonDomain},
		{"suffix is not a subdomain", "xallowed.sg.test:" + tp, "xallowed.sg.test", 403, egress.ReasonDomain},
		{"ipv4 literal", "127.0.0.1:" + tp, "allowed.sg.test", 403, egress.ReasonIPLiteral},
		{"ipv6 literal", "[::1]:" + tp, "allowed.sg.test", 403, egress.ReasonIPLiteral},
		{"mapped ipv4 literal", "[::ffff:127.0.0.1]:" + tp, "allowed.sg.test", 403, egress.ReasonIPLiteral},
		{"metadata literal", "169.254.169.254:80", "allowed.sg.test", 403, egress.ReasonIPLiteral},
		{"decimal address", "2130706433:" + tp, "allowed.sg.test", 403, egress.ReasonDomain},
		{"other port", "allowed.sg.test:" + op, "allowed.sg.test", 403, egress.ReasonPort},
		{"redis port", "allowed.sg.test:6379", "allowed.sg.test", 403, egress.ReasonPort},
		{"no port", "allowed.sg.test", "allowed.sg.test", 400, egress.ReasonBadRequest},
		{"sni of another host", "allowed.sg.test:" + tp, "denied.sg.test", 200, egress.ReasonSNI},
		{"sni of a sibling", "b.a.sg.test:" + tp, "allowed.sg.test", 200, egress.ReasonSNI},
		{"no sni", "allowed.sg.test:" + tp, "", 200, egress.ReasonSNI},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := e.denied(t, tt.reason)
			page, code, err := fetchTLS(t, addr, tt.authority, tt.sni, "")
			if code != tt.status {
				t.Fatalf("CONNECT %s: status %d; want %d", tt.authority, code, tt.status)
			}
			if tt.reason == "" {
				if err != nil || !strings.HasPrefix(page, "tls page for ") {
					t.Fatalf("fetch through CONNECT %s = %q, %v; want the page", tt.authority, page, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("fetch through CONNECT %s (SNI %q) = %q; want refused", tt.authority, tt.sni, page)
			}
			if got := e.denied(t, tt.reason) - before; got != 1 {
				t.Errorf("%s{reason=%s} grew by %d; want 1", egress.MetricDenied, tt.reason, got)
			}
		})
	}
}

// TestEmptyAllowlistReachesNothing: [] means no outbound network.
func TestEmptyAllowlistReachesNothing(t *testing.T) {
	e := newEnv(t, nil)
	for _, domains := range [][]string{nil, {}} {
		addr := e.serve(t, egress.Workspace{ID: "ws_none", AllowedDomains: domains})
		for _, h := range []string{"allowed.sg.test", "sg.test", "a.sg.test", "127.0.0.1"} {
			for _, p := range []uint16{e.tlsPort, e.httpPort, e.echoPort} {
				hp := net.JoinHostPort(h, strconv.Itoa(int(p)))
				if code, _ := connect(t, addr, hp, ""); code != http.StatusForbidden {
					t.Errorf("allowed_domains %v: CONNECT %s = %d; want 403", domains, hp, code)
				}
				resp := httpGet(t, addr, "http://"+hp+"/", "")
				if resp.StatusCode != http.StatusForbidden {
					t.Errorf("allowed_domains %v: GET http://%s/ = %d; want 403", domains, hp, resp.StatusCode)
				}
			}
		}
	}
}

// TestTLSPortNeedsHello: a tunnel to a TLS port that does not start with
// a ClientHello carries nothing; on another port it does.
func TestTLSPortNeedsHello(t *testing.T) {
	e := newEnv(t, func(c *egress.Config) { c.TLSPorts = []uint16{e2ePort(c)} })
	addr := e.serve(t, egress.Workspace{ID: "ws_one", AllowedDomains: []string{"allowed.sg.test"}})
	code, c := connect(t, addr, net.JoinHostPort("allowed.sg.test", strconv.Itoa(int(e.tlsPort))), "")
	if code != 200 {
		t.Fatalf("CONNECT = %d; want 200", code)
	}
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: allowed.sg.test\r\n\r\n")
	if b, err := io.ReadAll(c); len(b) != 0 {
		t.Errorf("plain HTTP in a tunnel to a TLS port read %q, %v; want nothing", b, err)
	}
	if n := e.denied(t, egress.ReasonNotTLS); n != 1 {
		t.Errorf("%s{reason=not_tls} = %d; want 1", egress.MetricDenied, n)
	}
	// The echo port is not a TLS port: any protocol passes, and bytes are
	// counted exactly.
	code, c = connect(t, addr, net.JoinHostPort("allowed.sg.test", strconv.Itoa(int(e.echoPort))), "")
	if code != 200 {
		t.Fatalf("CONNECT echo = %d; want 200", code)
	}
	msg := strings.Repeat("x", 1000)
	io.WriteString(c, msg)
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo through the tunnel = %q, %v; want the message", buf, err)
	}
	c.Close()
	waitFor(t, func() bool { return e.proxy.Usage("ws_one") == egress.Usage{BytesOut: 1000, BytesIn: 1000} },
		func() string { return fmt.Sprintf("Usage = %+v; want 1000 each way", e.proxy.Usage("ws_one")) })
}

// e2ePort returns the first port of c (the TLS test server's).
func e2ePort(c *egress.Config) uint16 { return c.Ports[0] }

// waitFor polls cond (bounded by the test's deadline, not a wall clock).
func waitFor(t *testing.T, cond func() bool, msg func() string) {
	t.Helper()
	for i := 0; !cond(); i++ {
		if i > 2000 {
			t.Fatal(msg())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// httpGet sends a plain-HTTP proxy request for target.
func httpGet(t *testing.T, proxyAddr, target, auth string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, target, nil)
	if err != nil {
		t.Fatal(err)
	}
	return do(t, proxyAddr, req, auth)
}

func do(t *testing.T, proxyAddr string, req *http.Request, auth string) *http.Response {
	t.Helper()
	tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: proxyAddr}), DisableKeepAlives: true}
	if auth != "" {
		tr.ProxyConnectHeader = http.Header{"Proxy-Authorization": {auth}}
		req.Header.Set("Proxy-Authorization", auth)
	}
	defer tr.CloseIdleConnections()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("%s %s through the proxy: %v", req.Method, req.URL, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(strings.NewReader(string(b)))
	return resp
}

func body(r *http.Response) string { b, _ := io.ReadAll(r.Body); return string(b) }

func TestPlainHTTP(t *testing.T) {
	e := newEnv(t, nil)
	addr := e.serve(t, egress.Workspace{ID: "ws_one", AllowedDomains: []string{"allowed.sg.test", "*.sg.test"}})
	hp, op := strconv.Itoa(int(e.httpPort)), strconv.Itoa(int(e.otherPort))
	tests := []struct {
		target string
		status int
		want   string // in the body on 200
	}{
		{"http://allowed.sg.test:" + hp + "/x", 200, "http page for allowed.sg.test:" + hp + " /x"},
		{"http://a.sg.test:" + hp + "/", 200, "http page for a.sg.test"},
		{"http://sg.test:" + hp + "/", 403, ""},
		{"http://denied.example:" + hp + "/", 403, ""},
		{"http://127.0.0.1:" + hp + "/", 403, ""},
		{"http://[::1]:" + hp + "/", 403, ""},
		{"http://allowed.sg.test:" + op + "/", 403, ""},
		{"http://allowed.sg.test/", 403, ""}, // port 80 is not in this proxy's Ports
	}
	for _, tt := range tests {
		resp := httpGet(t, addr, tt.target, "")
		if resp.StatusCode != tt.status {
			t.Errorf("GET %s = %d; want %d", tt.target, resp.StatusCode, tt.status)
			continue
		}
		if b := body(resp); tt.status == 200 && !strings.Contains(b, tt.want) {
			t.Errorf("GET %s body = %q; want it to contain %q", tt.target, b, tt.want)
		}
	}
	// A Host header naming another server does not move the request: the
	// destination gets the checked host.
	req, _ := http.NewRequest(http.MethodGet, "http://allowed.sg.test:"+hp+"/h", nil)
	req.Host = "denied.sg.test"
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET http://allowed.sg.test:%s/h HTTP/1.1\r\nHost: denied.sg.test\r\nConnection: close\r\n\r\n", hp)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if b := body(resp); resp.StatusCode != 200 || !strings.Contains(b, "page for allowed.sg.test:") {
		t.Errorf("GET with Host: denied.sg.test = %d %q; want the allowed host's page, for allowed.sg.test", resp.StatusCode, b)
	}
	// Origin form (a request for the proxy itself) and https:// are refused.
	for _, line := range []string{"GET / HTTP/1.1", "GET https://allowed.sg.test:" + hp + "/ HTTP/1.1"} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "%s\r\nHost: allowed.sg.test\r\nConnection: close\r\n\r\n", line)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err != nil || resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%q = %v, %v; want 400", line, resp, err)
		}
	}
	// A POST body is counted out, the page in.
	before := e.proxy.Usage("ws_one")
	req, _ = http.NewRequest(http.MethodPost, "http://allowed.sg.test:"+hp+"/up", strings.NewReader(strings.Repeat("b", 5000)))
	resp = do(t, addr, req, "")
	if b := body(resp); !strings.Contains(b, "got 5000 bytes") {
		t.Fatalf("POST body = %q; want the server to get 5000 bytes", b)
	}
	// The last write to the destination is counted when it returns, which
	// may be after the destination's answer has reached the client: poll.
	after := e.proxy.Usage("ws_one")
	for deadline := time.Now().Add(10 * time.Second); after.BytesOut-before.BytesOut < 5000 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		after = e.proxy.Usage("ws_one")
	}
	if out := after.BytesOut - before.BytesOut; out < 5000 {
		t.Errorf("BytesOut grew by %d for a 5000-byte POST; want at least 5000", out)
	}
	if in := after.BytesIn - before.BytesIn; in < int64(len("http page for")) {
		t.Errorf("BytesIn grew by %d; want at least the page", in)
	}
}

// rebinder answers its first lookup with a public address and every later
// one with loopback, as a hostile DNS server would.
type rebinder struct {
	calls atomic.Int64
	addrs [][]netip.Addr
}

func (r *rebinder) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	n := int(r.calls.Add(1)) - 1
	return r.addrs[min(n, len(r.addrs)-1)], nil
}

// TestResolution: the proxy dials exactly the address it checked, once
// per connection, and never one the private-address refusal covers.
func TestResolution(t *testing.T) {
	public := netip.MustParseAddr("93.184.216.34")
	var mu sync.Mutex
	var dialled []string
	var res *rebinder
	var tlsAddr string
	e := newEnv(t, func(c *egress.Config) {
		c.Resolver = resolverFunc(func(ctx context.Context, network, host string) ([]netip.Addr, error) {
			return res.LookupNetIP(ctx, network, host)
		})
		c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			dialled = append(dialled, addr)
			mu.Unlock()
			// The "public" server is the TLS test server.
			return (&net.Dialer{}).DialContext(ctx, network, tlsAddr)
		}
	})
	tlsAddr = e.tlsSrv.Listener.Addr().String()
	addr := e.serve(t, egress.Workspace{ID: "ws_one", AllowedDomains: []string{"rebind.example.com"}})
	authority := net.JoinHostPort("rebind.example.com", strconv.Itoa(int(e.tlsPort)))

	res = &rebinder{addrs: [][]netip.Addr{{public}, {loopback}}}
	if page, _, err := fetchTLS(t, addr, authority, "rebind.example.com", ""); err != nil {
		t.Fatalf("fetch of a public name = %q, %v; want the page", page, err)
	}
	want := netip.AddrPortFrom(public, e.tlsPort).String()
	if len(dialled) != 1 || dialled[0] != want || res.calls.Load() != 1 {
		t.Fatalf("dialled %v after %d lookups; want [%s] after 1", dialled, res.calls.Load(), want)
	}
	// The second lookup answers loopback: refused, nothing dialled.
	if code, _ := connect(t, addr, authority, ""); code != http.StatusForbidden {
		t.Errorf("CONNECT after rebinding to loopback = %d; want 403", code)
	}
	if len(dialled) != 1 {
		t.Errorf("dialled %v; want nothing after the rebinding", dialled)
	}
	// A mixed answer is narrowed to its public addresses.
	res = &rebinder{addrs: [][]netip.Addr{{loopback, netip.MustParseAddr("10.0.0.1"), public}}}
	dialled = nil
	if _, _, err := fetchTLS(t, addr, authority, "rebind.example.com", ""); err != nil || len(dialled) != 1 || dialled[0] != want {
		t.Errorf("mixed answer: dialled %v, %v; want only %s", dialled, err, want)
	}
	// Every special-purpose answer is refused.
	for _, a := range []string{"127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1", "169.254.169.254",
		"0.0.0.0", "255.255.255.255", "224.0.0.1", "::1", "::", "fe80::1", "fc00::1", "fd00:ec2::254",
		"::ffff:127.0.0.1", "::ffff:169.254.169.254", "64:ff9b::7f00:1", "ff02::1"} {
		res = &rebinder{addrs: [][]netip.Addr{{netip.MustParseAddr(a)}}}
		dialled = nil
		if code, _ := connect(t, addr, authority, ""); code != http.StatusForbidden || len(dialled) != 0 {
			t.Errorf("CONNECT to a name resolving to %s = %d, dialled %v; want 403 and nothing dialled", a, code, dialled)
		}
	}
}

type resolverFunc func(ctx context.Context, network, host string) ([]netip.Addr, error)

func (f resolverFunc) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	return f(ctx, network, host)
}

// TestStaticHostsOnly: a name in Hosts is never sent to the resolver, and
// one outside it that fails to resolve is refused.
func TestStaticHostsOnly(t *testing.T) {
	var calls atomic.Int64
	e := newEnv(t, func(c *egress.Config) {
		c.Resolver = resolverFunc(func(context.Context, string, string) ([]netip.Addr, error) {
			calls.Add(1)
			return []netip.Addr{netip.MustParseAddr("93.184.216.34")}, nil
		})
	})
	addr := e.serve(t, egress.Workspace{ID: "ws_one", AllowedDomains: []string{"allowed.sg.test"}})
	if _, _, err := fetchTLS(t, addr, net.JoinHostPort("allowed.sg.test", strconv.Itoa(int(e.tlsPort))), "allowed.sg.test", ""); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 0 {
		t.Errorf("the resolver was asked %d times for a static host; want 0", calls.Load())
	}
}

func TestPublic(t *testing.T) {
	tests := []struct {
		addr string
		want bool
	}{
		{"93.184.216.34", true}, {"1.1.1.1", true}, {"2606:4700:4700::1111", true}, {"64:ff9b::5db8:d822", true},
		{"127.0.0.1", false}, {"127.255.0.1", false}, {"10.0.0.1", false}, {"172.31.255.255", false}, {"192.168.0.1", false},
		{"100.64.0.1", false}, {"100.127.255.255", false}, {"169.254.169.254", false}, {"169.254.0.1", false},
		{"0.0.0.0", false}, {"0.1.2.3", false}, {"255.255.255.255", false}, {"224.0.0.251", false}, {"240.0.0.1", false},
		{"::", false}, {"::1", false}, {"fe80::1", false}, {"fc00::1", false}, {"fd00:ec2::254", false}, {"ff02::1", false},
		{"::ffff:10.0.0.1", false}, {"::ffff:93.184.216.34", true}, {"64:ff9b::a00:1", false}, {"2001:db8::1", false},
	}
	for _, tt := range tests {
		if got := egress.Public(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("Public(%s) = %v; want %v", tt.addr, got, tt.want)
		}
	}
}

func TestAllows(t *testing.T) {
	ws := egress.Workspace{AllowedDomains: []string{"github.com", "*.githubusercontent.com"}}
	tests := []struct {
		host string
		want bool
	}{
		{"github.com", true}, {"api.github.com", false}, {"raw.githubusercontent.com", true},
		{"a.b.githubusercontent.com", true}, {"githubusercontent.com", false}, {"xgithubusercontent.com", false},
		{"evilgithub.com", false}, {"github.com.evil.com", false}, {"", false},
	}
	for _, tt := range tests {
		if got := ws.Allows(tt.host); got != tt.want {
			t.Errorf("Allows(%q) = %v; want %v", tt.host, got, tt.want)
		}
	}
	if (egress.Workspace{}).Allows("github.com") {
		t.Errorf("Workspace{}.Allows(github.com) = true; want false")
	}
}

// TestCredentials: in credential mode a credential names one workspace,
// and reaches only that workspace's domains.
func TestCredentials(t *testing.T) {
	e := newEnv(t, nil)
	addr := e.serveShared(t)
	credA := e.register(t, egress.Workspace{ID: "ws_a", AllowedDomains: []string{"allowed.sg.test"}})
	credB := e.register(t, egress.Workspace{ID: "ws_b", AllowedDomains: []string{"a.sg.test"}})
	if credA == credB || len(credA) < 32 {
		t.Fatalf("credentials %q and %q; want two distinct long ones", credA, credB)
	}
	if _, err := e.proxy.Register(egress.Workspace{ID: "ws_a"}); err == nil {
		t.Errorf("Register(ws_a) twice: nil error; want one")
	}
	tp := strconv.Itoa(int(e.tlsPort))
	tests := []connectCase{
		{"own credential", "allowed.sg.test:" + tp, basic("ws_a", credA), 200},
		{"own credential, other's domain", "a.sg.test:" + tp, basic("ws_a", credA), 403},
		{"b's credential", "a.sg.test:" + tp, basic("ws_b", credB), 200},
		{"a's credential under b's id", "a.sg.test:" + tp, basic("ws_b", credA), 407},
		{"b's credential under a's id", "allowed.sg.test:" + tp, basic("ws_a", credB), 407},
		{"no credential", "allowed.sg.test:" + tp, "", 407},
		{"unknown id", "allowed.sg.test:" + tp, basic("ws_c", credA), 407},
		{"truncated credential", "allowed.sg.test:" + tp, basic("ws_a", credA[:len(credA)-1]), 407},
		{"bearer", "allowed.sg.test:" + tp, "Bearer " + credA, 407},
	}
	wantConnects(t, addr, tests)
	// Plain HTTP carries the credential in the request; it never reaches
	// the destination.
	resp := httpGet(t, addr, "http://allowed.sg.test:"+strconv.Itoa(int(e.httpPort))+"/", basic("ws_a", credA))
	if b := body(resp); resp.StatusCode != 200 || !strings.Contains(b, `proxy-auth=""`) {
		t.Errorf("plain HTTP in credential mode = %d %q; want 200 without Proxy-Authorization at the destination", resp.StatusCode, b)
	}
	if resp := httpGet(t, addr, "http://allowed.sg.test:"+strconv.Itoa(int(e.httpPort))+"/", ""); resp.StatusCode != 407 ||
		resp.Header.Get("Proxy-Authenticate") == "" {
		t.Errorf("plain HTTP without a credential = %d (Proxy-Authenticate %q); want 407 with a challenge",
			resp.StatusCode, resp.Header.Get("Proxy-Authenticate"))
	}
	e.proxy.Unregister("ws_a")
	if code, _ := connect(t, addr, "allowed.sg.test:"+tp, basic("ws_a", credA)); code != 407 {
		t.Errorf("CONNECT after Unregister = %d; want 407", code)
	}
	if n := e.denied(t, egress.ReasonAuth); n < 6 {
		t.Errorf("%s{reason=auth} = %d; want every refused credential counted", egress.MetricDenied, n)
	}
}

// TestListenerPerWorkspace: a workspace's listener is its identity; a
// credential means nothing there.
func TestListenerPerWorkspace(t *testing.T) {
	e := newEnv(t, nil)
	addrA := e.serve(t, egress.Workspace{ID: "ws_a", AllowedDomains: []string{"allowed.sg.test"}})
	addrB := e.serve(t, egress.Workspace{ID: "ws_b", AllowedDomains: []string{"a.sg.test"}})
	tp := strconv.Itoa(int(e.tlsPort))
	if code, _ := connect(t, addrA, "a.sg.test:"+tp, basic("ws_b", "anything")); code != 403 {
		t.Errorf("CONNECT b's domain on a's listener = %d; want 403", code)
	}
	if _, _, err := fetchTLS(t, addrB, "a.sg.test:"+tp, "a.sg.test", ""); err != nil {
		t.Errorf("b's own domain on b's listener: %v", err)
	}
	if u := e.proxy.Usage("ws_a"); u != (egress.Usage{}) {
		t.Errorf("Usage(ws_a) = %+v; want nothing (b's bytes are b's)", u)
	}
	waitFor(t, func() bool { return e.proxy.Usage("ws_b").BytesIn > 0 }, func() string { return "Usage(ws_b) stayed zero" })
}

// TestLimits: connections per workspace, header size, idle tunnels.
func TestLimits(t *testing.T) {
	e := newEnv(t, func(c *egress.Config) {
		c.MaxConnsPerWorkspace = 2
		c.IdleTimeout = 200 * time.Millisecond
	})
	addr := e.serve(t, egress.Workspace{ID: "ws_one", AllowedDomains: []string{"allowed.sg.test"}})
	echo := net.JoinHostPort("allowed.sg.test", strconv.Itoa(int(e.echoPort)))
	var open []net.Conn
	for range 2 {
		code, c := connect(t, addr, echo, "")
		if code != 200 {
			t.Fatalf("CONNECT = %d; want 200", code)
		}
		open = append(open, c)
	}
	// The third connection to the workspace's listener is closed at once.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", echo, echo)
	if b, _ := io.ReadAll(c); len(b) != 0 {
		t.Errorf("third connection read %q; want it closed", b)
	}
	c.Close()
	if n := e.denied(t, egress.ReasonLimit); n != 1 {
		t.Errorf("%s{reason=limit} = %d; want 1", egress.MetricDenied, n)
	}
	// Idle tunnels are closed; their slots come back.
	for _, c := range open {
		if _, err := io.ReadAll(c); err != nil {
			t.Errorf("idle tunnel read: %v; want EOF", err)
		}
	}
	waitFor(t, func() bool { code, _ := connect(t, addr, echo, ""); return code == 200 },
		func() string { return "no CONNECT succeeded after the idle tunnels closed" })
}

// TestHeaderLimit: a header past MaxHeaderBytes is refused.
func TestHeaderLimit(t *testing.T) {
	e := newEnv(t, nil)
	addr := e.serve(t, egress.Workspace{ID: "ws_one", AllowedDomains: []string{"allowed.sg.test"}})
	echo := net.JoinHostPort("allowed.sg.test", strconv.Itoa(int(e.echoPort)))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Written while the answer is read: the proxy answers before it has
	// read the whole header.
	go fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nX-Big: %s\r\n\r\n", echo, echo, strings.Repeat("h", 64<<10))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("CONNECT with a 64 KiB header = %v, %v; want 431", resp, err)
	}
}

// TestSharedUpstreamLimit: in credential mode the limit is on each
// workspace's destination connections.
func TestSharedUpstreamLimit(t *testing.T) {
	e := newEnv(t, func(c *egress.Config) { c.MaxConnsPerWorkspace = 1 })
	addr := e.serveShared(t)
	cred := e.register(t, egress.Workspace{ID: "ws_a", AllowedDomains: []string{"allowed.sg.test"}})
	credB := e.register(t, egress.Workspace{ID: "ws_b", AllowedDomains: []string{"allowed.sg.test"}})
	echo := net.JoinHostPort("allowed.sg.test", strconv.Itoa(int(e.echoPort)))
	if code, _ := connect(t, addr, echo, basic("ws_a", cred)); code != 200 {
		t.Fatalf("first CONNECT = %d; want 200", code)
	}
	if code, _ := connect(t, addr, echo, basic("ws_a", cred)); code != http.StatusTooManyRequests {
		t.Errorf("second CONNECT of ws_a = %d; want 429", code)
	}
	if code, _ := connect(t, addr, echo, basic("ws_b", credB)); code != 200 {
		t.Errorf("first CONNECT of ws_b = %d; want 200 (limits are per workspace)", code)
	}
}

// TestSharedListenerFair: in credential mode one workspace's tunnels, at
// its own limit, and its plain requests leave the shared listener's slots
// to the others; only connections no request has claimed yet fill them.
func TestSharedListenerFair(t *testing.T) {
	e := newEnv(t, func(c *egress.Config) {
		c.MaxSharedConns = 2
		c.MaxConnsPerWorkspace = 2
	})
	addr := e.serveShared(t)
	cred := e.register(t, egress.Workspace{ID: "ws_a", AllowedDomains: []string{"allowed.sg.test"}})
	credB := e.register(t, egress.Workspace{ID: "ws_b", AllowedDomains: []string{"allowed.sg.test"}})
	echo := net.JoinHostPort("allowed.sg.test", strconv.Itoa(int(e.echoPort)))
	for i := range 2 {
		code, c := connect(t, addr, echo, basic("ws_a", cred))
		if code != 200 {
			t.Fatalf("CONNECT %d of ws_a = %d; want 200", i, code)
		}
		defer c.Close()
	}
	if code, _ := connect(t, addr, echo, basic("ws_a", cred)); code != http.StatusTooManyRequests {
		t.Errorf("third CONNECT of ws_a = %d; want 429 (its own limit)", code)
	}
	// A plain request asking for keep-alive still ends its connection:
	// none stays idle, counted by no workspace.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	target := "http://allowed.sg.test:" + strconv.Itoa(int(e.httpPort)) + "/"
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: allowed.sg.test\r\nProxy-Authorization: %s\r\n\r\n", target, basic("ws_b", credB))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !resp.Close {
		t.Errorf("plain GET of ws_b = %d, close %t; want 200 and the connection closed", resp.StatusCode, resp.Close)
	}
	c.SetReadDeadline(time.Now().Add(time.Minute)) // a kept-alive connection would wait for IdleTimeout
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after the answer the connection read %v; want EOF", err)
	}
	if code, c := connect(t, addr, echo, basic("ws_b", credB)); code != 200 {
		t.Errorf("CONNECT of ws_b beside ws_a's tunnels = %d; want 200", code)
	} else {
		c.Close()
	}
	// Connections that send nothing do hold the shared slots.
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	waitFor(t, func() bool { code, _ := connect(t, addr, echo, basic("ws_b", credB)); return code == 0 },
		func() string { return "a CONNECT got through with the shared slots taken by silent connections" })
}

// slowResolver answers every lookup once release is closed.
type slowResolver struct{ entered, release chan struct{} }

func (r slowResolver) LookupNetIP(ctx context.Context, _, _ string) ([]netip.Addr, error) {
	r.entered <- struct{}{}
	select {
	case <-r.release:
	case <-ctx.Done():
	}
	return []netip.Addr{netip.MustParseAddr("192.0.2.1")}, nil
}

// TestSlowLookupCounted: a request waiting on a lookup the tenant's own
// DNS makes slow counts against its workspace's limit, not only against
// the shared listener's slots.
func TestSlowLookupCounted(t *testing.T) {
	res := slowResolver{entered: make(chan struct{}), release: make(chan struct{})}
	e := newEnv(t, func(c *egress.Config) {
		c.MaxConnsPerWorkspace = 1
		c.Resolver = res
	})
	addr := e.serveShared(t)
	cred := e.register(t, egress.Workspace{ID: "ws_a", AllowedDomains: []string{"allowed.sg.test", "slow.sg.test"}})
	echo := net.JoinHostPort("allowed.sg.test", strconv.Itoa(int(e.echoPort)))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	slowHost := net.JoinHostPort("slow.sg.test", strconv.Itoa(int(e.echoPort)))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n\r\n", slowHost, slowHost, basic("ws_a", cred))
	slow := make(chan struct{})
	go func() {
		defer close(slow)
		io.Copy(io.Discard, c) // the refusal, once the lookup is answered
	}()
	<-res.entered
	if code, _ := connect(t, addr, echo, basic("ws_a", cred)); code != http.StatusTooManyRequests {
		t.Errorf("CONNECT of ws_a beside its lookup = %d; want 429", code)
	}
	close(res.release)
	<-slow
}

// TestServeEndsTunnels: when its context ends, Serve closes the tunnels
// it opened and returns, and the usage is final.
func TestServeEndsTunnels(t *testing.T) {
	e := newEnv(t, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- e.proxy.Serve(ctx, l, egress.Workspace{ID: "ws_one", AllowedDomains: []string{"allowed.sg.test"}})
	}()
	code, c := connect(t, l.Addr().String(), net.JoinHostPort("allowed.sg.test", strconv.Itoa(int(e.echoPort))), "")
	if code != 200 {
		t.Fatalf("CONNECT = %d", code)
	}
	io.WriteString(c, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve = %v; want nil", err)
	}
	if _, err := io.ReadAll(c); err != nil {
		t.Errorf("tunnel after Serve returned: %v; want EOF", err)
	}
	if c := e.proxy.Forget("ws_one"); c.Total != (egress.Usage{BytesOut: 4, BytesIn: 4}) || c.Unkept() != c.Total || !c.Exact || c.Counter == "" {
		t.Errorf("Forget = %+v; want 4 bytes each way, none kept, exact, a counter", c)
	}
	if u := e.proxy.Usage("ws_one"); u != (egress.Usage{}) {
		t.Errorf("Usage after Forget = %+v; want zero", u)
	}
}

// TestRecordHandsOverBytes: Record hands keep each workspace's count of a
// known account, the totals under a counter of its own, whenever it has
// counted more than was kept or its last keep is in doubt; a count kept
// and unchanged is not handed again, and a workspace keep says has ended
// is dropped. Forget returns the count, what of it was kept, and whether
// that is known. A workspace of no known account is left to Forget.
func TestRecordHandsOverBytes(t *testing.T) {
	e := newEnv(t, nil)
	echo := net.JoinHostPort("allowed.sg.test", strconv.Itoa(int(e.echoPort)))
	move := func(addr, msg string) {
		t.Helper()
		code, c := connect(t, addr, echo, "")
		if code != 200 {
			t.Fatalf("CONNECT = %d", code)
		}
		defer c.Close()
		io.WriteString(c, msg)
		if _, err := io.ReadFull(c, make([]byte, len(msg))); err != nil {
			t.Fatal(err)
		}
	}
	allowed := []string{"allowed.sg.test"}
	a := e.serve(t, egress.Workspace{ID: "ws_a", AccountID: "acct_1", AllowedDomains: allowed})
	b := e.serve(t, egress.Workspace{ID: "ws_b", AccountID: "acct_2", AllowedDomains: allowed})
	old := e.serve(t, egress.Workspace{ID: "ws_old", AllowedDomains: allowed})
	move(a, "ping")
	move(b, "pong!")
	move(old, "hi")
	// A write upstream is counted after it returns, which can be after the
	// echo is read back: wait for both directions.
	counted := func(want map[string]int64) {
		t.Helper()
		waitFor(t, func() bool {
			for id, n := range want {
				if u := e.proxy.Usage(id); u.BytesOut != n || u.BytesIn != n {
					return false
				}
			}
			return true
		}, func() string { return fmt.Sprintf("the echoes were not all counted: want %v each way", want) })
	}
	counted(map[string]int64{"ws_a": 4, "ws_b": 5, "ws_old": 2})

	counters := map[string]string{}
	var handed []egress.Delta
	record := func(answer map[string]egress.Kept, fail error) {
		t.Helper()
		handed = nil
		err := e.proxy.Record(context.Background(), func(_ context.Context, ds []egress.Delta) ([]egress.Kept, error) {
			kept := make([]egress.Kept, len(ds))
			for i, d := range ds {
				kept[i] = answer[d.WorkspaceID]
				if c, ok := counters[d.WorkspaceID]; d.Counter == "" || ok && c != d.Counter {
					t.Errorf("%s handed under counter %q, before under %q; want one counter, not empty", d.WorkspaceID, d.Counter, c)
				}
				counters[d.WorkspaceID] = d.Counter
				d.Counter = ""
				handed = append(handed, d)
			}
			return kept, fail
		})
		if err != fail {
			t.Fatalf("Record = %v; want %v", err, fail)
		}
		slices.SortFunc(handed, func(x, y egress.Delta) int { return strings.Compare(x.WorkspaceID, y.WorkspaceID) })
	}
	check := func(round string, want ...egress.Delta) {
		t.Helper()
		if !slices.Equal(handed, want) {
			t.Fatalf("%s Record handed %+v; want %+v", round, handed, want)
		}
	}
	delta := func(id, acct string, n int64) egress.Delta {
		return egress.Delta{WorkspaceID: id, AccountID: acct, Usage: egress.Usage{BytesOut: n, BytesIn: n}}
	}
	record(map[string]egress.Kept{"ws_a": egress.KeptAll, "ws_b": egress.NotKept}, nil)
	check("first", delta("ws_a", "acct_1", 4), delta("ws_b", "acct_2", 5)) // ws_old: no account
	if counters["ws_a"] == counters["ws_b"] {
		t.Errorf("ws_a and ws_b share counter %q", counters["ws_a"])
	}
	move(a, "again")
	counted(map[string]int64{"ws_a": 9})
	record(map[string]egress.Kept{"ws_a": egress.KeptInDoubt, "ws_b": egress.KeptEnded}, nil)
	check("second", delta("ws_a", "acct_1", 9), delta("ws_b", "acct_2", 5)) // the totals, not what is new
	record(nil, nil)
	check("third", delta("ws_a", "acct_1", 9)) // in doubt: again; ws_b ended, dropped
	record(map[string]egress.Kept{"ws_a": egress.KeptAll}, nil)
	check("fourth", delta("ws_a", "acct_1", 9)) // NotKept left it in doubt
	record(nil, nil)
	check("fifth") // kept, unchanged
	move(a, "x")
	counted(map[string]int64{"ws_a": 10})
	failed := errors.New("store down")
	record(nil, failed)
	check("sixth", delta("ws_a", "acct_1", 10))
	for id, want := range map[string]egress.Count{
		// In doubt: the failed keep may have kept all 10.
		"ws_a": {Counter: counters["ws_a"], Total: egress.Usage{BytesOut: 10, BytesIn: 10}, Kept: egress.Usage{BytesOut: 9, BytesIn: 9}},
		// Ended: dropped.
		"ws_b":   {Exact: true},
		"ws_old": {Total: egress.Usage{BytesOut: 2, BytesIn: 2}, Exact: true},
	} {
		got := e.proxy.Forget(id)
		if id == "ws_old" {
			if got.Counter == "" || slices.Contains(slices.Collect(maps.Values(counters)), got.Counter) {
				t.Errorf("Forget(ws_old) counter %q; want one of its own", got.Counter)
			}
			got.Counter = ""
		}
		if got != want {
			t.Errorf("Forget(%s) = %+v; want %+v", id, got, want)
		}
	}
	record(nil, nil)
	check("after Forget")
}

// TestLogsNameHostsOnly: a refusal logs the workspace and the host, never
// a path, header, body or credential.
func TestLogsNameHostsOnly(t *testing.T) {
	e := newEnv(t, nil)
	addr := e.serve(t, egress.Workspace{ID: "ws_logged", AllowedDomains: []string{"allowed.sg.test"}})
	tp, hp := strconv.Itoa(int(e.tlsPort)), strconv.Itoa(int(e.httpPort))
	fetchTLS(t, addr, "allowed.sg.test:"+tp, "allowed.sg.test", "")
	fetchTLS(t, addr, "allowed.sg.test:"+tp, "denied.sg.test", "")
	for _, target := range []string{"http://denied.sg.test:" + hp + "/secret-path-PLAIN?q=secret-query", "http://allowed.sg.test:" + hp + "/secret-path-OK"} {
		req, _ := http.NewRequest(http.MethodPost, target, strings.NewReader("secret-body"))
		req.Header.Set("X-Secret", "hdr-PLAIN")
		req.Header.Set("Authorization", "Bearer secret-token")
		do(t, addr, req, "")
	}
	shared := e.serveShared(t)
	connect(t, shared, "allowed.sg.test:"+tp, basic("ws_logged", "secret-credential"))
	// Text that is no host name is refused and not repeated.
	if code, _ := connect(t, addr, "secret_not~a(host):"+tp, ""); code != http.StatusForbidden {
		t.Errorf("CONNECT to a non-name: status %d; want 403", code)
	}
	logs := e.logs.String()
	for _, s := range []string{"secret", "hdr-", "Bearer"} {
		if strings.Contains(logs, s) {
			t.Errorf("logs contain %q:\n%s", s, logs)
		}
	}
	for _, s := range []string{`"workspace_id":"ws_logged"`, `"host":"denied.sg.test"`, `"reason":"sni"`, `"reason":"domain"`, `"reason":"auth"`} {
		if !strings.Contains(logs, s) {
			t.Errorf("logs lack %s:\n%s", s, logs)
		}
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	tests := []egress.Config{
		{Ports: []uint16{0}},
		{Hosts: map[string]netip.Addr{"Upper.example": loopback}},
		{Hosts: map[string]netip.Addr{"*.example.com": loopback}},
		{Hosts: map[string]netip.Addr{"127.0.0.1": loopback}},
		{Hosts: map[string]netip.Addr{"ok.example": {}}},
		{MaxConnsPerWorkspace: -1},
	}
	for _, c := range tests {
		if _, err := egress.New(c, egress.Deps{}); err == nil {
			t.Errorf("New(%+v): nil error; want one", c)
		}
	}
}

// TestServerSpeaksFirst: on a port that is not a TLS port, the
// destination's banner reaches the sandbox before it sends anything, and
// a later ClientHello is still checked.
func TestServerSpeaksFirst(t *testing.T) {
	banner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer banner.Close()
	go func() {
		for {
			c, err := banner.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.WriteString(c, "SSH-2.0-test\r\n"); _, _ = io.Copy(c, c) }()
		}
	}()
	bp := port(t, banner.Addr())
	e := newEnv(t, func(c *egress.Config) { c.Ports = append(c.Ports, bp) })
	addr := e.serve(t, egress.Workspace{ID: "ws_one", AllowedDomains: []string{"allowed.sg.test"}})
	authority := net.JoinHostPort("allowed.sg.test", strconv.Itoa(int(bp)))
	code, c := connect(t, addr, authority, "")
	if code != 200 {
		t.Fatalf("CONNECT = %d; want 200", code)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "SSH-2.0-test\r\n" {
		t.Fatalf("banner through the tunnel = %q, %v; want SSH-2.0-test", line, err)
	}
	// A ClientHello for another name, after the banner, is refused.
	code, c = connect(t, addr, authority, "")
	if code != 200 {
		t.Fatalf("CONNECT = %d; want 200", code)
	}
	br := bufio.NewReader(c)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "denied.sg.test", InsecureSkipVerify: true})
	if err := tc.Handshake(); err == nil {
		t.Errorf("TLS handshake with SNI denied.sg.test after a banner succeeded; want the tunnel closed")
	}
	waitFor(t, func() bool { return e.denied(t, egress.ReasonSNI) == 1 },
		func() string {
			return fmt.Sprintf("%s{reason=sni} = %d; want 1", egress.MetricDenied, e.denied(t, egress.ReasonSNI))
		})
}

// TestPlainHTTPUpgradeRefused: a protocol switch must use CONNECT.
func TestPlainHTTPUpgradeRefused(t *testing.T) {
	e := newEnv(t, nil)
	addr := e.serve(t, egress.Workspace{ID: "ws_one", AllowedDomains: []string{"allowed.sg.test"}})
	req, _ := http.NewRequest(http.MethodGet, "http://allowed.sg.test:"+strconv.Itoa(int(e.httpPort))+"/ws", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	if resp := do(t, addr, req, ""); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("GET with Upgrade: websocket = %d; want 400", resp.StatusCode)
	}
}

// TestInvalidWorkspace: entries outside the grammar are refused, not read
// some other way.
func TestInvalidWorkspace(t *testing.T) {
	e := newEnv(t, nil)
	for _, domains := range [][]string{{"*"}, {"*.com"}, {"Example.com"}, {"127.0.0.1"}, {"example.com:443"}} {
		ws := egress.Workspace{ID: "ws_bad", AllowedDomains: domains}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if err := e.proxy.Serve(context.Background(), l, ws); err == nil {
			t.Errorf("Serve(allowed_domains %q) = nil; want an error", domains)
		}
		l.Close()
		if _, err := e.proxy.Register(ws); err == nil {
			t.Errorf("Register(allowed_domains %q) = nil error; want one", domains)
		}
	}
}

// liveSet is a Config.Lookup over a set of workspaces, each live or not,
// that counts its calls.
type liveSet struct {
	mu    sync.Mutex
	ws    map[string]egress.Workspace
	live  map[string]bool
	calls int
	err   error
}

func (s *liveSet) lookup(_ context.Context, id string) (egress.Workspace, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.err != nil {
		return egress.Workspace{}, false, s.err
	}
	ws, ok := s.ws[id]
	return ws, ok && s.live[id], nil
}

func (s *liveSet) set(id string, live bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live[id] = live
}

// TestDerivedCredentials: with a credential key, a workspace registered
// with one proxy (a gateway, or the broker before a restart) is served by
// another proxy with the same key while the store says it is live, and
// refused once it is not, for an unknown id or a wrong credential.
func TestDerivedCredentials(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	wsA := egress.Workspace{ID: "ws_a", AccountID: "acct_x", AllowedDomains: []string{"allowed.sg.test"}}
	wsB := egress.Workspace{ID: "ws_b", AccountID: "acct_x", AllowedDomains: []string{"a.sg.test"}}
	wsT := egress.Workspace{ID: "ws_t", AccountID: "acct_x", AllowedDomains: []string{"allowed.sg.test"}}
	store := &liveSet{ws: map[string]egress.Workspace{"ws_a": wsA, "ws_b": wsB, "ws_t": wsT},
		live: map[string]bool{"ws_a": true, "ws_b": true}}

	// The gateway that created the workspaces.
	creator := newEnv(t, func(c *egress.Config) { c.CredentialKey = key })
	credA, credB, credT := creator.register(t, wsA), creator.register(t, wsB), creator.register(t, wsT)
	credC := creator.register(t, egress.Workspace{ID: "ws_c", AllowedDomains: []string{"allowed.sg.test"}}) // not in the store
	// Another gateway of the same store: it registered nothing.
	other := newEnv(t, func(c *egress.Config) {
		c.CredentialKey, c.Lookup, c.LookupTTL = key, store.lookup, time.Nanosecond // every request asks
	})
	addr := other.serveShared(t)
	// A gateway with another key.
	stranger := newEnv(t, func(c *egress.Config) { c.CredentialKey = []byte("another key, another store......") })
	credStranger := stranger.register(t, egress.Workspace{ID: "ws_a", AllowedDomains: []string{"allowed.sg.test"}})

	tp := strconv.Itoa(int(other.tlsPort))
	tests := []connectCase{
		{"live workspace", "allowed.sg.test:" + tp, basic("ws_a", credA), 200},
		{"live workspace, other's domain", "a.sg.test:" + tp, basic("ws_a", credA), 403},
		{"other live workspace", "a.sg.test:" + tp, basic("ws_b", credB), 200},
		{"terminated workspace", "allowed.sg.test:" + tp, basic("ws_t", credT), 407},
		{"a's credential under b's id", "a.sg.test:" + tp, basic("ws_b", credA), 407},
		{"a's credential under an unknown id", "allowed.sg.test:" + tp, basic("ws_c", credA), 407},
		{"unknown id, its own derived credential", "allowed.sg.test:" + tp, basic("ws_c", credC), 407},
		{"credential of another key", "allowed.sg.test:" + tp, basic("ws_a", credStranger), 407},
		{"truncated credential", "allowed.sg.test:" + tp, basic("ws_a", credA[:len(credA)-1]), 407},
	}
	wantConnects(t, addr, tests)
	if page, code, err := fetchTLS(t, addr, "allowed.sg.test:"+tp, "allowed.sg.test", basic("ws_a", credA)); err != nil || !strings.Contains(page, "tls page for allowed.sg.test") {
		t.Errorf("fetch through the other gateway = %q, %d, %v; want the page", page, code, err)
	}
	if u := other.proxy.Usage("ws_a"); u.BytesIn == 0 {
		t.Errorf("other gateway's Usage(ws_a) = %+v; want the bytes it moved counted there", u)
	}

	// Ended elsewhere: refused once the store says so.
	store.set("ws_a", false)
	if code, _ := connect(t, addr, "allowed.sg.test:"+tp, basic("ws_a", credA)); code != http.StatusProxyAuthRequired {
		t.Errorf("CONNECT after ws_a ended = %d; want 407", code)
	}
	// The store out of reach: refused, not as a wrong credential.
	store.mu.Lock()
	store.err = errors.New("redis down")
	store.mu.Unlock()
	if code, _ := connect(t, addr, "a.sg.test:"+tp, basic("ws_b", credB)); code != http.StatusServiceUnavailable {
		t.Errorf("CONNECT with the store out of reach = %d; want 503", code)
	}
}

// TestDerivedCredentialsCached: Lookup's answer is reused for LookupTTL,
// and Unregister refuses at once what the cache still holds live.
func TestDerivedCredentialsCached(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	wsA := egress.Workspace{ID: "ws_a", AccountID: "acct_x", AllowedDomains: []string{"allowed.sg.test"}}
	store := &liveSet{ws: map[string]egress.Workspace{"ws_a": wsA}, live: map[string]bool{"ws_a": true}}
	e := newEnv(t, func(c *egress.Config) { c.CredentialKey, c.Lookup, c.LookupTTL = key, store.lookup, time.Hour })
	addr := e.serveShared(t)
	other := newEnv(t, func(c *egress.Config) { c.CredentialKey = key })
	cred := other.register(t, wsA)
	tp := strconv.Itoa(int(e.tlsPort))
	for i := range 3 {
		if code, _ := connect(t, addr, "allowed.sg.test:"+tp, basic("ws_a", cred)); code != 200 {
			t.Fatalf("CONNECT %d = %d; want 200", i, code)
		}
	}
	store.mu.Lock()
	calls := store.calls
	store.mu.Unlock()
	if calls != 1 {
		t.Errorf("Lookup called %d times for 3 requests within LookupTTL; want 1", calls)
	}
	e.proxy.Unregister("ws_a")
	if code, _ := connect(t, addr, "allowed.sg.test:"+tp, basic("ws_a", cred)); code != http.StatusProxyAuthRequired {
		t.Errorf("CONNECT after Unregister = %d; want 407", code)
	}
}

// TestCredentialKeyConfig: a short key, or a lookup without a key, is
// refused.
func TestCredentialKeyConfig(t *testing.T) {
	lookup := func(context.Context, string) (egress.Workspace, bool, error) { return egress.Workspace{}, false, nil }
	for name, cfg := range map[string]egress.Config{
		"short key":          {CredentialKey: []byte("short")},
		"lookup without key": {Lookup: lookup},
	} {
		if _, err := egress.New(cfg, egress.Deps{}); err == nil {
			t.Errorf("New(%s) = nil error; want one", name)
		}
	}
}
