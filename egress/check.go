package egress

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/sandgate/sandgate/policy"
)

// refused are the destination addresses no workspace reaches, beyond what
// netip's predicates catch (loopback, private, link-local, multicast,
// unspecified): a name that resolves into them is refused unless it is
// one of Config.Hosts.
var refused = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),          // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),      // CGNAT (and Alibaba's metadata 100.100.100.200)
	netip.MustParsePrefix("169.254.0.0/16"),     // link-local, cloud metadata 169.254.169.254
	netip.MustParsePrefix("192.0.0.0/24"),       // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),       // documentation
	netip.MustParsePrefix("198.18.0.0/15"),      // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"),    // documentation
	netip.MustParsePrefix("203.0.113.0/24"),     // documentation
	netip.MustParsePrefix("240.0.0.0/4"),        // reserved, and broadcast 255.255.255.255
	netip.MustParsePrefix("64:ff9b:1::/48"),     // local-use NAT64
	netip.MustParsePrefix("100::/64"),           // discard-only
	netip.MustParsePrefix("2001:db8::/32"),      // documentation
	netip.MustParsePrefix("fc00::/7"),           // unique local, cloud metadata fd00:ec2::254
	netip.MustParsePrefix("fec0::/10"),          // site-local (deprecated)
	netip.MustParsePrefix("fd00:ec2::254/128"),  // AWS metadata (inside fc00::/7; named for the reader)
	netip.MustParsePrefix("169.254.169.254/32"), // cloud metadata (inside 169.254/16; named for the reader)
}

// nat64 is the well-known NAT64 prefix: its addresses carry an IPv4
// address in their last 32 bits, which is checked in turn.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// Public reports whether a is an address a workspace may reach through a
// name outside Config.Hosts: a global unicast address outside every
// special-purpose range (an IPv4-mapped IPv6 address is judged as its
// IPv4 address, a NAT64 one as the IPv4 address it embeds).
func Public(a netip.Addr) bool {
	a = a.Unmap()
	if a.Zone() != "" {
		return false
	}
	if nat64.Contains(a) {
		b := a.As16()
		return Public(netip.AddrFrom4([4]byte(b[12:])))
	}
	if !a.IsGlobalUnicast() || a.IsPrivate() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsUnspecified() {
		return false
	}
	for _, p := range refused {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// denial is a refused proxy request: the reason (AttrReason) and the
// status the sandbox gets.
type denial struct {
	reason string
	status int
}

func (d *denial) Error() string { return "egress: refused: " + d.reason }

func deny(reason string, status int) *denial { return &denial{reason: reason, status: status} }

// target is a checked destination.
type target struct {
	host  string           // the name, lowercase, no trailing dot
	port  uint16           //
	addrs []netip.AddrPort // what may be dialled, in order
}

// parseHostPort splits a CONNECT authority or a URL's host into a
// lowercase name and a port (defaultPort when it has none and
// defaultPort is not 0).
func parseHostPort(hostport string, defaultPort uint16) (host string, port uint16, d *denial) {
	h, ps, err := net.SplitHostPort(hostport)
	if err != nil {
		if defaultPort == 0 {
			return "", 0, deny(ReasonBadRequest, 400)
		}
		h, ps = hostport, strconv.Itoa(int(defaultPort))
		h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	}
	n, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || n == 0 {
		return "", 0, deny(ReasonBadRequest, 400)
	}
	return strings.TrimSuffix(strings.ToLower(h), "."), uint16(n), nil
}

// check decides whether ws may reach host:port and, when it may, resolves
// the name: to its entry of Config.Hosts alone when it has one, else
// through the resolver, keeping only public addresses. The caller dials
// exactly these addresses, so no second lookup can move the name
// elsewhere (rebinding).
func (p *Proxy) check(ctx context.Context, ws Workspace, host string, port uint16) (target, *denial) {
	if _, err := netip.ParseAddr(host); err == nil || strings.Contains(host, "%") {
		return target{}, deny(ReasonIPLiteral, 403)
	}
	if _, err := policy.ParseDomain(host); err != nil || strings.HasPrefix(host, "*") {
		// Not a host name of the grammar (a bare label, a number, …): no
		// allowed domain can match it.
		return target{}, deny(ReasonDomain, 403)
	}
	if !ws.Allows(host) {
		return target{}, deny(ReasonDomain, 403)
	}
	if !p.ports[port] {
		return target{}, deny(ReasonPort, 403)
	}
	t := target{host: host, port: port}
	if a, ok := p.cfg.Hosts[host]; ok {
		t.addrs = []netip.AddrPort{netip.AddrPortFrom(a.Unmap(), port)}
		return t, nil
	}
	rctx, cancel := context.WithTimeout(ctx, p.cfg.DialTimeout)
	defer cancel()
	addrs, err := p.cfg.Resolver.LookupNetIP(rctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return target{}, deny(ReasonResolve, 502)
	}
	for _, a := range addrs {
		if Public(a) {
			t.addrs = append(t.addrs, netip.AddrPortFrom(a.Unmap(), port))
		}
	}
	if len(t.addrs) == 0 {
		return target{}, deny(ReasonAddress, 403)
	}
	return t, nil
}

// dial connects to the first of t's addresses that answers.
func (p *Proxy) dial(ctx context.Context, t target) (net.Conn, *denial) {
	dctx, cancel := context.WithTimeout(ctx, p.cfg.DialTimeout)
	defer cancel()
	for _, a := range t.addrs {
		c, err := p.cfg.Dial(dctx, "tcp", a.String())
		if err == nil {
			return c, nil
		}
		if dctx.Err() != nil {
			break
		}
	}
	return nil, deny(ReasonUnreached, 502)
}

// namesHost reports whether host names a destination: an IP address or a
// host name of the allowlists' grammar. Anything else is only text the
// sandbox sent, which the log does not repeat.
func namesHost(host string) bool {
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Zone() == ""
	}
	_, err := policy.ParseDomain(host)
	return err == nil && !strings.HasPrefix(host, "*")
}
