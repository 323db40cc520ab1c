package policy_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
)

// FuzzParseDomain checks that ParseDomain never panics, refuses only with
// invalid_request, and that an accepted domain round-trips unchanged and
// stays within the grammar's hard limits.
func FuzzParseDomain(f *testing.F) {
	for _, s := range []string{
		"", "*", "*.", "example.com", "*.example.com", "a.b", "Example.com",
		"1.2.3.4", "::1", "[::1]:443", "example.com:443", "https://example.com/x",
		"example.com.", "a..b", "-a.b", "xn--bcher-kva.example", "a.0x7f", "*.com",
		domain253,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := policy.ParseDomain(s)
		if err != nil {
			if c := protocol.CodeOf(err); c != protocol.InvalidRequest {
				t.Fatalf("ParseDomain(%q) = %v; want code %q", s, err, protocol.InvalidRequest)
			}
			if got != "" {
				t.Fatalf("ParseDomain(%q) = %q with error; want \"\"", s, got)
			}
			return
		}
		if got != s {
			t.Fatalf("ParseDomain(%q) = %q; want it unchanged", s, got)
		}
		if again, err := policy.ParseDomain(got); err != nil || again != got {
			t.Fatalf("ParseDomain(%q) = %q, %v; want %q, nil", got, again, err, got)
		}
		host := strings.TrimPrefix(got, "*.")
		if len(got) > 253 || strings.ContainsAny(got, ":/@[] ") || strings.Contains(host, "*") ||
			strings.ToLower(got) != got || !strings.Contains(host, ".") || strings.HasSuffix(got, ".") {
			t.Fatalf("ParseDomain(%q) accepted a domain outside the grammar", s)
		}
		if _, err := netip.ParseAddr(host); err == nil {
			t.Fatalf("ParseDomain(%q) accepted an IP address", s)
		}
		if d, err := policy.CheckEgress(&protocol.Egress{AllowedDomains: []string{got}}, []string{got}, 1); err != nil || len(d) != 1 || d[0] != got {
			t.Fatalf("CheckEgress(%q) under ceiling [%q] = %q, %v; want it allowed", got, got, d, err)
		}
	})
}
