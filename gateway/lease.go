package gateway

import (
	"context"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/store"
)

func (s *Server) getLease(c echo.Context) error {
	a := authFrom(c)
	now := s.clock.Now()
	scope := a.Instance.Scope
	lim := scope.Limits.WithDefaults()
	resp := protocol.LeaseResponse{
		APIVersion: protocol.APIVersion,
		Lease: protocol.LeaseInfo{
			ID:           a.Lease.ID,
			InstanceID:   a.Lease.InstanceID,
			State:        string(a.Lease.StateAt(now)),
			ExpiresAt:    timePtr(a.Lease.ExpiresAt),
			SupersededAt: timePtr(a.Lease.SupersededAt),
		},
		Admission:    s.admissionState(c.Request().Context(), a.Lease.AccountID, a.Lease.InstanceID),
		Capabilities: protocol.V1Capabilities,
		Limits:       wireLimits(lim),
		DefaultSize:  s.defaultSize(scope),
		Images:       protocol.Images{Default: s.defaultImage(scope), Allowed: policy.AllowedImages(s.effectiveScope(scope))},
		Egress:       protocol.EgressInfo{Ceiling: scope.EgressCeiling},
	}
	disk, _ := s.provider.(interface{ DiskMiB(sandgate.Size) int }) // optional: the local provider's quota
	for _, sz := range scope.AllowedSizes() {
		ps := protocol.Size{Name: sz.Name, CPUCores: sz.CPUCores, MemoryMiB: sz.MemoryMiB}
		if disk != nil {
			ps.DiskMiB = disk.DiskMiB(sz)
		}
		resp.Sizes = append(resp.Sizes, ps)
	}
	return c.JSON(http.StatusOK, resp)
}

func wireLimits(l sandgate.Limits) protocol.Limits {
	return protocol.Limits{
		MaxConcurrentWorkspaces:   l.MaxConcurrentWorkspaces,
		MaxLifetimeSeconds:        secs(l.MaxLifetime),
		IdleTimeoutSeconds:        secs(l.IdleTimeout),
		MaxExecTimeoutSeconds:     secs(l.MaxExecTimeout),
		DefaultExecTimeoutSeconds: secs(l.DefaultExecTimeout),
		MaxSnapshots:              l.MaxSnapshots,
		SnapshotTTLSeconds:        secs(l.SnapshotTTL),
		MaxFileBytes:              l.MaxFileBytes,
		MaxOutputBytes:            l.MaxOutputBytes,
		MaxEnvEntries:             l.MaxEnvEntries,
		MaxEgressDomains:          l.MaxEgressDomains,
	}
}

func secs(d time.Duration) int64 { return int64(d / time.Second) }

// wireTime formats a time as the protocol does: RFC 3339, UTC, seconds.
func wireTime(t time.Time) string { return t.UTC().Truncate(time.Second).Format(time.RFC3339) }

func timePtr(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := wireTime(t)
	return &s
}

func (s *Server) defaultImage(scope sandgate.Scope) string {
	if scope.DefaultImage != "" {
		return scope.DefaultImage
	}
	return s.cfg.DefaultImage
}

// effectiveScope fills the scope's image default from the broker's.
func (s *Server) effectiveScope(scope sandgate.Scope) sandgate.Scope {
	scope.DefaultImage = s.defaultImage(scope)
	scope.Limits = scope.Limits.WithDefaults()
	return scope
}

func (s *Server) defaultSize(scope sandgate.Scope) string {
	sz, err := policy.ResolveSize(scope, "")
	if err != nil {
		return ""
	}
	return sz.Name
}

// controlsFor returns the stop and pause state that applies to an instance,
// from the cache when it is live.
func (s *Server) controlsFor(ctx context.Context, acct, inst string) (store.Controls, error) {
	now := s.clock.Now()
	key := acct + "/" + inst
	if v, ok, _ := s.controls.get(key, now); ok {
		return v, nil
	}
	_, _, gen := s.controls.get(key, now)
	v, err := s.db.ControlsFor(ctx, acct, inst)
	if err != nil {
		return store.Controls{}, err
	}
	s.controls.put(key, v, gen, now)
	return v, nil
}

// GlobalStop implements admission.StopReader from the controls cache.
func (s *Server) GlobalStop(ctx context.Context) (*store.Control, error) {
	now := s.clock.Now()
	if v, ok, _ := s.controls.get("", now); ok {
		return v.GlobalStop, nil
	}
	_, _, gen := s.controls.get("", now)
	stop, err := s.db.GlobalStop(ctx)
	if err != nil {
		return nil, err
	}
	s.controls.put("", store.Controls{GlobalStop: stop}, gen, now)
	return stop, nil
}

// admissionState is the lease's admission object. When the state cannot be
// read the broker fails closed and says so (spec §GET /v1/lease).
func (s *Server) admissionState(ctx context.Context, acct, inst string) protocol.Admission {
	c, err := s.controlsFor(ctx, acct, inst)
	if err != nil {
		return protocol.Admission{State: protocol.AdmissionPaused, Reason: "unavailable"}
	}
	now := s.clock.Now()
	switch {
	case c.GlobalStop.ActiveAt(now):
		return protocol.Admission{State: protocol.AdmissionEmergencyStopped, Reason: c.GlobalStop.Reason}
	case c.AccountStop.ActiveAt(now):
		return protocol.Admission{State: protocol.AdmissionEmergencyStopped, Reason: c.AccountStop.Reason}
	case c.AccountPause.ActiveAt(now):
		return protocol.Admission{State: protocol.AdmissionPaused, Reason: c.AccountPause.Reason}
	case c.InstancePause.ActiveAt(now):
		return protocol.Admission{State: protocol.AdmissionPaused, Reason: c.InstancePause.Reason}
	}
	return protocol.Admission{State: protocol.AdmissionOpen}
}
