package admin

import (
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/store"
)

// Account is the operator API's account object.
type Account struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	CreatedAt string `json:"created_at"`
}

// CreateAccountRequest is the body of POST /admin/v1/accounts.
type CreateAccountRequest struct {
	Name string `json:"name"`
}

// Scope is an instance's scope on the operator API. Durations are seconds,
// named as in GET /v1/lease's limits.
type Scope struct {
	Sizes         []string        `json:"sizes,omitempty"`
	DefaultSize   string          `json:"default_size,omitempty"`
	Images        []string        `json:"images,omitempty"`
	DefaultImage  string          `json:"default_image,omitempty"`
	EgressCeiling *[]string       `json:"egress_ceiling,omitempty"` // omitted: the broker default; null is not expressible, use AnyEgress
	AnyEgress     bool            `json:"any_egress,omitempty"`     // ceiling null: any valid domain
	Limits        protocol.Limits `json:"limits"`
}

// Instance is the operator API's instance object.
type Instance struct {
	ID        string `json:"id"`
	AccountID string `json:"account_id"`
	Name      string `json:"name,omitempty"`
	Provider  string `json:"provider"`
	CreatedAt string `json:"created_at"`
	Scope     Scope  `json:"scope"`
}

// CreateInstanceRequest is the body of POST /admin/v1/instances.
type CreateInstanceRequest struct {
	AccountID string `json:"account_id"`
	Name      string `json:"name,omitempty"`
	// Provider names the provider new workspaces run on; "" means the
	// broker's default_provider.
	Provider string `json:"provider,omitempty"`
	Scope    Scope  `json:"scope"`
}

// SetProviderRequest is the body of PUT /admin/v1/instances/{id}/provider.
type SetProviderRequest struct {
	Provider string `json:"provider"`
}

// Provider is one configured provider as GET /admin/v1/providers shows it.
type Provider struct {
	Name           string   `json:"name"`
	Kind           string   `json:"kind"`
	Default        bool     `json:"default"`
	AcceptNew      bool     `json:"accept_new"`
	Egress         string   `json:"egress"` // none, native or proxy
	VendorLifetime bool     `json:"vendor_lifetime"`
	VendorIdle     bool     `json:"vendor_idle"`
	Snapshots      bool     `json:"snapshots"`
	Sizes          []Size   `json:"sizes"`
	Images         []string `json:"images"` // null: any image the vendor can pull
	DefaultImage   string   `json:"default_image"`
}

// Size is one tier of a provider, with its own CPU and memory.
type Size struct {
	Name      string `json:"name"`
	CPUCores  int    `json:"cpu_cores"`
	MemoryMiB int    `json:"memory_mib"`
}

func toProvider(e *providers.Entry, def bool) Provider {
	caps := e.Provider.Capabilities()
	out := Provider{Name: e.Name, Kind: e.Kind, Default: def, AcceptNew: e.AcceptNew, Egress: caps.Egress.String(),
		VendorLifetime: caps.VendorLifetime, VendorIdle: caps.VendorIdle, Snapshots: caps.Snapshots,
		Sizes: []Size{}, Images: caps.Images, DefaultImage: caps.DefaultImage}
	for _, s := range caps.Sizes {
		out.Sizes = append(out.Sizes, Size{Name: s.Name, CPUCores: s.CPUCores, MemoryMiB: s.MemoryMiB})
	}
	return out
}

// IssueTokenRequest is the body of POST /admin/v1/instances/{id}/tokens and …/tokens/rotate.
type IssueTokenRequest struct {
	// TTLSeconds is the token's lifetime; 0 means it never expires.
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
	// GraceSeconds is the superseded tokens' grace period on rotate; 0
	// means the broker's configured default.
	GraceSeconds int64 `json:"grace_seconds,omitempty"`
}

// IssuedToken is the answer to issuing a token: the only time the token is shown.
type IssuedToken struct {
	Token      string  `json:"token"`
	LeaseID    string  `json:"lease_id"`
	InstanceID string  `json:"instance_id"`
	ExpiresAt  *string `json:"expires_at"`
}

