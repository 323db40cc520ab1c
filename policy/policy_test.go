package policy_test

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
)

const (
	ok      = protocol.Code("")
	invalid = protocol.InvalidRequest
)

func rep(c string, n int) string { return strings.Repeat(c, n) }

// checkBool runs a table of predicate cases.
func checkBool(t *testing.T, name string, f func(string) bool, tests []struct {
	in   string
	want bool
}) {
	t.Helper()
	for _, tt := range tests {
		if got := f(tt.in); got != tt.want {
			t.Errorf("%s(%q) = %v; want %v", name, tt.in, got, tt.want)
		}
	}
}

type codeCase struct {
	in   string
	want protocol.Code
}

// checkCodes runs a table of validator cases, asserting the exact code.
func checkCodes(t *testing.T, name string, f func(string) error, tests []codeCase) {
	t.Helper()
	for _, tt := range tests {
		err := f(tt.in)
		if got := protocol.CodeOf(err); got != tt.want {
			t.Errorf("%s(%q) = %v; want code %q", name, tt.in, err, tt.want)
		}
		assertMessage(t, err)
	}
}

// assertMessage fails when a refusal has no operator message.
func assertMessage(t *testing.T, err error) {
	t.Helper()
	var pe *protocol.Error
	if err != nil && errors.As(err, &pe) && pe.Message == "" {
		t.Errorf("refusal %v has an empty Message", err)
	}
}

func TestValidID(t *testing.T) {
	checkBool(t, "ValidID", policy.ValidID, []struct {
		in   string
		want bool
	}{
		{"", false},
		{"a", true},
		{"ws_0kd3m9q1x7c2v5b8n4a6r2t5yz", true},
		{"A-b_c.9", true},
		{rep("x", 64), true},
		{rep("x", 65), false},
		{".", false},
		{"..", false},
		{"...", true},
		{".a", true},
		{"a/b", false},
		{"a b", false},
		{"a:b", false},
		{"é", false},
		{"a\x00", false},
	})
}

func TestValidRequestID(t *testing.T) {
	checkBool(t, "ValidRequestID", policy.ValidRequestID, []struct {
		in   string
		want bool
	}{
		{"", false},
		{"req-1.2_3", true},
		{".", true},
		{rep("r", 64), true},
		{rep("r", 65), false},
		{"a:b", false},
		{"a\nb", false},
	})
}

func TestValidateIdempotencyKey(t *testing.T) {
	checkCodes(t, "ValidateIdempotencyKey", policy.ValidateIdempotencyKey, []codeCase{
		{"", invalid},
		{"k", ok},
		{"acquire:ws_1:snap_2.v-1_x", ok},
		{rep("k", 200), ok},
		{rep("k", 201), invalid},
		{"a b", invalid},
		{"a/b", invalid},
		{"ü", invalid},
		{"a\x00", invalid},
	})
}

func TestValidateCommandIdentity(t *testing.T) {
	checkCodes(t, "ValidateCommandIdentity", policy.ValidateCommandIdentity, []codeCase{
		{"", invalid},
		{"tool:call.1_a-b", ok},
		{rep("c", 128), ok},
		{rep("c", 129), invalid},
		{"a/b", invalid},
		{"a?b", invalid},
	})
}

func TestValidateLabel(t *testing.T) {
	checkCodes(t, "ValidateLabel", policy.ValidateLabel, []codeCase{
		{"", invalid},
		{"mesh-ws-6f1e:a.b_c", ok},
		{rep("l", 128), ok},
		{rep("l", 129), invalid},
		{"a b", invalid},
		{"a/b", invalid},
		{"日本", invalid},
	})
}

func TestValidateAgent(t *testing.T) {
	checkCodes(t, "ValidateAgent", policy.ValidateAgent, []codeCase{
		{"", ok},
		{"ops-bot", ok},
		{"0", ok},
		{"a-", ok},
		{rep("a", 64), ok},
		{rep("a", 65), invalid},
		{"-a", invalid},
		{"Ops", invalid},
		{"a_b", invalid},
		{"a.b", invalid},
	})
}

