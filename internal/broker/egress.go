package broker

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/metric"
	"go.yaml.in/yaml/v3"

	"github.com/sandgate/sandgate/egress"
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
