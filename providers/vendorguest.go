package providers

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"

	"github.com/sandgate/sandgate/egress"
)

// VendorEgress is the broker's egress proxy as guests on a vendor reach
// it: credential mode ([egress.Proxy.ServeShared]) over TLS on
// egress.vendor_listen (docs/egress.md). A vendor provider registers each
// workspace at create, delivers its credential into the guest, and
// unregisters it at terminate.
type VendorEgress struct {
	// Addr is the host:port guests dial (egress.vendor_url).
	Addr string
	// ServerName is the name guests check the listener's certificate for.
	ServerName string
	// CA is the PEM of the CA that signs the listener's certificate; nil
	// means the guest's system roots.
	CA []byte
	// Proxy registers and unregisters workspaces with the proxy.
	Proxy EgressRegistry
}

// EgressRegistry is the part of [egress.Proxy] a vendor provider uses.
type EgressRegistry interface {
	Register(ws egress.Workspace) (credential string, err error)
	Unregister(id string)
}

// NewVendorEgress returns the VendorEgress of the proxy URL rawURL
// (https://host:port), its CA's PEM (nil: system roots) and reg.
func NewVendorEgress(rawURL string, ca []byte, reg EgressRegistry) (*VendorEgress, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") || u.User != nil || u.RawQuery != "" {
		return nil, errors.New("the vendor egress URL must be https://HOST:PORT")
	}
	if reg == nil {
		return nil, errors.New("no egress proxy to register workspaces with")
	}
	return &VendorEgress{Addr: net.JoinHostPort(u.Hostname(), u.Port()), ServerName: u.Hostname(), CA: ca, Proxy: reg}, nil
}

// GuestBinaryName is the file name of the in-guest agent
// (cmd/sandgate-guest) that vendor providers deliver into every guest.
const GuestBinaryName = "sandgate-guest"

// ReadGuestBinary reads the agent at path for delivery into guests. A
// missing or unreadable file is an error naming the path: a vendor
// provider never runs a guest without its jail.
func ReadGuestBinary(path string) ([]byte, error) {
	if path == "" {
		return nil, errors.New("no path of the sandgate-guest agent (guest_binary)")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the sandgate-guest agent, which runs every command in the guest's jail, cannot be read at %s (build it with `go build ./cmd/sandgate-guest` and put it beside sandgate, or set guest_binary): %w", path, err)
	}
	if len(b) < 4 || string(b[:4]) != "\x7fELF" {
		return nil, fmt.Errorf("the sandgate-guest agent at %s is not an executable (ELF) file", path)
	}
	return b, nil
}
