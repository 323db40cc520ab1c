package admin

import (
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/protocol"
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
	CreatedAt string `json:"created_at"`
	Scope     Scope  `json:"scope"`
}

// CreateInstanceRequest is the body of POST /admin/v1/instances.
type CreateInstanceRequest struct {
	AccountID string `json:"account_id"`
	Name      string `json:"name,omitempty"`
	Scope     Scope  `json:"scope"`
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
	return Instance{ID: in.ID, AccountID: in.AccountID, Name: in.Name, CreatedAt: wireTime(in.CreatedAt), Scope: fromScope(in.Scope)}
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