func TestValidateRunID(t *testing.T) {
	checkCodes(t, "ValidateRunID", policy.ValidateRunID, []codeCase{
		{"", ok},
		{"6f1e0d4c-2b7a-4e3f-9c1d-8a5b6c7d8e9f", ok},
		{"6F1E0D4C-2B7A-4E3F-9C1D-8A5B6C7D8E9F", ok},
		{"6f1E0d4C-2b7a-1e3f-0c1d-8a5b6c7d8e9f", ok},
		{"00000000-0000-0000-0000-000000000000", ok},
		{"6f1e0d4c2b7a4e3f9c1d8a5b6c7d8e9f", invalid},
		{"{6f1e0d4c-2b7a-4e3f-9c1d-8a5b6c7d8e9f}", invalid},
		{"6f1e0d4c-2b7a-4e3f-9c1d-8a5b6c7d8e9", invalid},
		{"6f1e0d4c-2b7a-4e3f-9c1d-8a5b6c7d8e9ff", invalid},
		{"6f1e0d4g-2b7a-4e3f-9c1d-8a5b6c7d8e9f", invalid},
		{"6f1e0d4c_2b7a-4e3f-9c1d-8a5b6c7d8e9f", invalid},
	})
}

func TestValidateEnv(t *testing.T) {
	entries := func(n int) map[string]string {
		m := make(map[string]string, n)
		for i := range n {
			m["K"+strings.Repeat("_", i)] = "v"
		}
		return m
	}
	// sized returns one entry whose key and value total n bytes.
	sized := func(n int) map[string]string { return map[string]string{"K": rep("v", n-1)} }
	tests := []struct {
		name string
		env  map[string]string
		max  int
		want protocol.Code
	}{
		{"nil", nil, 64, ok},
		{"empty", map[string]string{}, 64, ok},
		{"nil with max 0", nil, 0, ok},
		{"one with max 0", entries(1), 0, invalid},
		{"64 of 64", entries(64), 64, ok},
		{"65 of 64", entries(65), 64, invalid},
		{"typical", map[string]string{"HOME": "/root", "_X": "", "path_2": "a=b"}, 64, ok},
		{"key leading digit", map[string]string{"1A": "v"}, 64, invalid},
		{"key with dash", map[string]string{"A-B": "v"}, 64, invalid},
		{"key with equals", map[string]string{"A=B": "v"}, 64, invalid},
		{"empty key", map[string]string{"": "v"}, 64, invalid},
		{"key 128", map[string]string{rep("K", 128): "v"}, 64, ok},
		{"key 129", map[string]string{rep("K", 129): "v"}, 64, invalid},
		{"key non-ascii", map[string]string{"KÉY": "v"}, 64, invalid},
		{"value with NUL", map[string]string{"K": "a\x00b"}, 64, invalid},
		{"value newline", map[string]string{"K": "a\nb"}, 64, ok},
		{"total 32 KiB", sized(32 << 10), 64, ok},
		{"total 32 KiB + 1", sized(32<<10 + 1), 64, invalid},
		{"total over 32 KiB across entries", map[string]string{"A": rep("v", 16<<10), "B": rep("v", 16<<10)}, 64, invalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := policy.ValidateEnv(tt.env, tt.max)
			if got := protocol.CodeOf(err); got != tt.want {
				t.Errorf("ValidateEnv(%s, %d) = %v; want code %q", tt.name, tt.max, err, tt.want)
			}
			assertMessage(t, err)
		})
	}
}

// domain253 is a valid domain of exactly 253 characters.
var domain253 = rep("a", 63) + "." + rep("b", 63) + "." + rep("c", 63) + "." + rep("d", 61)

