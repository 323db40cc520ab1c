package egresstest

import (
	"context"
	"crypto/tls"
	"net"
	"testing"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/internal/testpki"
)

// ServeVendor serves proxy in credential mode over TLS with pki's leaf on
// a loopback port, as the broker's vendor listener does, until the test
// ends, and returns the listener's address.
func ServeVendor(t testing.TB, proxy *egress.Proxy, pki testpki.Issued) net.Addr {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{pki.LeafDER}, PrivateKey: pki.Key}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		proxy.ServeShared(ctx, ln)
		close(served)
	}()
	t.Cleanup(func() { cancel(); ln.Close(); <-served })
	return ln.Addr()
}
