package broker

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/metric"
	"go.yaml.in/yaml/v3"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/store"
)

// egressPorts is egress.ports: a YAML list of ports, or (as
// SANDGATE_EGRESS_PORTS) one comma-separated scalar, "80,443".
type egressPorts []uint16

// UnmarshalYAML accepts a list of ports or a comma-separated scalar.
func (p *egressPorts) UnmarshalYAML(n *yaml.Node) error {
	var items []string
	switch n.Kind {
	case yaml.SequenceNode:
		for _, c := range n.Content {
			items = append(items, c.Value)
		}
	case yaml.ScalarNode:
		for s := range strings.SplitSeq(n.Value, ",") {
			items = append(items, strings.TrimSpace(s))
		}
	default:
		return fmt.Errorf("want a list of ports")
	}
	out := egressPorts{}
	for _, s := range items {
		v, err := strconv.ParseUint(s, 10, 16)
		if err != nil || v == 0 {
			return fmt.Errorf("%q is not a port (1 to 65535)", s)
		}
		out = append(out, uint16(v))
	}
	*p = out
	return nil
}

// envSyntax is how the README and override errors describe it.
func (egressPorts) envSyntax() string { return "list of ports (80,443 or a YAML list)" }

// egressHosts is egress.hosts: a YAML mapping of name to IP address, or
// (as SANDGATE_EGRESS_HOSTS) one scalar "name=ip,name=ip".
type egressHosts map[string]string

// UnmarshalYAML accepts a mapping or a name=ip,name=ip scalar.
func (h *egressHosts) UnmarshalYAML(n *yaml.Node) error {
	out := egressHosts{}
	switch n.Kind {
	case yaml.MappingNode:
		var m map[string]string
		if err := n.Decode(&m); err != nil {
			return err
		}
		for k, v := range m {
			out[k] = v
		}
	case yaml.ScalarNode:
		for pair := range strings.SplitSeq(n.Value, ",") {
			name, ip, ok := strings.Cut(strings.TrimSpace(pair), "=")
			if !ok || name == "" || ip == "" {
				return fmt.Errorf("want name=ip pairs separated by commas")
			}
			out[name] = ip
		}
	default:
		return fmt.Errorf("want a mapping of name to IP address")
	}
	*h = out
	return nil
}

func (egressHosts) envSyntax() string {
	return "mapping of name to IP address (name=ip,name=ip or a YAML mapping)"
}

// egressConfig is the proxy's config from egress: ports and hosts, with
// meter (nil in validation). Errors name the field and the entry.
func (c *Config) egressConfig(meter metric.Meter) (egress.Config, error) {
	ec := egress.Config{Meter: meter}
	if c.Egress.Ports != nil {
		ec.Ports = slices.Clone([]uint16(c.Egress.Ports))
	}
	if len(c.Egress.Hosts) > 0 {
		ec.Hosts = map[string]netip.Addr{}
		for name, ip := range c.Egress.Hosts {
			a, err := netip.ParseAddr(ip)
			if err != nil || a.Zone() != "" {
				return egress.Config{}, fmt.Errorf("config: egress.hosts: %s: %q is not an IP address", name, ip)
			}
			ec.Hosts[name] = a
		}
	}
	if err := ec.Validate(); err != nil {
		return egress.Config{}, fmt.Errorf("config: egress: %w", err)
	}
	return ec, nil
}

// checkVendorEgress checks egress.vendor_listen and egress.vendor_url:
// both or neither, an address to listen on, and an https://HOST:PORT URL.
func (c *Config) checkVendorEgress() error {
	e := c.Egress
	switch {
	case e.VendorListen == "" && e.VendorURL == "":
		if e.VendorCAFile != "" {
			return errors.New("config: egress.vendor_ca_file is set without egress.vendor_listen")
		}
		return nil
	case e.VendorListen == "":
		return errors.New("config: egress.vendor_url is set without egress.vendor_listen")
	case e.VendorURL == "":
		return errors.New("config: egress.vendor_listen is set without egress.vendor_url, the https://HOST:PORT guests reach it at")
	}
	if _, _, err := net.SplitHostPort(e.VendorListen); err != nil {
		return fmt.Errorf("config: egress.vendor_listen: %q is not HOST:PORT", e.VendorListen)
	}
	if _, err := providers.NewVendorEgress(e.VendorURL, nil, noRegistry{}); err != nil {
		return fmt.Errorf("config: egress.vendor_url: %w", err)
	}
	return nil
}

// noRegistry stands for the proxy where a config is only checked.
type noRegistry struct{}

func (noRegistry) Register(egress.Workspace) (string, error) { return "", errors.New("no proxy") }
func (noRegistry) Unregister(string)                         {}

// vendorEgress opens the vendor guests' listener of egress.vendor_listen
// and returns it with what the providers need to reach it; nil, nil when
// none is configured. An empty egress.vendor_url (sandgate dev) means the
// listener's own address. The listener serves TLS with tlsCfg.
func (c *Config) vendorEgress(tlsCfg *tls.Config, reg providers.EgressRegistry) (net.Listener, *providers.VendorEgress, error) {
	e := c.Egress
	if e.VendorListen == "" {
		return nil, nil, nil
	}
	if tlsCfg == nil {
		return nil, nil, errors.New("config: egress.vendor_listen serves TLS: set tls.cert_file and tls.key_file")
	}
	var ca []byte
	if e.VendorCAFile != "" {
		var err error
		if ca, err = os.ReadFile(e.VendorCAFile); err != nil {
			return nil, nil, fmt.Errorf("config: egress.vendor_ca_file: %w", err)
		}
	}
	ln, err := net.Listen("tcp", e.VendorListen)
	if err != nil {
		return nil, nil, fmt.Errorf("egress.vendor_listen: %w", err)
	}
	u := cmp.Or(e.VendorURL, "https://"+ln.Addr().String())
	ve, err := providers.NewVendorEgress(u, ca, reg)
	if err != nil {
		ln.Close()
		return nil, nil, fmt.Errorf("config: egress.vendor_url: %w", err)
	}
	return ln, ve, nil
}

// guestBinary is the path of the sandgate-guest agent: guest_binary, or
// sandgate-guest beside the running executable.
func (c *Config) guestBinary() string {
	if c.GuestBinary != "" {
		return c.GuestBinary
	}
	exe, err := os.Executable()
	if err != nil {
		return providers.GuestBinaryName // Open then names it as missing
	}
	return filepath.Join(filepath.Dir(exe), providers.GuestBinaryName)
}

// vendorCredentials returns the store's egress credential key and the
// proxy's lookup of workspaces registered by another gateway (or by this
// one before a restart): only a live workspace (starting or running) of
// db is served, with the allowed_domains of its record.
func vendorCredentials(ctx context.Context, db *store.DB) ([]byte, func(context.Context, string) (egress.Workspace, bool, error), error) {
	key, err := db.EgressKey(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("egress.vendor_listen needs the store's credential key: %w", err)
	}
	lookup := func(ctx context.Context, id string) (egress.Workspace, bool, error) {
		w, err := db.FindWorkspace(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return egress.Workspace{}, false, nil
		}
		if err != nil {
			return egress.Workspace{}, false, err
		}
		live := w.State == sandgate.WorkspaceStarting || w.State == sandgate.WorkspaceRunning
		return egress.Workspace{ID: w.ID, AccountID: w.AccountID, AllowedDomains: w.AllowedDomains()}, live, nil
	}
	return key, lookup, nil
}