func TestParseDomain(t *testing.T) {
	if len(domain253) != 253 {
		t.Fatalf("len(domain253) = %d; want 253", len(domain253))
	}
	tests := []codeCase{
		{"example.com", ok},
		{"a.example.com", ok},
		{"a.b", ok},
		{"*.example.com", ok},
		{"*.a.example.com", ok},
		{"github.com", ok},
		{"*.githubusercontent.com", ok},
		{"xn--bcher-kva.example", ok},
		{"a-b.example.com", ok},
		{"a--b.example.com", ok},
		{"123.example.com", ok},
		{"1a.example.com", ok},
		{"example.co1", ok},
		{"example.0xg", ok},
		{rep("a", 63) + ".com", ok},
		{rep("a", 64) + ".com", invalid},
		{domain253, ok},
		{domain253 + "d", invalid},
		{"*." + domain253[2:], ok},
		{"*." + domain253[1:], invalid},

		{"", invalid},
		{"*", invalid},
		{"*.", invalid},
		{"**.example.com", invalid},
		{"*example.com", invalid},
		{"*.*.example.com", invalid},
		{"a.*.example.com", invalid},
		{"example.*", invalid},
		{"*.com", invalid},
		{"com", invalid},
		{"localhost", invalid},
		{"Example.com", invalid},
		{"EXAMPLE.COM", invalid},
		{"*.Example.com", invalid},
		{"example.com.", invalid},
		{"*.example.com.", invalid},
		{".example.com", invalid},
		{"a..example.com", invalid},
		{"-a.example.com", invalid},
		{"a-.example.com", invalid},
		{"example.-com", invalid},
		{"a_b.example.com", invalid},
		{"exa mple.com", invalid},
		{" example.com", invalid},
		{"example.com ", invalid},
		{"bücher.example", invalid},
		{"example.com\x00", invalid},
		{"https://example.com", invalid},
		{"http://example.com", invalid},
		{"//example.com", invalid},
		{"example.com:443", invalid},
		{"*.example.com:443", invalid},
		{"example.com:", invalid},
		{"example.com/path", invalid},
		{"example.com/", invalid},
		{"example.com?q", invalid},
		{"example.com#f", invalid},
		{"user@example.com", invalid},
		{"1.2.3.4", invalid},
		{"127.0.0.1", invalid},
		{"1.2.3.4:80", invalid},
		{"*.1.2.3.4", invalid},
		{"::1", invalid},
		{"[::1]", invalid},
		{"2001:db8::1", invalid},
		{"[2001:db8::1]:443", invalid},
		{"fe80::1%eth0", invalid},
		{"::ffff:1.2.3.4", invalid},
		{"example.123", invalid},
		{"0x7f.0.0.1", invalid},
		{"a.0x7f", invalid},
		{"a.0x", invalid},
		{"127.1", invalid},
	}
	for _, tt := range tests {
		got, err := policy.ParseDomain(tt.in)
		if c := protocol.CodeOf(err); c != tt.want {
			t.Errorf("ParseDomain(%q) = %q, %v; want code %q", tt.in, got, err, tt.want)
			continue
		}
		assertMessage(t, err)
		if err == nil && got != tt.in {
			t.Errorf("ParseDomain(%q) = %q; want %q", tt.in, got, tt.in)
		}
		if err != nil && got != "" {
			t.Errorf("ParseDomain(%q) = %q with error; want \"\"", tt.in, got)
		}
	}
}