// Lease is one token's lease as the operator sees it (never the token).
type Lease struct {
	ID           string  `json:"id"`
	TokenPrefix  string  `json:"token_prefix"`
	State        string  `json:"state"`
	IssuedAt     string  `json:"issued_at"`
	ExpiresAt    *string `json:"expires_at"`
	SupersededAt *string `json:"superseded_at"`
	GraceUntil   *string `json:"grace_until"`
	RevokedAt    *string `json:"revoked_at"`
}

// Count is the answer of revoke and end-grace: how many leases changed.
type Count struct {
	Count int `json:"count"`
}

func wireTime(t time.Time) string { return t.UTC().Truncate(time.Second).Format(time.RFC3339) }

func timePtr(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := wireTime(t)
	return &s
}

func toScope(w Scope) sandgate.Scope {
	s := sandgate.Scope{
		Sizes: w.Sizes, DefaultSize: w.DefaultSize, Images: w.Images, DefaultImage: w.DefaultImage,
		Limits: sandgate.Limits{
			MaxConcurrentWorkspaces: w.Limits.MaxConcurrentWorkspaces,
			MaxLifetime:             sec(w.Limits.MaxLifetimeSeconds),
			IdleTimeout:             sec(w.Limits.IdleTimeoutSeconds),
			MaxExecTimeout:          sec(w.Limits.MaxExecTimeoutSeconds),
			DefaultExecTimeout:      sec(w.Limits.DefaultExecTimeoutSeconds),
			MaxSnapshots:            w.Limits.MaxSnapshots,
			MaxSnapshotBytes:        w.Limits.MaxSnapshotBytes,
			SnapshotTTL:             sec(w.Limits.SnapshotTTLSeconds),
			MaxFileBytes:            w.Limits.MaxFileBytes,
			MaxOutputBytes:          w.Limits.MaxOutputBytes,
			MaxEnvEntries:           w.Limits.MaxEnvEntries,
			MaxEgressDomains:        w.Limits.MaxEgressDomains,
		},
	}
	if w.EgressCeiling != nil {
		s.EgressCeiling = append([]string{}, *w.EgressCeiling...)
	}
	return s
}

func fromScope(s sandgate.Scope) Scope {
	l := s.Limits
	w := Scope{
		Sizes: s.Sizes, DefaultSize: s.DefaultSize, Images: s.Images, DefaultImage: s.DefaultImage,
		AnyEgress: s.EgressCeiling == nil,
		Limits: protocol.Limits{
			MaxConcurrentWorkspaces:   l.MaxConcurrentWorkspaces,
			MaxLifetimeSeconds:        int64(l.MaxLifetime / time.Second),
			IdleTimeoutSeconds:        int64(l.IdleTimeout / time.Second),
			MaxExecTimeoutSeconds:     int64(l.MaxExecTimeout / time.Second),
			DefaultExecTimeoutSeconds: int64(l.DefaultExecTimeout / time.Second),
			MaxSnapshots:              l.MaxSnapshots,
			MaxSnapshotBytes:          l.MaxSnapshotBytes,
			SnapshotTTLSeconds:        int64(l.SnapshotTTL / time.Second),
			MaxFileBytes:              l.MaxFileBytes,
			MaxOutputBytes:            l.MaxOutputBytes,
			MaxEnvEntries:             l.MaxEnvEntries,
			MaxEgressDomains:          l.MaxEgressDomains,
		},
	}
	if s.EgressCeiling != nil {
		c := append([]string{}, s.EgressCeiling...)
		w.EgressCeiling = &c
	}
	return w
}

func sec(n int64) time.Duration { return time.Duration(n) * time.Second }

func toInstance(in sandgate.Instance) Instance {
	return Instance{ID: in.ID, AccountID: in.AccountID, Name: in.Name, Provider: in.Provider, CreatedAt: wireTime(in.CreatedAt), Scope: fromScope(in.Scope)}
}

func toLease(l sandgate.Lease, now time.Time) Lease {
	out := Lease{
		ID: l.ID, TokenPrefix: l.TokenPrefix, State: string(l.StateAt(now)), IssuedAt: wireTime(l.IssuedAt),
		ExpiresAt: timePtr(l.ExpiresAt), SupersededAt: timePtr(l.SupersededAt), RevokedAt: timePtr(l.RevokedAt),
	}
	if !l.SupersededAt.IsZero() {
		out.GraceUntil = timePtr(l.GraceUntil)
	}
	return out
}

