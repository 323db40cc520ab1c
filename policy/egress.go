package policy

import (
	"fmt"
	"strings"

	"github.com/sandgate/sandgate/protocol"
)

// CheckEgress checks an Acquire's egress against the instance's ceiling and
// returns the requested domains, deduplicated in their first order. The
// result is never nil; empty means no outbound network.
//
// maxDomains is the scope's MaxEgressDomains after Limits.WithDefaults; a
// value of 0 or less allows only an empty list (fail closed). A nil ceiling
// allows any valid domain; a non-nil ceiling allows a domain equal to one of
// its entries or matched by a "*." entry: "*.example.com" matches
// a.example.com and *.a.example.com, but not example.com. A ceiling entry
// that fails [ParseDomain] matches nothing.
//
// Returns EgressRequired when e or e.AllowedDomains is nil (spec §Acquire: a
// broker never runs a workspace with open egress), InvalidRequest for too
// many entries or an entry outside the grammar (every entry is checked for
// grammar before any against the ceiling), and EgressNotAllowed for an entry
// outside the ceiling.
func CheckEgress(e *protocol.Egress, ceiling []string, maxDomains int) ([]string, error) {
	if e == nil || e.AllowedDomains == nil {
		return nil, protocol.E(protocol.EgressRequired,
			"egress is required: send egress.allowed_domains, [] for no outbound network")
	}
	req := e.AllowedDomains
	if len(req) > maxDomains {
		return nil, invalid(fmt.Sprintf(
			"egress.allowed_domains has %d entries; this instance allows at most %d (max_egress_domains)",
			len(req), max(maxDomains, 0)))
	}
	for i, d := range req {
		if p := domainProblem(d); p != "" {
			return nil, invalid(fmt.Sprintf("egress.allowed_domains[%d] %s", i, p))
		}
	}
	var allowed ceilingSet
	if ceiling != nil {
		allowed = newCeilingSet(ceiling)
	}
	out := make([]string, 0, len(req))
	seen := make(map[string]bool, len(req))
	for i, d := range req {
		if seen[d] {
			continue
		}
		seen[d] = true
		if ceiling != nil && !allowed.allows(d) {
			// d passed the grammar, so it is safe to quote.
			return nil, protocol.E(protocol.EgressNotAllowed, fmt.Sprintf(
				"egress.allowed_domains[%d] %q is outside this instance's egress ceiling (egress.ceiling in GET /v1/lease)",
				i, d))
		}
		out = append(out, d)
	}
	return out, nil
}

// ceilingSet is a parsed egress ceiling: every valid entry, and the base
// domain of every "*." entry.
type ceilingSet struct {
	exact map[string]bool // valid entries verbatim, wildcards included
	wild  map[string]bool // "example.com" for the entry "*.example.com"
}

func newCeilingSet(entries []string) ceilingSet {
	c := ceilingSet{exact: make(map[string]bool, len(entries)), wild: make(map[string]bool)}
	for _, e := range entries {
		if domainProblem(e) != "" {
			continue // an operator's invalid entry matches nothing
		}
		c.exact[e] = true
		if base, ok := strings.CutPrefix(e, "*."); ok {
			c.wild[base] = true
		}
	}
	return c
}

// allows reports whether the valid domain d equals an entry or is matched by
// a "*." entry. "*.example.com" matches every name that ends in
// ".example.com", the narrower wildcard "*.a.example.com" included, so each
// proper suffix of d that follows a dot is looked up as a wildcard base.
func (c ceilingSet) allows(d string) bool {
	if c.exact[d] {
		return true
	}
	for i := 0; i < len(d); i++ {
		if d[i] == '.' && c.wild[d[i+1:]] {
			return true
		}
	}
	return false
}