func TestCheckEgress(t *testing.T) {
	domains := func(d ...string) *protocol.Egress { return &protocol.Egress{AllowedDomains: append([]string{}, d...)} }
	many := func(n int) *protocol.Egress {
		e := &protocol.Egress{AllowedDomains: []string{}}
		for i := range n {
			e.AllowedDomains = append(e.AllowedDomains, rep("a", i+1)+".example.com")
		}
		return e
	}
	wild := []string{"*.example.com"}
	tests := []struct {
		name    string
		e       *protocol.Egress
		ceiling []string
		max     int
		want    []string // checked when code is ok
		code    protocol.Code
	}{
		{"nil egress", nil, nil, 100, nil, protocol.EgressRequired},
		{"nil domains", &protocol.Egress{}, nil, 100, nil, protocol.EgressRequired},
		{"nil domains under empty ceiling", &protocol.Egress{}, []string{}, 100, nil, protocol.EgressRequired},
		{"empty, any ceiling", domains(), nil, 100, []string{}, ok},
		{"empty, empty ceiling", domains(), []string{}, 100, []string{}, ok},
		{"empty, max 0", domains(), nil, 0, []string{}, ok},
		{"any valid domain", domains("github.com", "*.githubusercontent.com"), nil, 100,
			[]string{"github.com", "*.githubusercontent.com"}, ok},
		{"empty ceiling refuses", domains("github.com"), []string{}, 100, nil, protocol.EgressNotAllowed},
		{"dedupe", domains("b.com", "a.com", "b.com", "a.com"), nil, 100, []string{"b.com", "a.com"}, ok},
		{"at max", many(3), nil, 3, many(3).AllowedDomains, ok},
		{"over max", many(4), nil, 3, nil, invalid},
		{"over max counts duplicates", domains("a.com", "a.com"), nil, 1, nil, invalid},
		{"max 0", domains("a.com"), nil, 0, nil, invalid},
		{"bad grammar", domains("github.com", "1.2.3.4"), nil, 100, nil, invalid},
		{"grammar before ceiling", domains("evil.com", "Bad.com"), []string{}, 100, nil, invalid},
		{"bare star", domains("*"), nil, 100, nil, invalid},
		{"port", domains("github.com:443"), nil, 100, nil, invalid},
		{"empty entry", domains(""), nil, 100, nil, invalid},

		{"wildcard: sub", domains("a.example.com"), wild, 100, []string{"a.example.com"}, ok},
		{"wildcard: deep sub", domains("x.a.example.com"), wild, 100, []string{"x.a.example.com"}, ok},
		{"wildcard: narrower wildcard", domains("*.a.example.com"), wild, 100, []string{"*.a.example.com"}, ok},
		{"wildcard: same wildcard", domains("*.example.com"), wild, 100, []string{"*.example.com"}, ok},
		{"wildcard: not apex", domains("example.com"), wild, 100, nil, protocol.EgressNotAllowed},
		{"wildcard: not suffix without dot", domains("badexample.com"), wild, 100, nil, protocol.EgressNotAllowed},
		{"wildcard: not other domain", domains("a.example.org"), wild, 100, nil, protocol.EgressNotAllowed},
		{"wildcard: one bad refuses all", domains("a.example.com", "evil.com"), wild, 100, nil, protocol.EgressNotAllowed},
		{"narrow wildcard: not its apex", domains("a.example.com"), []string{"*.a.example.com"}, 100, nil, protocol.EgressNotAllowed},
		{"narrow wildcard: not broader wildcard", domains("*.example.com"), []string{"*.a.example.com"}, 100, nil, protocol.EgressNotAllowed},
		{"narrow wildcard: sub", domains("b.a.example.com"), []string{"*.a.example.com"}, 100, []string{"b.a.example.com"}, ok},

		{"exact: equal", domains("example.com"), []string{"example.com"}, 100, []string{"example.com"}, ok},
		{"exact: not sub", domains("a.example.com"), []string{"example.com"}, 100, nil, protocol.EgressNotAllowed},
		{"exact: not wildcard", domains("*.example.com"), []string{"example.com"}, 100, nil, protocol.EgressNotAllowed},
		{"mixed ceiling", domains("github.com", "objects.githubusercontent.com"),
			[]string{"github.com", "*.githubusercontent.com"}, 100,
			[]string{"github.com", "objects.githubusercontent.com"}, ok},
		{"invalid ceiling entry matches nothing", domains("a.com"), []string{"*.com"}, 100, nil, protocol.EgressNotAllowed},
		{"invalid ceiling star matches nothing", domains("a.com"), []string{"*"}, 100, nil, protocol.EgressNotAllowed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var in []string
			if tt.e != nil {
				in = tt.e.AllowedDomains
			}
			got, err := policy.CheckEgress(tt.e, tt.ceiling, tt.max)
			if c := protocol.CodeOf(err); c != tt.code {
				t.Fatalf("CheckEgress(%#v, %#v, %d) = %q, %v; want code %q", in, tt.ceiling, tt.max, got, err, tt.code)
			}
			assertMessage(t, err)
			if err != nil {
				if got != nil {
					t.Errorf("CheckEgress(%#v, %#v, %d) = %q with error; want nil", in, tt.ceiling, tt.max, got)
				}
				return
			}
			if got == nil || !slices.Equal(got, tt.want) {
				t.Errorf("CheckEgress(%#v, %#v, %d) = %#v; want %#v", in, tt.ceiling, tt.max, got, tt.want)
			}
		})
	}
}

