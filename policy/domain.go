package policy

import (
	"net/netip"
	"strings"
)

// Limits of the egress domain grammar.
const (
	maxDomainLen = 253
	maxLabelLen  = 63
)

// ParseDomain checks one egress domain in Formation's grammar and returns it.
// A domain is a lowercase hostname, optionally with one leading "*.": at
// least two labels of 1 to 63 characters of [a-z0-9-] that neither start nor
// end with '-', at most 253 characters in all. It refuses IP addresses (v4
// and v6), ports, paths, schemes, userinfo, a trailing dot, uppercase, a bare
// "*" or "*.", a wildcard anywhere but first, "*." before a single label, and
// a final label that is a number (all digits, or 0x and hex digits, which
// some resolvers read as part of an IPv4 address). International names are
// written in punycode (xn--).
//
// The grammar has no normal forms to fold, so an accepted domain is returned
// unchanged. Returns InvalidRequest naming the rule, never the value.
func ParseDomain(s string) (string, error) {
	if p := domainProblem(s); p != "" {
		return "", invalid("domain " + p)
	}
	return s, nil
}

// domainProblem returns why s is not a valid egress domain, phrased to follow
// the name of the field, or "" when it is valid.
func domainProblem(s string) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > maxDomainLen:
		return "is longer than 253 characters"
	case strings.Contains(s, "://"):
		return "must not include a scheme: write example.com, not https://example.com"
	case isIP(s):
		return "must not be an IP address: egress is allowed by hostname only"
	case strings.ContainsAny(s, "/?#"):
		return "must not include a path"
	case strings.Contains(s, "@"):
		return "must not include userinfo"
	case strings.Contains(s, ":"):
		return "must not include a port: egress is allowed to every port of a domain"
	case s == "*" || s == "*.":
		return "must not be a bare wildcard: write *.example.com"
	case strings.ContainsFunc(s, func(r rune) bool { return 'A' <= r && r <= 'Z' }):
		return "must be lowercase"
	case strings.HasSuffix(s, "."):
		return "must not end with a dot"
	}
	host, _ := strings.CutPrefix(s, "*.")
	if strings.Contains(host, "*") {
		return "may use a wildcard only as one leading \"*.\""
	}
	labels := strings.Split(host, ".")
	if len(labels) < 2 {
		return "must have at least two labels, as in example.com or *.example.com"
	}
	for _, l := range labels {
		if p := labelProblem(l); p != "" {
			return p
		}
	}
	if isNumber(labels[len(labels)-1]) {
		return "must not end in a numeric label"
	}
	return ""
}

// labelProblem returns why l is not a valid hostname label, or "".
func labelProblem(l string) string {
	switch {
	case l == "":
		return "must not have an empty label (two dots in a row, or a leading dot)"
	case len(l) > maxLabelLen:
		return "must not have a label longer than 63 characters"
	case l[0] == '-' || l[len(l)-1] == '-':
		return "must not have a label that starts or ends with '-'"
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return "may contain only a-z, 0-9, '-' and '.' (write international names in punycode, xn--)"
		}
	}
	return ""
}

// isIP reports whether s is an IP address, with or without brackets or a
// port, so that its refusal names the real mistake.
func isIP(s string) bool {
	if _, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")); err == nil {
		return true
	}
	_, err := netip.ParseAddrPort(s)
	return err == nil
}

// isNumber reports whether a label reads as a number: all decimal digits, or
// "0x" followed by hex digits (the WHATWG URL "ends in a number" rule).
func isNumber(l string) bool {
	if hex, ok := strings.CutPrefix(l, "0x"); ok {
		return within(hex, 0, len(hex), isHexByte)
	}
	return within(l, 1, len(l), func(c byte) bool { return '0' <= c && c <= '9' })
}
