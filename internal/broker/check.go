package broker

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
)

// Check validates what `serve` would refuse at startup and needs no
// network: the defaults against the sizes, the operators' tokens, the TLS
// files and the pair's match, the Redis CA file, and every provider's
// settings, decoded strictly by its kind, with the environment variables
// the kind requires. LoadConfig has already checked the rest. It returns
// every problem found, joined, each naming its YAML path.
func (c *Config) Check(getenv func(string) string) error {
	var errs []error
	if _, err := c.OperatorTokens(getenv); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.ServeTLS(); err != nil {
		errs = append(errs, err)
	}
	if !IsLoopback(c.AdminListen) {
		errs = append(errs, fmt.Errorf("config: admin_listen %q is not a loopback address; the operator API serves plain HTTP and must stay on loopback", c.AdminListen))
	}
	if _, err := c.trustedProxies(); err != nil {
		errs = append(errs, err)
	}
	if f := c.Redis.TLS.CAFile; f != "" {
		if err := readablePEM(f); err != nil {
			errs = append(errs, fmt.Errorf("config: redis.tls.ca_file: %w", err))
		}
	}
	if f := c.Egress.VendorCAFile; f != "" {
		if err := readablePEM(f); err != nil {
			errs = append(errs, fmt.Errorf("config: egress.vendor_ca_file: %w", err))
		}
	}
	if c.Egress.VendorListen != "" && c.TLS.CertFile == "" {
		errs = append(errs, errors.New("config: egress.vendor_listen serves TLS: set tls.cert_file and tls.key_file"))
	}
	if slices.ContainsFunc(c.providers, func(pc providers.Config) bool { return VendorKind(pc.Kind) }) {
		if _, err := providers.ReadGuestBinary(c.guestBinary()); err != nil {
			errs = append(errs, fmt.Errorf("config: guest_binary: %w", err))
		}
	}
	for i, pc := range c.providers {
		if err := checkProvider(pc, getenv); err != nil {
			path := fmt.Sprintf("providers[%d] (%s)", i, pc.Name)
			if len(c.Providers) == 0 {
				path = "provider"
			}
			errs = append(errs, fmt.Errorf("config: %s: %w", path, err))
		}
	}
	return errors.Join(errs...)
}

// ServeTLS returns the public listener's TLS from tls.cert_file and
// tls.key_file, or nil behind tls.trusted_proxies; it refuses a half pair,
// an unreadable file, a key that does not match its certificate, and a
// config with neither TLS nor a trusted proxy.
func (c *Config) ServeTLS() (*tls.Config, error) {
	switch {
	case c.TLS.CertFile != "" && c.TLS.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(c.TLS.CertFile, c.TLS.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("config: tls.cert_file and tls.key_file: %w", err)
		}
		return ServerTLS(cert), nil
	case c.TLS.CertFile != "" || c.TLS.KeyFile != "":
		return nil, errors.New("config: tls: set both cert_file and key_file")
	case len(c.TLS.TrustedProxies) == 0:
		return nil, errors.New("sandgate refuses plaintext: set tls.cert_file and tls.key_file, or tls.trusted_proxies for a TLS-terminating proxy")
	}
	return nil, nil
}

// readablePEM fails unless path is a readable file of PEM certificates.
func readablePEM(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !x509.NewCertPool().AppendCertsFromPEM(b) {
		return fmt.Errorf("%s holds no PEM certificate", path)
	}
	return nil
}

// checkDefaults refuses defaults that name a size sandgate does not know,
// or a default size outside the allowed ones.
func (c *Config) checkDefaults() error {
	known := sizeNames(sandgate.StandardSizes)
	for i, s := range c.Defaults.Sizes {
		if _, ok := sandgate.LookupSize(s); !ok {
			return fmt.Errorf("config: defaults.sizes[%d]: %q is not a size; allowed: %s", i, s, known)
		}
	}
	if d := c.Defaults.DefaultSize; d != "" {
		if _, ok := sandgate.LookupSize(d); !ok {
			return fmt.Errorf("config: defaults.default_size: %q is not a size; allowed: %s", d, known)
		}
		allowed := sandgate.Scope{Sizes: c.Defaults.Sizes}.AllowedSizes()
		if !strings.Contains(", "+sizeNames(allowed)+",", ", "+d+",") {
			return fmt.Errorf("config: defaults.default_size: %q is not among defaults.sizes; allowed: %s", d, sizeNames(allowed))
		}
	}
	return nil
}

func sizeNames(sizes []sandgate.Size) string {
	var names []string
	for _, s := range sizes {
		names = append(names, s.Name)
	}
	return strings.Join(names, ", ")
}

// yamlMessages are the YAML decoder's messages that name Go types,
// rewritten for an operator: "field x not found in type broker.Config" and
// "cannot unmarshal !!str `abc` into time.Duration".
var (
	yamlLine     = regexp.MustCompile(`^line (\d+): (.*)$`)
	yamlUnknown  = regexp.MustCompile(`^field (\S+) not found in type .*$`)
	yamlMismatch = regexp.MustCompile("^cannot unmarshal !!(\\w+) `(.*)` into (\\S+)$")
)

// yamlError rewrites a decode error of the config's root node so that
// each message names the YAML path of its line and no Go type.
func yamlError(root *yaml.Node, err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	paths := map[int]string{}
	if root != nil {
		linePaths(root, "", paths)
	}
	var msgs []string
	for _, m := range te.Errors {
		line, rest := 0, m
		if sm := yamlLine.FindStringSubmatch(m); sm != nil {
			line, _ = strconv.Atoi(sm[1])
			rest = sm[2]
		}
		path := paths[line]
		switch {
		case yamlUnknown.MatchString(rest):
			k := yamlUnknown.FindStringSubmatch(rest)[1]
			rest = fmt.Sprintf("unknown key %q", k)
		case yamlMismatch.MatchString(rest):
			sm := yamlMismatch.FindStringSubmatch(rest)
			rest = fmt.Sprintf("%q is not a valid %s", sm[2], goTypeWord(sm[3]))
		}
		if path != "" {
			rest = path + ": " + rest
		}
		if root != nil {
			rest = fmt.Sprintf("line %d: %s", line, rest)
		}
		msgs = append(msgs, rest)
	}
	return errors.New(strings.Join(msgs, "; "))
}

// goTypeWord names a Go type of the decoder's messages in config words.
func goTypeWord(t string) string {
	switch {
	case t == "time.Duration":
		return "duration (Go syntax: 30s, 2m)"
	case strings.HasPrefix(t, "[]"):
		return "list"
	case strings.HasPrefix(t, "map[") || strings.HasPrefix(t, "struct") || strings.Contains(t, "."):
		return "mapping"
	case strings.HasPrefix(t, "int") || strings.HasPrefix(t, "uint"):
		return "integer"
	case strings.HasPrefix(t, "float"):
		return "number"
	case t == "bool":
		return "boolean"
	}
	return "value"
}

// linePaths records the YAML path of every key and value line under n.
func linePaths(n *yaml.Node, path string, out map[int]string) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			linePaths(c, path, out)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			out[k.Line] = p
			if v.Kind == yaml.ScalarNode {
				out[v.Line] = p
			}
			linePaths(v, p, out)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			if _, ok := out[c.Line]; !ok || c.Kind == yaml.ScalarNode {
				out[c.Line] = p
			}
			linePaths(c, p, out)
		}
	}
}