func TestValidatePath(t *testing.T) {
	checkCodes(t, "ValidatePath", policy.ValidatePath, []codeCase{
		{"", invalid},
		{"/", ok},
		{"/workspace/repo/a b.txt", ok},
		{"/../etc/passwd", ok}, // the sandbox confines paths, not the grammar
		{"/" + rep("p", 4095), ok},
		{"/" + rep("p", 4096), invalid},
		{"relative/path", invalid},
		{"./a", invalid},
		{"~/a", invalid},
		{"/a\x00b", invalid},
	})
	err := policy.ValidatePathField("dir", "x")
	if got := protocol.CodeOf(err); got != invalid || !strings.Contains(err.Error(), "dir") {
		t.Errorf("ValidatePathField(%q, %q) = %v; want %q naming dir", "dir", "x", err, invalid)
	}
}

func TestValidateArgv(t *testing.T) {
	args := func(n int) []string { return slices.Repeat([]string{"a"}, n) }
	tests := []struct {
		name string
		argv []string
		want protocol.Code
	}{
		{"nil", nil, invalid},
		{"empty", []string{}, invalid},
		{"one", []string{"git"}, ok},
		{"typical", []string{"git", "status", "--porcelain"}, ok},
		{"empty argument", []string{"echo", ""}, ok},
		{"empty program", []string{""}, invalid},
		{"4096 strings", args(4096), ok},
		{"4097 strings", args(4097), invalid},
		{"NUL in argument", []string{"echo", "a\x00b"}, invalid},
		{"NUL in program", []string{"ls\x00"}, invalid},
		{"256 KiB", []string{"x", rep("a", 256<<10-1)}, ok},
		{"256 KiB + 1", []string{"x", rep("a", 256<<10)}, invalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := policy.ValidateArgv(tt.argv)
			if got := protocol.CodeOf(err); got != tt.want {
				t.Errorf("ValidateArgv(%s) = %v; want code %q", tt.name, err, tt.want)
			}
			assertMessage(t, err)
		})
	}
}

func TestClampExecTimeout(t *testing.T) {
	const (
		def = 30 * time.Second
		mx  = 15 * time.Minute
		hr  = time.Hour
	)
	tests := []struct {
		requested, def, max, until time.Duration
		want                       time.Duration
		clamped                    bool
		code                       protocol.Code
	}{
		{0, def, mx, hr, def, false, ok},
		{time.Minute, def, mx, hr, time.Minute, false, ok},
		{time.Second, def, mx, hr, time.Second, false, ok},
		{mx, def, mx, hr, mx, false, ok},
		{mx + time.Second, def, mx, hr, mx, true, ok},
		{policy.Seconds(1 << 62), def, mx, hr, mx, true, ok},
		{time.Minute, def, mx, 10 * time.Second, 10 * time.Second, true, ok},
		{0, def, mx, 10 * time.Second, 10 * time.Second, true, ok},
		{hr, def, mx, 5 * time.Minute, 5 * time.Minute, true, ok},
		{10 * time.Second, def, mx, 10 * time.Second, 10 * time.Second, false, ok},
		{-time.Second, def, mx, hr, 0, false, invalid},
		{time.Minute, def, mx, 0, 0, false, protocol.WorkspaceGone},
		{time.Minute, def, mx, -time.Second, 0, false, protocol.WorkspaceGone},
		{time.Minute, 0, mx, hr, 0, false, protocol.Internal},
		{time.Minute, def, 0, hr, 0, false, protocol.Internal},
	}
	for _, tt := range tests {
		d, clamped, err := policy.ClampExecTimeout(tt.requested, tt.def, tt.max, tt.until)
		if got := protocol.CodeOf(err); got != tt.code || d != tt.want || clamped != tt.clamped {
			t.Errorf("ClampExecTimeout(%v, %v, %v, %v) = %v, %v, %v; want %v, %v, code %q",
				tt.requested, tt.def, tt.max, tt.until, d, clamped, err, tt.want, tt.clamped, tt.code)
		}
		assertMessage(t, err)
	}
}

func TestSeconds(t *testing.T) {
	tests := []struct {
		in   int64
		want time.Duration
	}{
		{0, 0},
		{30, 30 * time.Second},
		{-5, -5 * time.Second},
		{1 << 40, 1<<63 - 1},
		{-(1 << 40), -1 << 63},
	}
	for _, tt := range tests {
		if got := policy.Seconds(tt.in); got != tt.want {
			t.Errorf("Seconds(%d) = %v; want %v", tt.in, got, tt.want)
		}
	}
}

