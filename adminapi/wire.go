package adminapi

import (
	"github.com/sandgate/sandgate/protocol"
)

// Account is the operator API's account object.
type Account struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	CreatedAt string `json:"created_at"`
	// Billing is, in the account list, the account's billing state:
	// configured, free (marked free on purpose) or not_configured (its
	// acquires are refused).
	Billing string `json:"billing,omitempty"`
}

// HeaderNextCursor carries, on a page of GET /admin/v1/accounts or
// /admin/v1/instances asked for with limit, the cursor of the next page;
// it is absent on the last. (Those lists answer a JSON array, so the
// cursor cannot be in the body; the workspace list's is, as next_cursor.)
const HeaderNextCursor = "Next-Cursor"

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

// Workspace is one workspace as the operator API shows it: who owns it,
// where it runs, how long it has lived and what it has cost so far.
type Workspace struct {
	ID         string `json:"id"`
	AccountID  string `json:"account_id"`
	InstanceID string `json:"instance_id"`
	// AccountName and InstanceName are the names of its account and
	// instance, in the workspace list and a workspace's own answer.
	AccountName       string  `json:"account_name,omitempty"`
	InstanceName      string  `json:"instance_name,omitempty"`
	Provider          string  `json:"provider"`
	Label             string  `json:"label"`
	Agent             string  `json:"agent,omitempty"`
	RunID             string  `json:"run_id,omitempty"`
	Size              string  `json:"size"`
	Image             string  `json:"image"`
	State             string  `json:"state"`
	CreatedAt         string  `json:"created_at"`
	StartedAt         *string `json:"started_at"`
	ExpiresAt         string  `json:"expires_at"`
	TerminatedAt      *string `json:"terminated_at"`
	TerminationReason *string `json:"termination_reason"`
	// AgeSeconds is the whole seconds since created_at (to terminated_at
	// once it ended).
	AgeSeconds int64 `json:"age_seconds"`
	// MeteredSeconds is the whole seconds from the provider-confirmed start
	// to now (to its recorded end once terminated), rounded up, never past
	// expires_at: what it would be charged for if it ended now.
	MeteredSeconds int64  `json:"metered_seconds"`
	Currency       string `json:"currency"`          // ISO 4217; XXX without a price
	UnitPrice      int64  `json:"unit_price_micros"` // per second, micro-units
	AmountMicros   int64  `json:"amount_micros"`     // metered_seconds × unit price
	Amount         string `json:"amount"`            // amount_micros at the currency's minor units
}

// WorkspaceList is the answer of GET /admin/v1/workspaces.
type WorkspaceList struct {
	Workspaces []Workspace `json:"workspaces"`
	NextCursor *string     `json:"next_cursor"` // null on the last page
}

// Whoami is the answer of GET /admin/v1/whoami: the operator token's
// configured name and role, so a front end (the console) shows only what
// the role may do. It never carries the token.
type Whoami struct {
	Name  string `json:"name"`
	Role  Role   `json:"role"`
	Actor string `json:"actor"` // as the audit log names it: name:prefix
}

// RateCardRequest creates a rate card version: a price per second, in
// units of Currency, for every standard size. Currency is required, and a
// card keeps the currency of its first version.
type RateCardRequest struct {
	Name     string            `json:"name"`
	Currency string            `json:"currency"`
	Prices   map[string]string `json:"prices"`
}

// RateCardCurrencyRequest is the body of PUT
// /admin/v1/rate-cards/{name}/currency: the one-time migration of a card
// created before cards had currencies.
type RateCardCurrencyRequest struct {
	Currency string `json:"currency"`
}

// RateCard is one version of a rate card. Currency "" marks a card
// created before cards had currencies: accounts already on it keep its
// prices, but none can be put on it until its currency is set.
type RateCard struct {
	Name         string            `json:"name"`
	Version      int               `json:"version"`
	Currency     string            `json:"currency"`
	Prices       map[string]string `json:"prices"`
	PricesMicros map[string]int64  `json:"prices_micros"`
	CreatedAt    string            `json:"created_at"`
}

// BillingSettings are an account's billing settings. An account never
// configured reads configured false (postpaid, no rate card, currency
// XXX) and cannot acquire. Free marks an account free on purpose: no rate
// card, currency or credit limit; its workspaces cost 0 in XXX.
type BillingSettings struct {
	Configured        bool   `json:"configured"`
	RateCard          string `json:"rate_card"`
	Currency          string `json:"currency"`
	CreditLimit       string `json:"credit_limit"`
	CreditLimitMicros int64  `json:"credit_limit_micros"`
	Postpaid          bool   `json:"postpaid"`
	Free              bool   `json:"free"`
	// StripeCustomer, StripeMeterEvent and StripeUnit are the account's
	// Stripe Billing sync (StripeStatus; docs/billing.md): its Stripe
	// customer id (cus_…), its meter's event_name, and what a meter
	// event's value counts ("seconds", the default, or "micros"). In a
	// PUT a field left out keeps its value, and "" for both customer and
	// meter event turns the sync off; an answer has them while it is on.
	StripeCustomer   *string `json:"stripe_customer,omitempty"`
	StripeMeterEvent *string `json:"stripe_meter_event,omitempty"`
	StripeUnit       *string `json:"stripe_unit,omitempty"`
}

