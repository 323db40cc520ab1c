package guest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// TestForwarderDialsOnRequest: a jail's connection that sends nothing
// opens no connection to the broker's proxy; one that sends a request
// opens one.
func TestForwarderDialsOnRequest(t *testing.T) {
	var accepted atomic.Int32
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "proxied %s", r.URL)
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			accepted.Add(1)
		}
	}
	up.StartTLS()
	defer up.Close()
	f := &forwarder{addrs: []string{up.Listener.Addr().String()}, tls: up.Client().Transport.(*http.Transport).TLSClientConfig, auth: "Basic eDp5"}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go f.serve(ln)

	silent, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "GET http://site.sg.test/x HTTP/1.1\r\nHost: site.sg.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "proxied http://site.sg.test/x" {
		t.Errorf("answer %q", b)
	}
	if n := accepted.Load(); n != 1 {
		t.Errorf("the proxy saw %d connections; want 1 (the silent jail connection holds none)", n)
	}
}
