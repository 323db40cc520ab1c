package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/saga"
	"github.com/sandgate/sandgate/store"
)

// leaseBody is the encoded lease answer of one auth entry, and the lease
// state and admission (as the controls say, before the provider's say)
// it was encoded for: the only inputs of the answer that change while
// the entry is cached, with the clock and with the controls' own cache.
// Everything else comes from the entry (the lease, the instance and its
// scope) and from the instance's provider, whose capabilities are fixed
// once it is open (providers.Provider).
type leaseBody struct {
	state     sandgate.LeaseState
	admission protocol.Admission
	body      []byte // as c.JSON writes it: compact, then a newline
}

// getLease answers GET /v1/lease. The answer is encoded once per auth
// cache entry and lease state and admission, and written from there while
// they hold; a query (echo's ?pretty) is answered as c.JSON would.
func (s *Server) getLease(c echo.Context) error {
	rc := reqOf(c)
	e, now := rc.auth, rc.now
	state := e.Lease.StateAt(now)
	adm := s.admissionState(c.Request().Context(), e.controlsKey, e.Lease.AccountID, e.Lease.InstanceID, now)
	plain := c.Request().URL.RawQuery == "" && !c.Echo().Debug
	if lb := e.lease.Load(); plain && lb != nil && lb.state == state && lb.admission == adm {
		return writeJSON(c, lb.body)
	}
	resp := s.leaseResponse(e.Auth, state, adm)
	if !plain {
		return answerJSON(c, http.StatusOK, resp)
	}
	body, err := json.Marshal(resp)
	if err != nil {
		return err
	}
	body = append(body, '\n')
	e.lease.Store(&leaseBody{state: state, admission: adm, body: body})
	return writeJSON(c, body)
}

// writeJSON answers 200 with body, encoded JSON, as c.JSONBlob does but
// with the Content-Type value every JSON answer shares.
func writeJSON(c echo.Context, body []byte) error {
	h := c.Response().Header()
	if v := h[echo.HeaderContentType]; len(v) == 0 || v[0] == "" {
		h[echo.HeaderContentType] = jsonType
	}
	c.Response().WriteHeader(http.StatusOK)
	_, err := c.Response().Write(body)
	return err
}

// leaseResponse is the lease answer of a at state, with adm the admission
// the controls say.
func (s *Server) leaseResponse(a store.Auth, state sandgate.LeaseState, adm protocol.Admission) protocol.LeaseResponse {
	resp := protocol.LeaseResponse{
		APIVersion: protocol.APIVersion,
		Lease: protocol.LeaseInfo{
			ID:           a.Lease.ID,
			InstanceID:   a.Lease.InstanceID,
			State:        string(state),
			ExpiresAt:    protocol.TimePtr(a.Lease.ExpiresAt),
			SupersededAt: protocol.TimePtr(a.Lease.SupersededAt),
		},
		Admission:    adm,
		Capabilities: protocol.V1Capabilities,
		Limits:       wireLimits(a.Instance.Scope.Limits.WithDefaults()),
		Egress:       protocol.EgressInfo{Ceiling: a.Instance.Scope.EgressCeiling},
		Images:       protocol.Images{Allowed: []string{}},
		Sizes:        []protocol.Size{},
	}
	// The sizes, their CPU and memory, and the images are those of the
	// instance's provider.
	scope, prov, err := s.saga.Scope(a.Instance)
	if err != nil {
		resp.Admission = protocol.Admission{State: protocol.AdmissionPaused, Reason: saga.ReasonProviderClosed}
		resp.Egress.Ceiling = []string{} // nothing is admitted: promise nothing
		return resp
	}
	if !prov.AcceptNew && resp.Admission.State == protocol.AdmissionOpen {
		resp.Admission = protocol.Admission{State: protocol.AdmissionPaused, Reason: saga.ReasonProviderClosed}
	}
	caps := prov.Provider.Capabilities()
	resp.Limits = wireLimits(scope.Limits) // clamped to what the provider honours
	resp.Egress.Ceiling = scope.EgressCeiling
	resp.DefaultSize = defaultSize(scope)
	resp.Images = protocol.Images{Default: scope.DefaultImage, Allowed: policy.AllowedImages(scope)}
	for _, sz := range scope.AllowedSizes() {
		if ps, ok := caps.Size(sz.Name); ok {
			resp.Sizes = append(resp.Sizes, protocol.Size{Name: ps.Name, CPUCores: ps.CPUCores, MemoryMiB: ps.MemoryMiB, DiskMiB: ps.DiskMiB})
		}
	}
	return resp
}

// limitsOf returns the limits of the request's instance, defaults filled.
func limitsOf(c echo.Context) sandgate.Limits {
	return authFrom(c).Instance.Scope.Limits.WithDefaults()
}

func wireLimits(l sandgate.Limits) protocol.Limits {
	return protocol.Limits{
		MaxConcurrentWorkspaces:   l.MaxConcurrentWorkspaces,
		MaxLifetimeSeconds:        secs(l.MaxLifetime),
		IdleTimeoutSeconds:        secs(l.IdleTimeout),
		MaxExecTimeoutSeconds:     secs(l.MaxExecTimeout),
		DefaultExecTimeoutSeconds: secs(l.DefaultExecTimeout),
		MaxSnapshots:              l.MaxSnapshots,
		MaxSnapshotBytes:          l.MaxSnapshotBytes,
		SnapshotTTLSeconds:        secs(l.SnapshotTTL),
		MaxFileBytes:              l.MaxFileBytes,
		MaxOutputBytes:            l.MaxOutputBytes,
		MaxEnvEntries:             l.MaxEnvEntries,
		MaxEgressDomains:          l.MaxEgressDomains,
	}
}

func secs(d time.Duration) int64 { return int64(d / time.Second) }

func defaultSize(scope sandgate.Scope) string {
	sz, err := policy.ResolveSize(scope, "")
	if err != nil {
		return ""
	}
	return sz.Name
}

// admissionState is the lease's admission object. When the state cannot be
// read the broker fails closed and says so (spec §GET /v1/lease).
// key is controlsKey(acct, inst), or "" to build it; now is the clock
// reading of the request's decision.
func (s *Server) admissionState(ctx context.Context, key, acct, inst string, now time.Time) protocol.Admission {
	if key == "" {
		key = admission.ControlsKey(acct, inst)
	}
	c, err := s.controls.ForKeyAt(ctx, key, acct, inst, now)
	if err != nil {
		return protocol.Admission{State: protocol.AdmissionPaused, Reason: "unavailable"}
	}
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
