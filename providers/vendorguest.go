package providers

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"time"

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

// Paths of the agent and its files in a vendor guest. The directory is
// root's (mode 0700), and every jail mounts an empty tmpfs over it, so
// nothing in it is visible to the tenant; the broker's own scratch
// directories (exec and durable commands) live under it for the same
// reason.
const (
	GuestDir        = "/.sandgate"
	GuestAgent      = GuestDir + "/" + GuestBinaryName
	GuestCredFile   = GuestDir + "/egress.cred" // mode 0600: the workspace's proxy credential
	GuestCAFile     = GuestDir + "/egress.ca"   // PEM: the CA of the proxy's certificate
	GuestEgressSock = GuestDir + "/egress.sock" // the keeper's forwarder
	GuestExecDir    = GuestDir + "/x"           // direct execs' scratch
	GuestCommandDir = GuestDir + "/cmd"         // durable commands (package runner)
)

// GuestRunArgv is the argv that runs argv in a fresh jail of the agent:
// in dir ("" the jail's default), with env as the tenant's whole
// environment besides PATH, HOME and the proxy variables, and with egress
// through the keeper's forwarder when egress is set (else only loopback).
func GuestRunArgv(env map[string]string, dir string, egress bool, argv []string) []string {
	out := []string{GuestAgent, "run"}
	if dir != "" {
		out = append(out, "--dir", dir)
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		out = append(out, "--env", k+"="+env[k])
	}
	if egress {
		out = append(out, "--egress-sock", GuestEgressSock)
	}
	out = append(out, "--")
	return append(out, argv...)
}

// GuestKeeperArgv is the argv of the guest's lifetime keeper: it ends
// every jail at until (rounded up to the second: never before it) and,
// for a workspace wsID with egress (ve not nil), serves the forwarder to
// ve with the credential in GuestCredFile.
func GuestKeeperArgv(until time.Time, ve *VendorEgress, wsID string, detach bool) []string {
	unix := until.Unix()
	if until.Nanosecond() > 0 {
		unix++
	}
	out := []string{GuestAgent, "keeper", "--until", strconv.FormatInt(unix, 10)}
	if detach {
		out = append(out, "--detach")
	}
	if ve != nil {
		out = append(out, "--egress-sock", GuestEgressSock, "--egress-proxy", ve.Addr, "--egress-server-name", ve.ServerName,
			"--egress-user", wsID, "--egress-cred-file", GuestCredFile)
		if len(ve.CA) > 0 {
			out = append(out, "--egress-ca", GuestCAFile)
		}
	}
	return out
}

// GuestKeeperStatusArgv asks the agent, as root outside every jail,
// whether the guest's lifetime keeper is alive: it exits 0 when it is
// and GuestKeeperGone when it is not (or the deadline has passed).
func GuestKeeperStatusArgv() []string { return []string{GuestAgent, "keeper-status"} }

// Exit statuses of the agent that the broker reads.
const (
	// GuestJailFailure: `run` could not start a jail (a dead keeper
	// among the causes); a tenant's command may exit so too.
	GuestJailFailure = 125
	// GuestKeeperGone: keeper-status found the guest's keeper gone or
	// its deadline passed (guest.ExitKeeperGone).
	GuestKeeperGone = 3
)

// GuestEgress reports whether a keeper's argv (GuestKeeperArgv) serves
// the forwarder: a workspace whose jails get egress.
func GuestEgress(keeper []string) bool { return slices.Contains(keeper, "--egress-sock") }

// RegisterVendorEgress registers the workspace of spec with ve's proxy
// when it has domains to reach, and returns its credential and the undo
// of the registration, for a create that fails after it; "" (and no
// registration, an undo that does nothing) for an empty allowlist. A
// non-empty allowlist without ve is an error: the provider then offers []
// only.
func RegisterVendorEgress(ve *VendorEgress, spec CreateSpec) (cred string, unregister func(), err error) {
	if len(spec.Egress.AllowedDomains) == 0 {
		return "", func() {}, nil
	}
	if ve == nil {
		return "", nil, errors.New("cannot reach domains: the broker's egress proxy is not served to vendor guests (egress.vendor_listen)")
	}
	cred, err = ve.Proxy.Register(egress.Workspace{ID: spec.WorkspaceID, AccountID: spec.AccountID, AllowedDomains: spec.Egress.AllowedDomains})
	if err != nil {
		return "", nil, err
	}
	return cred, func() { ve.Proxy.Unregister(spec.WorkspaceID) }, nil
}

// EgressMode is the egress a vendor provider over ve offers: domain
// allowlists through the proxy, or [] only when guests cannot reach it.
func (ve *VendorEgress) EgressMode() EgressMode {
	if ve == nil {
		return EgressNoneOnly
	}
	return EgressProxy
}