func TestResolveSize(t *testing.T) {
	tests := []struct {
		name  string
		scope sandgate.Scope
		in    string
		want  string // size name when code is ok
		code  protocol.Code
	}{
		{"all: default", sandgate.Scope{}, "", "standard", ok},
		{"all: small", sandgate.Scope{}, "small", "small", ok},
		{"all: xlarge", sandgate.Scope{}, "xlarge", "xlarge", ok},
		{"all: unknown", sandgate.Scope{}, "huge", "", protocol.SizeNotAllowed},
		{"all: case matters", sandgate.Scope{}, "Small", "", protocol.SizeNotAllowed},
		{"no standard: first allowed", sandgate.Scope{Sizes: []string{"large", "small"}}, "", "small", ok},
		{"never clamp down", sandgate.Scope{Sizes: []string{"small", "standard"}}, "large", "", protocol.SizeNotAllowed},
		{"never clamp up", sandgate.Scope{Sizes: []string{"large"}}, "small", "", protocol.SizeNotAllowed},
		{"explicit default", sandgate.Scope{Sizes: []string{"small", "standard"}, DefaultSize: "small"}, "", "small", ok},
		{"explicit allowed", sandgate.Scope{Sizes: []string{"small", "standard"}, DefaultSize: "small"}, "standard", "standard", ok},
		{"default not allowed", sandgate.Scope{Sizes: []string{"small"}, DefaultSize: "xlarge"}, "", "", protocol.Internal},
		{"nothing known", sandgate.Scope{Sizes: []string{"bogus"}}, "", "", protocol.Internal},
		{"nothing known: named", sandgate.Scope{Sizes: []string{"bogus"}}, "bogus", "", protocol.SizeNotAllowed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := policy.ResolveSize(tt.scope, tt.in)
			if c := protocol.CodeOf(err); c != tt.code {
				t.Fatalf("ResolveSize(%+v, %q) = %+v, %v; want code %q", tt.scope, tt.in, got, err, tt.code)
			}
			assertMessage(t, err)
			want, _ := sandgate.LookupSize(tt.want)
			if got != want {
				t.Errorf("ResolveSize(%+v, %q) = %+v; want %+v", tt.scope, tt.in, got, want)
			}
		})
	}
}

func TestResolveImage(t *testing.T) {
	only := sandgate.Scope{DefaultImage: "buildpack-deps:bookworm"}
	list := sandgate.Scope{DefaultImage: "d:1", Images: []string{"a:1", "b:2"}}
	tests := []struct {
		name  string
		scope sandgate.Scope
		in    string
		want  string
		code  protocol.Code
	}{
		{"default", only, "", "buildpack-deps:bookworm", ok},
		{"default by name", only, "buildpack-deps:bookworm", "buildpack-deps:bookworm", ok},
		{"only default allowed", only, "ubuntu:24.04", "", protocol.ImageNotAllowed},
		{"listed", list, "b:2", "b:2", ok},
		{"default always allowed", list, "d:1", "d:1", ok},
		{"default of list", list, "", "d:1", ok},
		{"not listed", list, "c:3", "", protocol.ImageNotAllowed},
		{"exact match only", list, "a:1 ", "", protocol.ImageNotAllowed},
		{"no default: provider's", sandgate.Scope{}, "", "", ok},
		{"no default: none allowed", sandgate.Scope{}, "a:1", "", protocol.ImageNotAllowed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := policy.ResolveImage(tt.scope, tt.in)
			if c := protocol.CodeOf(err); c != tt.code || got != tt.want {
				t.Errorf("ResolveImage(%+v, %q) = %q, %v; want %q, code %q", tt.scope, tt.in, got, err, tt.want, tt.code)
			}
			assertMessage(t, err)
		})
	}
}

func TestAllowedImages(t *testing.T) {
	tests := []struct {
		scope sandgate.Scope
		want  []string
	}{
		{sandgate.Scope{}, []string{}},
		{sandgate.Scope{DefaultImage: "d"}, []string{"d"}},
		{sandgate.Scope{DefaultImage: "d", Images: []string{"a", "d", "b", "a"}}, []string{"d", "a", "b"}},
		{sandgate.Scope{Images: []string{"a", ""}}, []string{"a"}},
	}
	for _, tt := range tests {
		if got := policy.AllowedImages(tt.scope); got == nil || !slices.Equal(got, tt.want) {
			t.Errorf("AllowedImages(%+v) = %#v; want %#v", tt.scope, got, tt.want)
		}
	}
}

