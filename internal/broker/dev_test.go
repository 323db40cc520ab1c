package broker

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDevConfigHonoursOverrides: `sandgate dev` reads the SANDGATE_*
// overrides serve reads (egress hosts and ports here, to try egress
// against a local mirror), while its own flags decide the providers.
func TestDevConfigHonoursOverrides(t *testing.T) {
	env := map[string]string{
		"SANDGATE_EGRESS_HOSTS": "mirror.sg.test=127.0.0.1",
		"SANDGATE_EGRESS_PORTS": "443,8443",
		"SANDGATE_PROVIDER":     "modal", // dev's --provider decides
	}
	cfg, err := DevConfig(t.TempDir(), "local", func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if got := []uint16(cfg.Egress.Ports); !slices.Equal(got, []uint16{443, 8443}) {
		t.Errorf("egress.ports = %v; want SANDGATE_EGRESS_PORTS", got)
	}
	ec, err := cfg.egressConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if a := ec.Hosts["mirror.sg.test"]; a != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("egress.hosts[mirror.sg.test] = %v; want SANDGATE_EGRESS_HOSTS", a)
	}
	if len(cfg.providers) != 1 || cfg.providers[0].Kind != "local" || cfg.DefaultProvider != "local" || cfg.BrokerID != "sandgate-dev" {
		t.Errorf("providers = %+v, default %q, broker id %q; want dev's own local provider", cfg.providers, cfg.DefaultProvider, cfg.BrokerID)
	}
	if cfg.Egress.VendorListen != "" || !cfg.DevAnyEgress("local") {
		t.Errorf("a local dev: vendor listener %q, any egress %v; want none, true", cfg.Egress.VendorListen, cfg.DevAnyEgress("local"))
	}
	if _, err := DevConfig(t.TempDir(), "local", func(k string) string {
		return map[string]string{"SANDGATE_EGRESS_PORTS": "0"}[k]
	}); err == nil || !strings.Contains(err.Error(), "SANDGATE_EGRESS_PORTS") {
		t.Errorf("a bad override: %v; want an error naming it", err)
	}
}

