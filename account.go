package sandgate

import "time"

// Account is one tenant of the broker. It owns instances.
type Account struct {
	ID        string
	Name      string
	CreatedAt time.Time
}

// Instance is one client install (a Formation instance). Workspaces,
// snapshots and idempotency keys belong to the instance, not to its token.
type Instance struct {
	ID        string
	AccountID string
	Name      string
	// Provider names the configured provider new workspaces of the
	// instance run on; "" means the broker's default provider. Changing
	// it affects new workspaces only.
	Provider  string
	Scope     Scope
	CreatedAt time.Time
}
