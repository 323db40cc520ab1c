package adminapi

import "context"

// consoleReadKey marks a request's context as a read by the operator
// console's own page (WithConsoleRead). It is unexported, so only code in
// this process can set it: a request that arrives over HTTP never has it.
type consoleReadKey struct{}

// WithConsoleRead returns ctx marked as the console reading what one of
// its pages shows. The operator API writes no audit entry for a
// successful read so marked: viewing a page is not an operator action.
// Sign-ins, changes and the exports an operator downloads are not marked,
// and are audited.
func WithConsoleRead(ctx context.Context) context.Context {
	return context.WithValue(ctx, consoleReadKey{}, true)
}

// IsConsoleRead reports whether ctx was marked by WithConsoleRead.
func IsConsoleRead(ctx context.Context) bool {
	v, _ := ctx.Value(consoleReadKey{}).(bool)
	return v
}

// StateChange is one entry of a workspace's history: the state it entered
// and when, as the broker's record keeps them (created, started, ended).
type StateChange struct {
	State string `json:"state"`
	At    string `json:"at"`
	// Reason is the termination_reason of the change to terminated.
	Reason string `json:"reason,omitempty"`
}

// WorkspaceDetail is the answer of GET /admin/v1/workspaces/{id}/detail:
// the workspace with its history and its egress.
type WorkspaceDetail struct {
	Workspace Workspace     `json:"workspace"`
	History   []StateChange `json:"history"`
	// EgressDomains are the allowed_domains it was admitted with.
	EgressDomains []string `json:"egress_domains"`
	// EgressBytesOut and EgressBytesIn are the bytes it moved through the
	// broker's egress proxy, recorded when it ends: 0 while it runs.
	EgressBytesOut int64 `json:"egress_bytes_out"`
	EgressBytesIn  int64 `json:"egress_bytes_in"`
}

// InstanceDetail is an instance of an account's detail with its tokens.
type InstanceDetail struct {
	Instance Instance `json:"instance"`
	Tokens   []Lease  `json:"tokens"`
}

// AccountDetail is the answer of GET /admin/v1/accounts/{id}. Account,
// Balance and Budgets are every role's. Instances, Limits, Workspaces and
// Refusals are only in the answer to roles admin and operator (finance
// reads no instance, token or workspace); a list that is empty is left
// out as well.
type AccountDetail struct {
	Account Account  `json:"account"`
	Balance Balance  `json:"balance"`
	Budgets []Budget `json:"budgets"`
	// Instances are the account's instances with their tokens.
	Instances []InstanceDetail `json:"instances,omitempty"`
	Limits    *RiskLimits      `json:"limits,omitempty"`
	// Workspaces are its most recently created workspaces, newest first
	// (at most 20), of every state.
	Workspaces []Workspace `json:"workspaces,omitempty"`
	// Refusals are its tokens' refused requests of the last 24 hours.
	Refusals *RefusalCounts `json:"refusals,omitempty"`
}

// RefusalCount is the number of requests refused with one protocol code.
type RefusalCount struct {
	Code  string `json:"code"`
	Count int64  `json:"count"`
}

// RefusalCounts is the answer of GET /admin/v1/refusals: the requests of
// protocol v1 refused since Since, by code, most first. Every gateway
// process counts its refusals in the broker's store, so the counts cover
// them all.
type RefusalCounts struct {
	Window string         `json:"window"`
	Since  string         `json:"since"`
	Counts []RefusalCount `json:"counts"`
}
