package admin

import (
	"fmt"
	"math"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/store"
)

func toProvider(e *providers.Entry, def bool) adminapi.Provider {
	caps := e.Provider.Capabilities()
	out := adminapi.Provider{Name: e.Name, Kind: e.Kind, Default: def, AcceptNew: e.AcceptNew, Egress: caps.Egress.String(),
		VendorLifetime: caps.VendorLifetime, VendorIdle: caps.VendorIdle, Snapshots: caps.Snapshots,
		Sizes: []adminapi.Size{}, Images: caps.Images, DefaultImage: caps.DefaultImage}
	for _, s := range caps.Sizes {
		out.Sizes = append(out.Sizes, adminapi.Size{Name: s.Name, CPUCores: s.CPUCores, MemoryMiB: s.MemoryMiB})
	}
	return out
}

// toScope is w as a scope. A *_seconds field too large for a
// time.Duration is 400 invalid_request naming it, never wrapped around.
func toScope(w adminapi.Scope) (sandgate.Scope, error) {
	for _, f := range []struct {
		name string
		n    int64
	}{
		{"max_lifetime_seconds", w.Limits.MaxLifetimeSeconds},
		{"idle_timeout_seconds", w.Limits.IdleTimeoutSeconds},
		{"max_exec_timeout_seconds", w.Limits.MaxExecTimeoutSeconds},
		{"default_exec_timeout_seconds", w.Limits.DefaultExecTimeoutSeconds},
		{"snapshot_ttl_seconds", w.Limits.SnapshotTTLSeconds},
	} {
		if err := checkSeconds(f.name, f.n); err != nil {
			return sandgate.Scope{}, err
		}
	}
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
	return s, nil
}

// maxSeconds is the most seconds a time.Duration holds.
const maxSeconds = math.MaxInt64 / int64(time.Second)

// checkSeconds refuses a *_seconds field of n seconds that a
// time.Duration cannot hold: multiplied, it would wrap around to another
// duration (snapshot_ttl_seconds: 18446744075 became 1 s).
func checkSeconds(field string, n int64) error {
	if n > maxSeconds {
		return protocol.E(protocol.InvalidRequest, fmt.Sprintf("%s is over %d", field, maxSeconds))
	}
	return nil
}

func fromScope(s sandgate.Scope) adminapi.Scope {
	l := s.Limits
	w := adminapi.Scope{
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

func toAccount(a sandgate.Account) adminapi.Account {
	return adminapi.Account{ID: a.ID, Name: a.Name, CreatedAt: protocol.Time(a.CreatedAt)}
}

func toInstance(in sandgate.Instance) adminapi.Instance {
	return adminapi.Instance{ID: in.ID, AccountID: in.AccountID, Name: in.Name, Provider: in.Provider, CreatedAt: protocol.Time(in.CreatedAt), Scope: fromScope(in.Scope)}
}

func toLease(l sandgate.Lease, now time.Time) adminapi.Lease {
	out := adminapi.Lease{
		ID: l.ID, TokenPrefix: l.TokenPrefix, State: string(l.StateAt(now)), IssuedAt: protocol.Time(l.IssuedAt),
		ExpiresAt: protocol.TimePtr(l.ExpiresAt), SupersededAt: protocol.TimePtr(l.SupersededAt), RevokedAt: protocol.TimePtr(l.RevokedAt),
	}
	if !l.SupersededAt.IsZero() {
		out.GraceUntil = protocol.TimePtr(l.GraceUntil)
	}
	return out
}

func toControl(c *store.Control, now time.Time) *adminapi.Control {
	if c == nil {
		return nil
	}
	out := &adminapi.Control{
		Reason: c.Reason, Note: c.Note, Actor: c.Actor, Since: protocol.Time(time.UnixMilli(c.Since)), Active: c.ActiveAt(now),
	}
	if c.Until != 0 {
		out.Until = protocol.TimePtr(time.UnixMilli(c.Until))
	}
	return out
}