func TestValidateScope(t *testing.T) {
	valid := sandgate.Scope{
		Sizes:         []string{"small", "standard"},
		DefaultSize:   "standard",
		Images:        []string{"buildpack-deps:bookworm", "ubuntu:24.04"},
		DefaultImage:  "buildpack-deps:bookworm",
		EgressCeiling: []string{"github.com", "*.githubusercontent.com"},
	}
	with := func(f func(*sandgate.Scope)) sandgate.Scope {
		s := valid
		s.Sizes = slices.Clone(valid.Sizes)
		s.Images = slices.Clone(valid.Images)
		s.EgressCeiling = slices.Clone(valid.EgressCeiling)
		f(&s)
		return s
	}
	tests := []struct {
		name  string
		scope sandgate.Scope
		want  string // a substring of the error; "" for valid
	}{
		{"valid", valid, ""},
		{"minimal", sandgate.Scope{DefaultImage: "img"}, ""},
		{"empty ceiling", with(func(s *sandgate.Scope) { s.EgressCeiling = []string{} }), ""},
		{"default exec capped by max", with(func(s *sandgate.Scope) { s.Limits.MaxExecTimeout = 10 * time.Second }), ""},
		{"explicit limits", with(func(s *sandgate.Scope) { s.Limits = sandgate.DefaultLimits }), ""},
		{"zero value", sandgate.Scope{}, "default image is required"},
		{"unknown size", with(func(s *sandgate.Scope) { s.Sizes = append(s.Sizes, "huge") }), `size "huge" is unknown`},
		{"default size not allowed", with(func(s *sandgate.Scope) { s.DefaultSize = "large" }), "default size"},
		{"default size unknown", with(func(s *sandgate.Scope) { s.DefaultSize = "huge" }), "default size"},
		{"default image not listed", with(func(s *sandgate.Scope) { s.DefaultImage = "other:1" }), "not among the allowed images"},
		{"image with space", with(func(s *sandgate.Scope) { s.Images[1] = "a b" }), "images[1]"},
		{"empty image", with(func(s *sandgate.Scope) { s.Images[1] = "" }), "images[1]"},
		{"default image with newline", sandgate.Scope{DefaultImage: "a\nb"}, "default image"},
		{"bad ceiling", with(func(s *sandgate.Scope) { s.EgressCeiling[1] = "*.com" }), "egress ceiling[1]"},
		{"ceiling IP", with(func(s *sandgate.Scope) { s.EgressCeiling[0] = "10.0.0.1" }), "egress ceiling[0]"},
		{"negative concurrency", with(func(s *sandgate.Scope) { s.Limits.MaxConcurrentWorkspaces = -1 }), "max_concurrent_workspaces"},
		{"negative egress domains", with(func(s *sandgate.Scope) { s.Limits.MaxEgressDomains = -1 }), "max_egress_domains"},
		{"negative file bytes", with(func(s *sandgate.Scope) { s.Limits.MaxFileBytes = -1 }), "max_file_bytes"},
		{"negative snapshot bytes", with(func(s *sandgate.Scope) { s.Limits.MaxSnapshotBytes = -1 }), "max_snapshot_bytes"},
		{"negative lifetime", with(func(s *sandgate.Scope) { s.Limits.MaxLifetime = -time.Hour }), "max_lifetime"},
		{"sub-second idle", with(func(s *sandgate.Scope) { s.Limits.IdleTimeout = time.Millisecond }), "idle_timeout"},
		{"default exec above max", with(func(s *sandgate.Scope) {
			s.Limits.DefaultExecTimeout = time.Hour
			s.Limits.MaxExecTimeout = time.Minute
		}), "exceeds max_exec_timeout"},
		{"default exec above default max", with(func(s *sandgate.Scope) { s.Limits.DefaultExecTimeout = time.Hour }), "exceeds max_exec_timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := policy.ValidateScope(tt.scope)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("ValidateScope(%s) = %v; want nil", tt.name, err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("ValidateScope(%s) = %v; want an error containing %q", tt.name, err, tt.want)
			}
			var pe *protocol.Error
			if errors.As(err, &pe) {
				t.Errorf("ValidateScope(%s) = %v; want a plain error, not *protocol.Error", tt.name, err)
			}
		})
	}
}

