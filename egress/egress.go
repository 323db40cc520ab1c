// Package egress is the broker's domain-allowlist egress proxy: HTTP
// CONNECT and plain-HTTP forwarding to the domains and ports a workspace
// was admitted with, and nothing else. docs/egress.md has the threat model.
package egress

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"time"
)

// Config configures a [Proxy]. A zero field means the default noted beside it.
type Config struct {
	// Ports are the destination ports a workspace may reach; nil means
	// 80 and 443.
	Ports []uint16
	// Hosts are the operator's static hosts (on-premises mirrors, tests):
	// these names are looked up here and nowhere else, and their addresses
	// are exempt from the private-address refusal.
	Hosts map[string]netip.Addr
	// MaxConnsPerWorkspace bounds the open connections of one workspace;
	// 0 means 64.
	MaxConnsPerWorkspace int
	// IdleTimeout closes a connection that moved no byte for this long; 0
	// means 5 minutes.
	IdleTimeout time.Duration
	// Logger logs denied destinations (host and port, never a path, header
	// or body); nil means discard.
	Logger *slog.Logger
	// Resolver looks up the names not in Hosts; nil means net.DefaultResolver.
	Resolver interface {
		LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
	}
	// Dial connects to the checked address; nil means a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Workspace is what the proxy knows of one workspace.
type Workspace struct {
	// ID is the workspace id, for counters and logs.
	ID string
	// AllowedDomains are the admitted domains in the protocol's grammar;
	// nil or empty reaches nothing.
	AllowedDomains []string
}

// Usage is the bytes a workspace moved through the proxy.
type Usage struct {
	BytesOut int64 // sandbox -> destination
	BytesIn  int64 // destination -> sandbox
}

// Proxy is the egress proxy. Its methods are safe for concurrent use.
type Proxy struct {
	cfg Config
}

// New returns a proxy for cfg.
func New(cfg Config) (*Proxy, error) {
	return &Proxy{cfg: cfg}, nil
}

// Serve answers proxy requests on l, every one attributed to ws (the local
// provider: a listener per workspace). It returns when l is closed or ctx
// is done.
func (p *Proxy) Serve(ctx context.Context, l net.Listener, ws Workspace) error {
	return errors.New("egress: not implemented")
}

// Register lets ws use the shared listener of [Proxy.ServeShared] and
// returns its credential: the password of Proxy-Authorization Basic with
// the workspace id as user.
func (p *Proxy) Register(ws Workspace) (credential string, err error) {
	return "", errors.New("egress: not implemented")
}

// Unregister revokes the credential of workspace id.
func (p *Proxy) Unregister(id string) {}

// ServeShared answers proxy requests on l, each attributed to the
// workspace its Proxy-Authorization names (credential mode, for remote
// vendors). It returns when l is closed or ctx is done.
func (p *Proxy) ServeShared(ctx context.Context, l net.Listener) error {
	return errors.New("egress: not implemented")
}

// Usage returns the bytes workspace id moved so far.
func (p *Proxy) Usage(id string) Usage { return Usage{} }

// Forget returns the final count of workspace id and drops its counters.
func (p *Proxy) Forget(id string) Usage { return Usage{} }
