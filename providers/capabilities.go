package providers

import (
	"fmt"
	"slices"
	"time"

	"github.com/sandgate/sandgate"
)

// EgressMode is how a provider enforces a workspace's egress allowlist.
type EgressMode int

// Egress modes, weakest first.
const (
	// EgressNoneOnly: the provider can enforce only [] (no network at all).
	EgressNoneOnly EgressMode = iota
	// EgressNative: the vendor enforces domain allowlists itself.
	EgressNative
	// EgressProxy: domain allowlists are enforced through the broker's
	// egress proxy, the sandbox's only way out.
	EgressProxy
)

func (m EgressMode) String() string {
	switch m {
	case EgressNative:
		return "native"
	case EgressProxy:
		return "proxy"
	}
	return "none"
}

// Capabilities is what a provider really enforces and can run. The broker
// validates instance scope against it; it is not shown to clients.
type Capabilities struct {
	Egress EgressMode
	// VendorLifetime: the vendor ends the sandbox at CreateSpec.ExpiresAt
	// by itself, even with no broker process alive.
	VendorLifetime bool
	// VendorIdle: the vendor ends the sandbox after CreateSpec.IdleTimeout
	// without activity by itself.
	VendorIdle bool
	// Snapshots: Snapshot, Restore and DeleteSnapshot work.
	Snapshots bool
	// NativeCommands: the provider implements Commander itself.
	NativeCommands bool
	// Sizes are the tiers it runs, smallest first, each with this
	// provider's own CPU and memory (vendors count CPUs differently).
	Sizes []sandgate.Size
	// Images are the images it runs; nil means any image reference the
	// vendor can pull.
	Images []string
	// DefaultImage is the image of a scope that names none.
	DefaultImage string
	// MaxLifetime is the longest a sandbox runs on the vendor (Modal: 24
	// h); 0 means no bound. Limits past it are clamped (ClampLimits).
	MaxLifetime time.Duration
}

// ClampLimits returns l with every duration clamped to what the provider
// can honour: max_lifetime to MaxLifetime, and the idle and exec timeouts
// to that lifetime. The lease advertises the clamped limits, and
// workspaces are created with them.
func (c Capabilities) ClampLimits(l sandgate.Limits) sandgate.Limits {
	if c.MaxLifetime <= 0 {
		return l
	}
	l.MaxLifetime = min(l.MaxLifetime, c.MaxLifetime)
	l.IdleTimeout = min(l.IdleTimeout, l.MaxLifetime)
	l.MaxExecTimeout = min(l.MaxExecTimeout, l.MaxLifetime)
	l.DefaultExecTimeout = min(l.DefaultExecTimeout, l.MaxExecTimeout)
	return l
}

// Size returns the provider's tier called name.
func (c Capabilities) Size(name string) (sandgate.Size, bool) {
	i := slices.IndexFunc(c.Sizes, func(s sandgate.Size) bool { return s.Name == name })
	if i < 0 {
		return sandgate.Size{}, false
	}
	return c.Sizes[i], true
}

// RunsImage reports whether the provider can run image.
func (c Capabilities) RunsImage(image string) bool {
	return c.Images == nil || slices.Contains(c.Images, image)
}

// ScopeError is a scope a provider cannot enforce or run: Field names the
// scope field (sizes, default_size, images, default_image, egress_ceiling).
type ScopeError struct {
	Provider string
	Field    string
	Reason   string
}

func (e *ScopeError) Error() string {
	return fmt.Sprintf("provider %q cannot enforce this scope: %s: %s", e.Provider, e.Field, e.Reason)
}

// CheckScope reports whether provider name, with capabilities c, can
// enforce scope and run everything it allows: a *ScopeError when not.
// Nothing is clamped: a scope that asks for more is refused.
func (c Capabilities) CheckScope(name string, scope sandgate.Scope) error {
	bad := func(field, reason string) error { return &ScopeError{Provider: name, Field: field, Reason: reason} }
	if c.Egress == EgressNoneOnly && (scope.EgressCeiling == nil || len(scope.EgressCeiling) > 0) {
		return bad("egress_ceiling", "it cannot filter egress by domain; the only ceiling it can enforce is [] (no network)")
	}
	sizes := scope.Sizes
	if len(sizes) == 0 && scope.DefaultSize != "" {
		sizes = []string{scope.DefaultSize}
	}
	for _, s := range sizes {
		if _, ok := c.Size(s); !ok {
			return bad("sizes", fmt.Sprintf("it does not run size %q", s))
		}
	}
	if len(c.Sizes) == 0 {
		return bad("sizes", "it runs no size")
	}
	for _, img := range scope.Images {
		if !c.RunsImage(img) {
			return bad("images", fmt.Sprintf("it does not run image %q", img))
		}
	}
	if scope.DefaultImage != "" && !c.RunsImage(scope.DefaultImage) {
		return bad("default_image", fmt.Sprintf("it does not run image %q", scope.DefaultImage))
	}
	if scope.DefaultImage == "" && c.DefaultImage == "" && len(scope.Images) == 0 {
		return bad("default_image", "it has no default image; set default_image")
	}
	return nil
}

// Effective returns scope as it applies on the provider: an empty size
// list means every size the provider runs, an empty default image the
// provider's, and the egress ceiling is [] on a provider that enforces
// nothing else. An instance set while its provider could filter by domain
// (another kind, or a vendor listener since removed) then promises, and
// admits, only what the provider enforces now.
func (c Capabilities) Effective(scope sandgate.Scope) sandgate.Scope {
	if c.Egress == EgressNoneOnly {
		scope.EgressCeiling = []string{}
	}
	if len(scope.Sizes) == 0 {
		for _, s := range c.Sizes {
			scope.Sizes = append(scope.Sizes, s.Name)
		}
	}
	if scope.DefaultImage == "" {
		scope.DefaultImage = c.DefaultImage
	}
	return scope
}
