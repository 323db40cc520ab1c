package broker

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestEgressConfig: egress.ports and egress.hosts from the file and from
// SANDGATE_EGRESS_PORTS / SANDGATE_EGRESS_HOSTS, and clear errors for bad
// values.
func TestEgressConfig(t *testing.T) {
	tests := []struct {
		name      string
		yaml      string
		env       map[string]string
		wantPorts []uint16 // nil: the proxy's default
		wantHosts map[string]netip.Addr
		wantErr   []string // words the error must hold; nil when it loads
	}{
		{name: "defaults", yaml: "log: {level: info}\n"},
		{name: "file", yaml: "egress:\n  ports: [443, 22]\n  hosts: {mirror.corp.test: 10.0.0.5}\n",
			wantPorts: []uint16{443, 22}, wantHosts: map[string]netip.Addr{"mirror.corp.test": netip.MustParseAddr("10.0.0.5")}},
		{name: "env", env: map[string]string{"SANDGATE_EGRESS_PORTS": "80, 443,8443", "SANDGATE_EGRESS_HOSTS": "a.sg.test=127.0.0.1,b.sg.test=::1"},
			wantPorts: []uint16{80, 443, 8443},
			wantHosts: map[string]netip.Addr{"a.sg.test": netip.MustParseAddr("127.0.0.1"), "b.sg.test": netip.MustParseAddr("::1")}},
		{name: "env wins over the file", yaml: "egress: {ports: [22]}\n", env: map[string]string{"SANDGATE_EGRESS_PORTS": "443"},
			wantPorts: []uint16{443}},
		{name: "env list syntax", env: map[string]string{"SANDGATE_EGRESS_PORTS": "[443]"}, wantPorts: []uint16{443}},
		{name: "port zero", env: map[string]string{"SANDGATE_EGRESS_PORTS": "0"}, wantErr: []string{"SANDGATE_EGRESS_PORTS", "list of ports"}},
		{name: "port too big", yaml: "egress: {ports: [70000]}\n", wantErr: []string{"70000", "port"}},
		{name: "port not a number", env: map[string]string{"SANDGATE_EGRESS_PORTS": "80,https"}, wantErr: []string{"SANDGATE_EGRESS_PORTS"}},
		{name: "host pair without ip", env: map[string]string{"SANDGATE_EGRESS_HOSTS": "a.sg.test"},
			wantErr: []string{"SANDGATE_EGRESS_HOSTS", "name=ip"}},
		{name: "host not an ip", env: map[string]string{"SANDGATE_EGRESS_HOSTS": "a.sg.test=nope"},
			wantErr: []string{"egress.hosts", "a.sg.test", "not an IP address"}},
		{name: "host name upper case", yaml: "egress: {hosts: {Mirror.test: 10.0.0.1}}\n", wantErr: []string{"egress", "Mirror.test", "host name"}},
		{name: "host name wildcard", yaml: "egress: {hosts: {'*.mirror.test': 10.0.0.1}}\n", wantErr: []string{"*.mirror.test"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "c.yaml")
			if tt.yaml == "" {
				tt.yaml = "log: {level: info}\n"
			}
			if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := LoadConfig(path, func(k string) string { return tt.env[k] })
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("loadConfig = nil error; want one with %q", tt.wantErr)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("loadConfig error = %q; want it to hold %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("loadConfig: %v", err)
			}
			ec, err := cfg.egressConfig(nil)
			if err != nil {
				t.Fatalf("egressConfig: %v", err)
			}
			if !reflect.DeepEqual(ec.Ports, tt.wantPorts) || !reflect.DeepEqual(ec.Hosts, tt.wantHosts) {
				t.Errorf("egress config = ports %v hosts %v; want %v %v", ec.Ports, ec.Hosts, tt.wantPorts, tt.wantHosts)
			}
		})
	}
}