// TestValidateScopeJoins checks that every problem is reported at once.
func TestValidateScopeJoins(t *testing.T) {
	s := sandgate.Scope{Sizes: []string{"huge"}, EgressCeiling: []string{"*"}}
	s.Limits.MaxSnapshots = -1
	err := policy.ValidateScope(s)
	for _, want := range []string{"huge", "default image", "egress ceiling[0]", "max_snapshots"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateScope(%+v) = %v; want it to mention %q", s, err, want)
		}
	}
}

// TestMessagesOmitContent plants a secret in every field that may carry
// content and checks that no refusal repeats it.
func TestMessagesOmitContent(t *testing.T) {
	const secret = "s3cr3tVALUE"
	refusals := map[string]error{
		"env NUL value":      policy.ValidateEnv(map[string]string{"K": secret + "\x00"}, 64),
		"env bad key":        policy.ValidateEnv(map[string]string{secret + "-x": "v"}, 64),
		"env long key":       policy.ValidateEnv(map[string]string{secret + rep("K", 128): "v"}, 64),
		"env too large":      policy.ValidateEnv(map[string]string{"K": secret + rep("v", 32<<10)}, 64),
		"path relative":      policy.ValidatePath(secret),
		"path NUL":           policy.ValidatePath("/" + secret + "\x00"),
		"path long":          policy.ValidatePath("/" + secret + rep("p", 4096)),
		"dir relative":       policy.ValidatePathField("dir", secret),
		"argv NUL":           policy.ValidateArgv([]string{"sh", secret + "\x00"}),
		"argv empty program": policy.ValidateArgv([]string{"", secret}),
		"argv large":         policy.ValidateArgv([]string{"sh", secret + rep("a", 256<<10)}),
		"label":              policy.ValidateLabel(secret + " x"),
		"idempotency key":    policy.ValidateIdempotencyKey(secret + "/"),
		"command identity":   policy.ValidateCommandIdentity(secret + "/"),
		"agent":              policy.ValidateAgent(secret),
		"run id":             policy.ValidateRunID(secret),
		"size unsafe":        second(policy.ResolveSize(sandgate.Scope{}, secret+"/x")),
		"image unsafe":       second(policy.ResolveImage(sandgate.Scope{}, secret+" x")),
		"domain port":        second(policy.ParseDomain(secret + ".example.com:443")),
		"domain upper":       second(policy.ParseDomain("a." + secret + ".com")),
		"domain scheme":      second(policy.ParseDomain("https://" + secret + ".com")),
		"egress grammar":     second(policy.CheckEgress(&protocol.Egress{AllowedDomains: []string{secret + ".com/x"}}, nil, 100)),
	}
	for _, name := range slices.Sorted(maps.Keys(refusals)) {
		err := refusals[name]
		if protocol.CodeOf(err) == ok {
			t.Errorf("%s: got nil; want a refusal", name)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%s: message %q repeats the request's content", name, err)
		}
	}

	// Values that passed a safe-charset check are quoted, to help the operator.
	shown := map[string]struct {
		err  error
		want string
	}{
		"size":   {second(policy.ResolveSize(sandgate.Scope{Sizes: []string{"small"}}, "large")), `"large"`},
		"image":  {second(policy.ResolveImage(sandgate.Scope{}, "ubuntu:24.04")), `"ubuntu:24.04"`},
		"domain": {second(policy.CheckEgress(&protocol.Egress{AllowedDomains: []string{"evil.com"}}, []string{}, 100)), `"evil.com"`},
		"env":    {policy.ValidateEnv(map[string]string{"TOKEN_NAME": "\x00"}, 64), "TOKEN_NAME"},
	}
	for _, name := range slices.Sorted(maps.Keys(shown)) {
		tt := shown[name]
		if tt.err == nil || !strings.Contains(tt.err.Error(), tt.want) {
			t.Errorf("%s: message %v; want it to name %s", name, tt.err, tt.want)
		}
	}
}

func second[T any](_ T, err error) error { return err }