// TestDevConfigLocalSettings: SANDGATE_PROVIDER_LOCAL sets dev's local
// provider's settings (a warm pool, for sandgate-load -ttfc -pool), beside
// the allow_unenforced dev always sets.
func TestDevConfigLocalSettings(t *testing.T) {
	cfg, err := DevConfig(t.TempDir(), "local", func(k string) string {
		return map[string]string{"SANDGATE_PROVIDER_LOCAL": "{pool: {per: [{size: small, count: 2}]}}"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		AllowUnenforced bool `yaml:"allow_unenforced"`
		Pool            struct {
			Per []struct {
				Size  string `yaml:"size"`
				Count int    `yaml:"count"`
			} `yaml:"per"`
		} `yaml:"pool"`
	}
	if len(cfg.providers) != 1 {
		t.Fatalf("providers = %+v; want dev's local provider", cfg.providers)
	}
	if err := cfg.providers[0].Settings.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if !got.AllowUnenforced || len(got.Pool.Per) != 1 || got.Pool.Per[0].Size != "small" || got.Pool.Per[0].Count != 2 {
		t.Errorf("local settings = %+v; want allow_unenforced and the pool of SANDGATE_PROVIDER_LOCAL", got)
	}
	if cfg.Billing.PoolRateCard != "dev" {
		t.Errorf("billing.pool_rate_card = %q; want dev's rate card, dev", cfg.Billing.PoolRateCard)
	}
}

// TestDevConfigVendorListener: dev with a vendor kind serves the proxy to
// its guests on a loopback port it picks, so its lease's ceiling is null;
// an override names another address.
func TestDevConfigVendorListener(t *testing.T) {
	for _, kind := range []string{"fly-machines", "fly-sprites"} {
		cfg, err := DevConfig(t.TempDir(), kind, func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Egress.VendorListen != "127.0.0.1:0" || !cfg.DevAnyEgress(kind) {
			t.Errorf("%s: vendor listener %q, any egress %v; want a loopback port, true", kind, cfg.Egress.VendorListen, cfg.DevAnyEgress(kind))
		}
	}
	cfg, err := DevConfig(t.TempDir(), "modal", func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Egress.VendorListen != "" || cfg.DevAnyEgress("modal") {
		t.Errorf("modal: vendor listener %q, any egress %v; want none, false", cfg.Egress.VendorListen, cfg.DevAnyEgress("modal"))
	}
	env := map[string]string{"SANDGATE_EGRESS_VENDOR_LISTEN": "127.0.0.1:9", "SANDGATE_EGRESS_VENDOR_URL": "https://proxy.sg.test:9"}
	cfg, err = DevConfig(t.TempDir(), "fly-machines", func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Egress.VendorListen != "127.0.0.1:9" || cfg.Egress.VendorURL != "https://proxy.sg.test:9" {
		t.Errorf("vendor listener %q at %q; want the overrides", cfg.Egress.VendorListen, cfg.Egress.VendorURL)
	}
}

// TestVendorEgressConfig: egress.vendor_listen and vendor_url go
// together, and the URL is https://HOST:PORT.
func TestVendorEgressConfig(t *testing.T) {
	for _, tt := range []struct {
		env  map[string]string
		want string // "" = valid
	}{
		{map[string]string{"SANDGATE_EGRESS_VENDOR_LISTEN": ":8445", "SANDGATE_EGRESS_VENDOR_URL": "https://proxy.example:8445"}, ""},
		{map[string]string{"SANDGATE_EGRESS_VENDOR_LISTEN": ":8445"}, "without egress.vendor_url"},
		{map[string]string{"SANDGATE_EGRESS_VENDOR_URL": "https://proxy.example:8445"}, "without egress.vendor_listen"},
		{map[string]string{"SANDGATE_EGRESS_VENDOR_LISTEN": ":8445", "SANDGATE_EGRESS_VENDOR_URL": "http://proxy.example:8445"}, "https://HOST:PORT"},
		{map[string]string{"SANDGATE_EGRESS_VENDOR_LISTEN": ":8445", "SANDGATE_EGRESS_VENDOR_URL": "https://proxy.example"}, "https://HOST:PORT"},
		{map[string]string{"SANDGATE_EGRESS_VENDOR_LISTEN": "8445", "SANDGATE_EGRESS_VENDOR_URL": "https://proxy.example:8445"}, "not HOST:PORT"},
		{map[string]string{"SANDGATE_EGRESS_VENDOR_CA_FILE": "/ca.pem"}, "without egress.vendor_listen"},
	} {
		_, err := LoadConfig("", func(k string) string { return tt.env[k] })
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%v: %v; want valid", tt.env, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%v: %v; want an error saying %q", tt.env, err, tt.want)
		}
	}
}

// TestCheckVendorGuests: `serve --check` refuses a vendor provider
// without its agent, naming the path, and a vendor listener without the
// broker's TLS or with an unreadable CA file.
func TestCheckVendorGuests(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-agent")
	env := map[string]string{"FLY_API_TOKEN": "t", "SANDGATE_FLY_APP": "a"}
	cfg, err := loadYAML(t, "tls: {trusted_proxies: [10.0.0.1]}\nguest_binary: "+missing+
		"\negress: {vendor_listen: \":8445\", vendor_url: \"https://proxy.example:8445\", vendor_ca_file: "+missing+".pem}"+
		"\nproviders:\n  - {name: fly, kind: fly-machines}\n", env)
	if err != nil {
		t.Fatal(err)
	}
	err = cfg.Check(func(k string) string { return env[k] })
	for _, want := range []string{"guest_binary", missing, "egress.vendor_listen serves TLS", "egress.vendor_ca_file"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check = %v; want it to name %q", err, want)
		}
	}
	agent := filepath.Join(t.TempDir(), "sandgate-guest")
	if err := os.WriteFile(agent, []byte("\x7fELF not really"), 0o700); err != nil {
		t.Fatal(err)
	}
	cfg, err = loadYAML(t, "tls: {trusted_proxies: [10.0.0.1]}\nguest_binary: "+agent+"\nproviders:\n  - {name: fly, kind: fly-machines}\n", env)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Check(func(k string) string { return env[k] }); err != nil {
		t.Errorf("Check with the agent in place = %v; want nil", err)
	}
}
