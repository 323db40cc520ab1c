package sandgate

import (
	"strings"
	"time"
)

// WorkspaceState is the life of one workspace, as the protocol reports it.
type WorkspaceState string

// Workspace states.
const (
	WorkspaceStarting    WorkspaceState = "starting"
	WorkspaceRunning     WorkspaceState = "running"
	WorkspaceTerminating WorkspaceState = "terminating"
	WorkspaceTerminated  WorkspaceState = "terminated"
)

// Live reports whether the state counts as live (not terminated).
func (s WorkspaceState) Live() bool { return s != WorkspaceTerminated }

// TerminationReason says why a workspace ended.
type TerminationReason string

// Termination reasons of protocol v1.
const (
	ReasonReleased         TerminationReason = "released"
	ReasonExpired          TerminationReason = "expired"
	ReasonIdle             TerminationReason = "idle"
	ReasonLeaseRevoked     TerminationReason = "lease_revoked"
	ReasonPaused           TerminationReason = "paused"
	ReasonEmergencyStopped TerminationReason = "emergency_stopped"
	ReasonOrphaned         TerminationReason = "orphaned"
	ReasonFailed           TerminationReason = "failed"
)

// EgressPolicy is the set of domains a workspace may reach. An empty,
// non-nil AllowedDomains means no network at all.
type EgressPolicy struct {
	AllowedDomains []string
}

// Workspace is one sandbox leased to an instance.
type Workspace struct {
	ID         string
	AccountID  string
	InstanceID string
	Label      string
	Size       string
	Image      string
	Agent      string
	RunID      string
	State      WorkspaceState
	// Provider is the name of the configured provider the workspace was
	// created on; every later operation goes to it. "" on records written
	// before providers had names: the provider named "local".
	Provider          string
	ProviderRef       string // the vendor's id; never shown to the client
	CreatedAt         time.Time
	StartedAt         time.Time // the provider-confirmed start; zero while starting
	ExpiresAt         time.Time
	IdleTimeout       time.Duration
	LastActivity      time.Time
	BusyUntil         time.Time // the latest deadline of its durable commands that may still run; zero when none
	TerminatedAt      time.Time // zero while live
	TerminationReason TerminationReason
	// Price is what the workspace was admitted at (package billing):
	// later rate-card changes never reach a workspace already admitted.
	Price Price
	// EgressBytesOut and EgressBytesIn are the bytes the workspace moved
	// through the broker's egress proxy (sandbox to destination, and
	// back), recorded when its end is (package termination); zero while
	// it runs, and for traffic that never passes the proxy.
	EgressBytesOut int64
	EgressBytesIn  int64
	// Domains are the allowed_domains the workspace was admitted with,
	// joined by "," (the grammar has none; "": none), for the egress
	// proxy of a gateway that did not create it (docs/egress.md). A
	// string keeps Workspace comparable.
	Domains string
}

// AllowedDomains returns Domains as a list; nil when there are none.
func (w Workspace) AllowedDomains() []string {
	if w.Domains == "" {
		return nil
	}
	return strings.Split(w.Domains, ",")
}

// Price is the rate a workspace was admitted at and the funds held for it.
// Money is int64 micro-units of Currency (see package billing).
type Price struct {
	RateCard        string // "" when the account has no rate card: price 0
	RateCardVersion int
	Currency        string // ISO 4217
	UnitMicros      int64  // per second
	HoldMicros      int64  // the worst case reserved at admission
}

// GoneAt reports whether the workspace can no longer be used at now: it is
// terminated, terminating, or past its hard deadline.
func (w Workspace) GoneAt(now time.Time) bool {
	return w.State == WorkspaceTerminated || w.State == WorkspaceTerminating || !now.Before(w.ExpiresAt)
}

// IdleAt returns when the workspace becomes idle: IdleTimeout after its
// last activity, or after its durable commands that may still run reach
// their deadline (BusyUntil), whichever is later. A running durable command
// counts as activity.
func (w Workspace) IdleAt() time.Time {
	last := w.LastActivity
	if w.BusyUntil.After(last) {
		last = w.BusyUntil
	}
	return last.Add(w.IdleTimeout)
}
