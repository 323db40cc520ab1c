// Package egresstest holds test helpers of the egress proxy's tests: a TLS
// site on the host's loopback that the proxy is told (egress.hosts) to
// reach under test names.
package egresstest

import (
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/testpki"
)

// Site is a TLS server on the host's loopback.
type Site struct {
	Port  int    // its TCP port on 127.0.0.1
	CAPEM []byte // the certificate, in PEM, of the CA that signed its own
}

// StartSite starts a TLS server on the host's loopback whose certificate,
// signed by a CA of its own, names every one of names. A request whose path
// starts with a key of routes goes to that handler; any other is answered
// "hello HOST\n", HOST the request's host without its port. It stops at
// the end of the test.
func StartSite(t testing.TB, names []string, routes map[string]http.Handler) Site {
	t.Helper()
	pki := testpki.Issue(t, "sandgate egress test CA", names, nil)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for prefix, h := range routes {
			if strings.HasPrefix(r.URL.Path, prefix) {
				h.ServeHTTP(w, r)
				return
			}
		}
		host := r.Host
		if h, _, err := net.SplitHostPort(r.Host); err == nil {
			host = h
		}
		fmt.Fprintf(w, "hello %s\n", host)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshakes the tests make fail on purpose
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{pki.LeafDER}, PrivateKey: pki.Key}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return Site{
		Port:  srv.Listener.Addr().(*net.TCPAddr).Port,
		CAPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pki.CADER}),
	}
}
