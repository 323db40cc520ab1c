package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/protocol"
)

const maxImageLen = 256

// isImageByte reports whether c may appear in an image reference shown in a
// message: [A-Za-z0-9._:/@+-].
func isImageByte(c byte) bool { return isKeyByte(c) || c == '/' || c == '@' || c == '+' }

// ResolveSize returns the size an Acquire gets (spec §Acquire, size). An
// empty name means the default size: Scope.DefaultSize when set, else
// "standard" when allowed, else the smallest allowed size.
//
// Returns SizeNotAllowed for a name outside the scope's allowed sizes; a size
// is never clamped. Returns Internal when the scope has no usable default
// (see [ValidateScope]), which only the broker operator can fix.
func ResolveSize(s sandgate.Scope, name string) (sandgate.Size, error) {
	allowed := s.AllowedSizes()
	if name == "" {
		if sz, ok := findSize(allowed, defaultSizeName(s, allowed)); ok {
			return sz, nil
		}
		return sandgate.Size{}, protocol.E(protocol.Internal,
			"this instance's scope has no allowed default size; the broker operator must fix it")
	}
	if sz, ok := findSize(allowed, name); ok {
		return sz, nil
	}
	names := make([]string, len(allowed))
	for i, sz := range allowed {
		names[i] = sz.Name
	}
	return sandgate.Size{}, protocol.E(protocol.SizeNotAllowed, fmt.Sprintf(
		"size%s is not allowed for this instance; allowed sizes: %s (omit size for the default)",
		quoted(name, MaxIDLen, isIDByte), strings.Join(names, ", ")))
}

// defaultSizeName returns the name of the scope's default size, or "" when
// it allows none.
func defaultSizeName(s sandgate.Scope, allowed []sandgate.Size) string {
	switch {
	case s.DefaultSize != "":
		return s.DefaultSize
	case slices.ContainsFunc(allowed, func(sz sandgate.Size) bool { return sz.Name == "standard" }):
		return "standard"
	case len(allowed) > 0:
		return allowed[0].Name
	}
	return ""
}

func findSize(sizes []sandgate.Size, name string) (sandgate.Size, bool) {
	i := slices.IndexFunc(sizes, func(sz sandgate.Size) bool { return sz.Name == name })
	if i < 0 {
		return sandgate.Size{}, false
	}
	return sizes[i], true
}

// AllowedImages returns the images the scope allows: Scope.DefaultImage,
// which is always allowed, then Scope.Images, without duplicates or empty
// entries. GET /v1/lease reports it as images.allowed.
func AllowedImages(s sandgate.Scope) []string {
	out := make([]string, 0, len(s.Images)+1)
	for _, img := range append([]string{s.DefaultImage}, s.Images...) {
		if img != "" && !slices.Contains(out, img) {
			out = append(out, img)
		}
	}
	return out
}

// ResolveImage returns the image an Acquire gets (spec §Acquire, image). An
// empty image means Scope.DefaultImage, which is returned even when empty:
// the provider's default image. A non-empty image must equal
// Scope.DefaultImage or an entry of Scope.Images, else ResolveImage returns
// ImageNotAllowed; an image is never substituted.
func ResolveImage(s sandgate.Scope, image string) (string, error) {
	switch {
	case image == "":
		return s.DefaultImage, nil
	case image == s.DefaultImage || slices.Contains(s.Images, image):
		return image, nil
	}
	return "", protocol.E(protocol.ImageNotAllowed, fmt.Sprintf(
		"image%s is not allowed for this instance; see images.allowed in GET /v1/lease, or omit image for the default",
		quoted(image, maxImageLen, isImageByte)))
}

// ValidateScope checks a scope an operator sets through the operator API and
// returns every problem at once (errors.Join), as plain errors: every size
// name is known, the default size is allowed, the default image is set and,
// when Images is not empty, listed in it (so images.allowed tells the truth),
// every image is printable ASCII without spaces, every ceiling entry passes
// [ParseDomain], and every limit is positive after Limits.WithDefaults, with
// durations of at least one second (the wire carries whole seconds), and an
// explicit default exec timeout no longer than the max exec timeout.
func ValidateScope(s sandgate.Scope) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("scope: "+format, args...)) }

	known := make([]string, len(sandgate.StandardSizes))
	for i, sz := range sandgate.StandardSizes {
		known[i] = sz.Name
	}
	for _, name := range s.Sizes {
		if _, ok := sandgate.LookupSize(name); !ok {
			bad("size%s is unknown; known sizes: %s", quoted(name, MaxIDLen, isIDByte), strings.Join(known, ", "))
		}
	}
	if s.DefaultSize != "" {
		if _, ok := findSize(s.AllowedSizes(), s.DefaultSize); !ok {
			bad("default size%s is not among the allowed sizes", quoted(s.DefaultSize, MaxIDLen, isIDByte))
		}
	}

	printable := func(c byte) bool { return '!' <= c && c <= '~' }
	switch {
	case s.DefaultImage == "":
		bad("default image is required")
	case !within(s.DefaultImage, 1, maxImageLen, printable):
		bad("default image must be at most %d bytes of printable ASCII without spaces", maxImageLen)
	case len(s.Images) > 0 && !slices.Contains(s.Images, s.DefaultImage):
		bad("default image%s is not among the allowed images", quoted(s.DefaultImage, maxImageLen, isImageByte))
	}
	for i, img := range s.Images {
		if !within(img, 1, maxImageLen, printable) {
			bad("images[%d] must be 1 to %d bytes of printable ASCII without spaces", i, maxImageLen)
		}
	}

	for i, c := range s.EgressCeiling {
		if p := domainProblem(c); p != "" {
			bad("egress ceiling[%d] %s", i, p)
		}
	}

	l := s.Limits.WithDefaults()
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"max_concurrent_workspaces", int64(l.MaxConcurrentWorkspaces)},
		{"max_snapshots", int64(l.MaxSnapshots)},
		{"max_snapshot_bytes", l.MaxSnapshotBytes},
		{"max_file_bytes", l.MaxFileBytes},
		{"max_output_bytes", l.MaxOutputBytes},
		{"max_env_entries", int64(l.MaxEnvEntries)},
		{"max_egress_domains", int64(l.MaxEgressDomains)},
	} {
		if f.v < 1 {
			bad("%s must be at least 1", f.name)
		}
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{
		{"max_lifetime", l.MaxLifetime},
		{"idle_timeout", l.IdleTimeout},
		{"max_exec_timeout", l.MaxExecTimeout},
		{"default_exec_timeout", l.DefaultExecTimeout},
		{"snapshot_ttl", l.SnapshotTTL},
	} {
		if f.v < time.Second {
			bad("%s must be at least 1s", f.name)
		}
	}
	// WithDefaults caps the default at the max; an explicit default above
	// the max is an operator mistake, not something to clamp silently.
	if d := s.Limits.DefaultExecTimeout; d > 0 && d > l.MaxExecTimeout {
		bad("default_exec_timeout %s exceeds max_exec_timeout %s", d, l.MaxExecTimeout)
	}
	return errors.Join(errs...)
}
