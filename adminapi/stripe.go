package adminapi

// StripeStatus is GET /accounts/{id}/billing/stripe: how far the
// account's usage is in Stripe Billing. Times are RFC 3339 UTC, "" when
// none.
type StripeStatus struct {
	AccountID string `json:"account_id"`
	// Enabled is true while the account has Stripe settings (customer and
	// meter event in its billing settings); the counters and dead letters
	// stay after the sync is turned off.
	Enabled   bool   `json:"enabled"`
	Customer  string `json:"customer"`
	EventName string `json:"event_name"`
	Unit      string `json:"unit"`
	Since     string `json:"since"` // entries filed before it are never sent
	// Cursor is the usage ledger stream id the sync is past ("" none yet).
	Cursor string `json:"cursor"`
	// Pending counts the entries after the cursor still to send, up to
	// 10000 (PendingMore: more wait); LagSeconds is the time since the
	// oldest of them was filed (0 when none waits).
	Pending       int     `json:"pending"`
	PendingMore   bool    `json:"pending_more"`
	OldestPending string  `json:"oldest_pending"`
	LagSeconds    float64 `json:"lag_seconds"`
	Sent          int64   `json:"sent"`          // events Stripe accepted, ever
	Failures      int64   `json:"failures"`      // failed attempts, ever
	DeadLettered  int64   `json:"dead_lettered"` // entries dead-lettered, ever
	LastError     string  `json:"last_error"`
	LastErrorAt   string  `json:"last_error_at"`
	LastSentAt    string  `json:"last_sent_at"`
	// DeadLetters are the entries the sync gave up on, oldest first;
	// Requeued those an operator retried that the next round sends.
	DeadLetters []StripeDeadLetter `json:"dead_letters"`
	Requeued    []StripeDeadLetter `json:"requeued"`
}

// StripeDeadLetter is a usage ledger entry the Stripe sync gave up on.
type StripeDeadLetter struct {
	EntryID    string `json:"entry_id"`   // the usage ledger entry id
	StreamID   string `json:"stream_id"`  // its usage ledger stream id
	Identifier string `json:"identifier"` // the meter event identifier it is sent under
	Status     int    `json:"status"`     // Stripe's HTTP status; 0 when never sent
	Error      string `json:"error"`
	Attempts   int    `json:"attempts"` // failed rounds
	At         string `json:"at"`       // when it was dead-lettered
}

// StripeRetryRequest is POST /accounts/{id}/billing/stripe/retry: the
// dead letters to send again; none means all of them.
type StripeRetryRequest struct {
	EntryIDs []string `json:"entry_ids"`
}

// StripeRetryResult is how many dead letters were requeued; the sync's
// next round sends them first.
type StripeRetryResult struct {
	Requeued int `json:"requeued"`
}
