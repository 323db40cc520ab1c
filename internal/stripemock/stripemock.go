// Package stripemock builds and reaches stripe-mock, Stripe's mock server
// (a tool dependency in go.mod), for tests: no network, only the go
// command and the module cache.
package stripemock

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"os/exec"
	"path/filepath"
)

// Build builds stripe-mock into dir and returns the binary's path.
func Build(dir string) (string, error) {
	bin := filepath.Join(dir, "stripe-mock")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/stripe/stripe-mock").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build stripe-mock: %v\n%s", err, out)
	}
	return bin, nil
}

// Proxy returns a reverse proxy to the stripe-mock listening on the unix
// socket sock.
func Proxy(sock string) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.Out.URL.Scheme, r.Out.URL.Host = "http", "stripe-mock" },
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}},
	}
}