// FundsRequest is an operator credit or debit. IdempotencyKey makes a
// retry apply it once.
type FundsRequest struct {
	Amount         string `json:"amount"`
	Reason         string `json:"reason"`
	IdempotencyKey string `json:"idempotency_key"`
}

// FundsEntry is an applied credit or debit.
type FundsEntry struct {
	Kind         string  `json:"kind"`
	Amount       string  `json:"amount"`
	AmountMicros int64   `json:"amount_micros"`
	Currency     string  `json:"currency"`
	Reason       string  `json:"reason"`
	Actor        string  `json:"actor"`
	At           string  `json:"at"`
	Replayed     bool    `json:"replayed"` // the key was used before: nothing changed now
	Balance      Balance `json:"balance"`
}

// Balance is an account's funds: available = balance − holds; balance =
// credits − debits − settled.
type Balance struct {
	AccountID         string `json:"account_id"`
	Currency          string `json:"currency"`
	Postpaid          bool   `json:"postpaid"`
	Available         string `json:"available"`
	Holds             string `json:"holds"`
	Settled           string `json:"settled"`
	Balance           string `json:"balance"`
	Credits           string `json:"credits"`
	Debits            string `json:"debits"`
	CreditLimit       string `json:"credit_limit"`
	AvailableMicros   int64  `json:"available_micros"`
	HoldsMicros       int64  `json:"holds_micros"`
	SettledMicros     int64  `json:"settled_micros"`
	BalanceMicros     int64  `json:"balance_micros"`
	CreditsMicros     int64  `json:"credits_micros"`
	DebitsMicros      int64  `json:"debits_micros"`
	CreditLimitMicros int64  `json:"credit_limit_micros"`
}

// BudgetRequest sets a monthly budget; Monthly "0" removes it.
type BudgetRequest struct {
	InstanceID string `json:"instance_id,omitempty"`
	Agent      string `json:"agent,omitempty"`
	Monthly    string `json:"monthly"`
	Soft       bool   `json:"soft"`
}

// Budget is a monthly budget with this month's use (settled plus held).
type Budget struct {
	InstanceID    string `json:"instance_id,omitempty"`
	Agent         string `json:"agent,omitempty"`
	Monthly       string `json:"monthly"`
	MonthlyMicros int64  `json:"monthly_micros"`
	Soft          bool   `json:"soft"`
	Used          string `json:"used"`
	UsedMicros    int64  `json:"used_micros"`
}

// AdjustmentRequest corrects a usage ledger entry: Amount is the signed
// correction in currency units ("-1.50" refunds). Reason is required: it
// is kept, with the operator's name, on the adjustment's ledger entry, its
// usage export rows and the statement, and in the audit log.
type AdjustmentRequest struct {
	Corrects       string `json:"corrects"`
	Amount         string `json:"amount"`
	Reason         string `json:"reason"`
	IdempotencyKey string `json:"idempotency_key"`
}

// UsageSummary is the answer of GET /usage/summary.
type UsageSummary struct {
	From    string         `json:"from"`
	To      string         `json:"to"`
	GroupBy string         `json:"group_by"`
	Groups  []SummaryGroup `json:"groups"`
	// Pool is the warm pools' own time over the range: the operator's
	// cost, billed to no account and in no group or total above. One
	// line per provider, size and image; empty when the read names an
	// account, instance or agent.
	Pool []PoolLine `json:"pool"`
}

// PoolLine is the time a provider's warm sandboxes of one size and image
// existed unclaimed, summed over the whole UTC hours that start in the
// range, and its price.
type PoolLine struct {
	Provider string `json:"provider"`
	Size     string `json:"size"`
	Image    string `json:"image"`
	Seconds  int64  `json:"seconds"` // rounded up from milliseconds
	// RateCard is the card that priced it (billing.pool_rate_card); ""
	// when none is configured: Currency and Amount are "" and
	// AmountMicros 0.
	RateCard     string `json:"rate_card"`
	Currency     string `json:"currency"`
	AmountMicros int64  `json:"amount_micros"`
	Amount       string `json:"amount"`
}

// SummaryGroup totals one group's entries in one currency.
type SummaryGroup struct {
	Key          string `json:"key"`
	Currency     string `json:"currency"`
	Entries      int64  `json:"entries"`
	Workspaces   int64  `json:"workspaces"`
	Seconds      int64  `json:"seconds"`
	AmountMicros int64  `json:"amount_micros"`
	Amount       string `json:"amount"`
}

// The bodies of an operator's exec and file calls on a tenant's workspace
// (POST /workspaces/{id}/exec, …/files/read and …/files/write) are the
// protocol's own.
type (
	ExecRequest      = protocol.ExecRequest
	ExecResponse     = protocol.ExecResponse
	ReadFileRequest  = protocol.ReadFileRequest
	ReadFileResponse = protocol.ReadFileResponse
	WriteFileRequest = protocol.WriteFileRequest
)
