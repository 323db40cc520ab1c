package sandgate

import (
	"slices"
	"time"
)

// Size is one sandbox tier an instance may use.
type Size struct {
	Name      string
	CPUCores  int
	MemoryMiB int
	// DiskMiB is the provider's disk quota of the tier; 0 when it reports
	// none.
	DiskMiB int
}

// StandardSizes are the tiers sandgate knows, smallest first. An instance's
// scope allows a subset of them.
var StandardSizes = []Size{
	{Name: "small", CPUCores: 1, MemoryMiB: 512},
	{Name: "standard", CPUCores: 2, MemoryMiB: 2048},
	{Name: "large", CPUCores: 4, MemoryMiB: 8192},
	{Name: "xlarge", CPUCores: 8, MemoryMiB: 16384},
}

// LookupSize returns the standard size with the given name.
func LookupSize(name string) (Size, bool) {
	i := slices.IndexFunc(StandardSizes, func(s Size) bool { return s.Name == name })
	if i < 0 {
		return Size{}, false
	}
	return StandardSizes[i], true
}

// Limits are the numeric bounds of an instance's scope, as GET /v1/lease
// reports them. A zero field means "use DefaultLimits".
type Limits struct {
	MaxConcurrentWorkspaces int
	MaxLifetime             time.Duration
	IdleTimeout             time.Duration
	MaxExecTimeout          time.Duration
	DefaultExecTimeout      time.Duration
	MaxSnapshots            int
	// MaxSnapshotBytes caps the bytes the instance's live snapshots hold
	// together, as the provider counts them (the local provider: archive
	// sizes on disk).
	MaxSnapshotBytes int64
	SnapshotTTL      time.Duration
	MaxFileBytes     int64
	MaxOutputBytes   int64
	MaxEnvEntries    int
	MaxEgressDomains int
}

// DefaultLimits are the limits of a new instance when the operator sets none.
var DefaultLimits = Limits{
	MaxConcurrentWorkspaces: 2,
	MaxLifetime:             time.Hour,
	IdleTimeout:             15 * time.Minute,
	MaxExecTimeout:          15 * time.Minute,
	DefaultExecTimeout:      30 * time.Second,
	MaxSnapshots:            20,
	MaxSnapshotBytes:        1 << 30,
	SnapshotTTL:             14 * 24 * time.Hour,
	MaxFileBytes:            8 << 20,
	MaxOutputBytes:          4 << 20,
	MaxEnvEntries:           64,
	MaxEgressDomains:        100,
}

// WithDefaults returns l with every zero field taken from DefaultLimits.
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits
	setInt := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	setDur := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	setInt(&l.MaxConcurrentWorkspaces, d.MaxConcurrentWorkspaces)
	setDur(&l.MaxLifetime, d.MaxLifetime)
	setDur(&l.IdleTimeout, d.IdleTimeout)
	setDur(&l.MaxExecTimeout, d.MaxExecTimeout)
	setDur(&l.DefaultExecTimeout, d.DefaultExecTimeout)
	setInt(&l.MaxSnapshots, d.MaxSnapshots)
	setDur(&l.SnapshotTTL, d.SnapshotTTL)
	if l.MaxSnapshotBytes == 0 {
		l.MaxSnapshotBytes = d.MaxSnapshotBytes
	}
	if l.MaxFileBytes == 0 {
		l.MaxFileBytes = d.MaxFileBytes
	}
	if l.MaxOutputBytes == 0 {
		l.MaxOutputBytes = d.MaxOutputBytes
	}
	setInt(&l.MaxEnvEntries, d.MaxEnvEntries)
	setInt(&l.MaxEgressDomains, d.MaxEgressDomains)
	if l.DefaultExecTimeout > l.MaxExecTimeout {
		l.DefaultExecTimeout = l.MaxExecTimeout
	}
	return l
}

// Scope is what an instance may do, set by the operator and read by the
// client with GET /v1/lease. The client cannot change it.
type Scope struct {
	Sizes        []string // allowed size names; empty means all StandardSizes
	DefaultSize  string   // empty means "standard" if allowed, else the first allowed
	Images       []string // allowed images; empty means only DefaultImage
	DefaultImage string   // empty means the provider's default image
	// EgressCeiling is nil for "any valid domain" and non-nil (possibly
	// empty) for a list of allowed entries, each a hostname or "*."+hostname.
	EgressCeiling []string
	Limits        Limits
}

// AllowedSizes returns the sizes the scope allows, smallest first.
func (s Scope) AllowedSizes() []Size {
	var out []Size
	for _, sz := range StandardSizes {
		if len(s.Sizes) == 0 || slices.Contains(s.Sizes, sz.Name) {
			out = append(out, sz)
		}
	}
	return out
}
