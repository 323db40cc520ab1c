package modal

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// A call still running when the provider closes (an exec past the
// broker's shutdown bound) must not dial a router connection that nothing
// would close.
func TestNoRouterDialAfterClose(t *testing.T) {
	conn, err := grpc.NewClient("passthrough:///control", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	p := &Provider{conn: conn, routers: map[string]*router{}, routerConns: map[string]*grpc.ClientConn{}}
	if _, err := p.routerConn("127.0.0.1:1"); err != nil {
		t.Fatalf("routerConn before Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	c, err := p.routerConn("127.0.0.1:1")
	if err == nil {
		c.Close()
		t.Fatal("routerConn after Close dialled a connection")
	}
	if n := len(p.routerConns); n != 0 {
		t.Errorf("%d router connections kept after Close; want none", n)
	}
}