// RevokeRequest is the optional body of POST /admin/v1/instances/{id}/tokens/revoke.
type RevokeRequest struct {
	// TerminateWorkspaces ends the instance's running workspaces
	// (termination_reason lease_revoked). Omitted means true.
	TerminateWorkspaces *bool `json:"terminate_workspaces,omitempty"`
}

// RevokeResult is the answer of revoke: how many leases it revoked, and
// how many running workspaces it terminated or failed to (the background
// sweep keeps retrying those).
type RevokeResult struct {
	Count      int `json:"count"`
	Terminated int `json:"terminated"`
	Failed     int `json:"failed"`
}

// StopRequest is the body of POST /admin/v1/stop.
type StopRequest struct {
	On        *bool  `json:"on"`                   // required: true sets the stop, false lifts it
	AccountID string `json:"account_id,omitempty"` // empty: the whole broker
	// Reason, Note and Until apply to on only. Reason is required: a slug
	// ([a-z0-9][a-z0-9_-]{0,63}) that clients see as details.reason.
	Reason string `json:"reason,omitempty"`
	Note   string `json:"note,omitempty"`  // at most 500 characters; operators only
	Until  string `json:"until,omitempty"` // RFC 3339; omitted: until lifted
}

// PauseRequest is the body of POST /admin/v1/pause. Exactly one of
// AccountID and InstanceID is set.
type PauseRequest struct {
	AccountID  string `json:"account_id,omitempty"`
	InstanceID string `json:"instance_id,omitempty"`
	// Reason is a slug clients see as details.reason; omitted means
	// account_paused or instance_paused.
	Reason string `json:"reason,omitempty"`
	Note   string `json:"note,omitempty"`
	Until  string `json:"until,omitempty"`
}

// ResumeRequest is the body of POST /admin/v1/resume. Exactly one of
// AccountID and InstanceID is set; it lifts that pause only.
type ResumeRequest struct {
	AccountID  string `json:"account_id,omitempty"`
	InstanceID string `json:"instance_id,omitempty"`
}

// Swept is the answer of setting a stop or a pause: how many running
// workspaces of the scope it terminated and how many it failed to (the
// background sweep keeps retrying those).
type Swept struct {
	Terminated int `json:"terminated"`
	Failed     int `json:"failed"`
}

// Control is a stop or a pause as the operator sees it.
type Control struct {
	Reason string  `json:"reason"`
	Note   string  `json:"note,omitempty"`
	Actor  string  `json:"actor"`
	Since  string  `json:"since"`
	Until  *string `json:"until"`  // null: until lifted
	Active bool    `json:"active"` // false once Until has passed
}

// ScopedControl is one account's stop or pause, or one instance's pause.
type ScopedControl struct {
	AccountID  string `json:"account_id"`
	InstanceID string `json:"instance_id,omitempty"`
	Kind       string `json:"kind"` // stop or pause
	Control
}

// Status is the answer of GET /admin/v1/status: what is stopped or paused.
type Status struct {
	BrokerStop *Control        `json:"broker_stop"` // null: not stopped
	Controls   []ScopedControl `json:"controls"`    // sorted by account, instance, kind
}

// RiskLimits are an account's risk limits (PUT and GET
// /admin/v1/accounts/{id}/limits). A zero field means the broker's default.
type RiskLimits struct {
	AcquiresPerMinute int    `json:"acquires_per_minute"`
	MaxOpenWorkspaces int    `json:"max_open_workspaces"`
	MaxSize           string `json:"max_size"`
}

func toControl(c *store.Control, now time.Time) *Control {
	if c == nil {
		return nil
	}
	out := &Control{
		Reason: c.Reason, Note: c.Note, Actor: c.Actor, Since: wireTime(time.UnixMilli(c.Since)), Active: c.ActiveAt(now),
	}
	if c.Until != 0 {
		out.Until = timePtr(time.UnixMilli(c.Until))
	}
	return out
}
