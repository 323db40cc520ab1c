package sandgate

import "time"

// LeaseState is the state of a token's grant.
type LeaseState string

// Lease states. Only active and superseded tokens authenticate.
const (
	LeaseActive     LeaseState = "active"
	LeaseSuperseded LeaseState = "superseded"
	LeaseExpired    LeaseState = "expired"
	LeaseRevoked    LeaseState = "revoked"
	// LeasePostGrace is a superseded token past its grace period.
	LeasePostGrace LeaseState = "post_grace"
)

// Lease is the grant a token carries: it authenticates exactly one instance.
// Only the token's hash is stored.
type Lease struct {
	ID           string
	TokenHash    string
	TokenPrefix  string // the first characters of the token, safe to show an operator
	InstanceID   string
	AccountID    string
	IssuedAt     time.Time
	ExpiresAt    time.Time // zero: never
	SupersededAt time.Time // zero: not superseded
	GraceUntil   time.Time // meaningful when SupersededAt is set
	RevokedAt    time.Time // zero: not revoked
}

// StateAt reports the lease's state at now.
func (l Lease) StateAt(now time.Time) LeaseState {
	switch {
	case !l.RevokedAt.IsZero():
		return LeaseRevoked
	case !l.ExpiresAt.IsZero() && !now.Before(l.ExpiresAt):
		return LeaseExpired
	case !l.SupersededAt.IsZero() && !now.Before(l.GraceUntil):
		return LeasePostGrace
	case !l.SupersededAt.IsZero():
		return LeaseSuperseded
	}
	return LeaseActive
}
