package protocol

import (
	"errors"
	"net/http"
	"time"
)

// Code is a protocol v1 error code. Clients branch on it only.
type Code string

// Error codes of protocol v1.
const (
	InvalidRequest        Code = "invalid_request"
	Unauthenticated       Code = "unauthenticated"
	LeaseExpired          Code = "lease_expired"
	LeaseSuperseded       Code = "lease_superseded"
	LeaseRevoked          Code = "lease_revoked"
	InsufficientFunds     Code = "insufficient_funds"
	BudgetExhausted       Code = "budget_exhausted"
	Paused                Code = "paused"
	EmergencyStopped      Code = "emergency_stopped"
	NotFound              Code = "not_found"
	FileNotFound          Code = "file_not_found"
	IdempotencyConflict   Code = "idempotency_conflict"
	IdempotencyInProgress Code = "idempotency_in_progress"
	WorkspaceNotReady     Code = "workspace_not_ready"
	WorkspaceGone         Code = "workspace_gone"
	SnapshotGone          Code = "snapshot_gone"
	PayloadTooLarge       Code = "payload_too_large"
	FileTooLarge          Code = "file_too_large"
	SizeNotAllowed        Code = "size_not_allowed"
	ImageNotAllowed       Code = "image_not_allowed"
	EgressRequired        Code = "egress_required"
	EgressNotAllowed      Code = "egress_not_allowed"
	SnapshotQuotaExceeded Code = "snapshot_quota_exceeded"
	NotAFile              Code = "not_a_file"
	CommandNotStarted     Code = "command_not_started"
	ConcurrencyLimit      Code = "concurrency_limit"
	RiskLimit             Code = "risk_limit"
	RateLimited           Code = "rate_limited"
	Internal              Code = "internal"
	UpstreamError         Code = "upstream_error"
	AdmissionUnavailable  Code = "admission_unavailable"
	Unavailable           Code = "unavailable"
	// Forbidden is not a v1 client code: the operator API uses it for a
	// token whose role does not allow the action.
	Forbidden Code = "forbidden"
	// Conflict is not a v1 client code: the operator API uses it for a
	// change the present state forbids (an account name taken, a rate
	// card's currency already set).
	Conflict Code = "conflict"
)

var statuses = map[Code]int{
	InvalidRequest:        http.StatusBadRequest,
	Unauthenticated:       http.StatusUnauthorized,
	LeaseExpired:          http.StatusUnauthorized,
	LeaseSuperseded:       http.StatusUnauthorized,
	LeaseRevoked:          http.StatusUnauthorized,
	InsufficientFunds:     http.StatusPaymentRequired,
	BudgetExhausted:       http.StatusPaymentRequired,
	Paused:                http.StatusForbidden,
	EmergencyStopped:      http.StatusForbidden,
	Forbidden:             http.StatusForbidden,
	Conflict:              http.StatusConflict,
	NotFound:              http.StatusNotFound,
	FileNotFound:          http.StatusNotFound,
	IdempotencyConflict:   http.StatusConflict,
	IdempotencyInProgress: http.StatusConflict,
	WorkspaceNotReady:     http.StatusConflict,
	WorkspaceGone:         http.StatusGone,
	SnapshotGone:          http.StatusGone,
	PayloadTooLarge:       http.StatusRequestEntityTooLarge,
	FileTooLarge:          http.StatusRequestEntityTooLarge,
	SizeNotAllowed:        http.StatusUnprocessableEntity,
	ImageNotAllowed:       http.StatusUnprocessableEntity,
	EgressRequired:        http.StatusUnprocessableEntity,
	EgressNotAllowed:      http.StatusUnprocessableEntity,
	SnapshotQuotaExceeded: http.StatusUnprocessableEntity,
	NotAFile:              http.StatusUnprocessableEntity,
	CommandNotStarted:     http.StatusUnprocessableEntity,
	ConcurrencyLimit:      http.StatusTooManyRequests,
	RiskLimit:             http.StatusTooManyRequests,
	RateLimited:           http.StatusTooManyRequests,
	Internal:              http.StatusInternalServerError,
	UpstreamError:         http.StatusBadGateway,
	AdmissionUnavailable:  http.StatusServiceUnavailable,
	Unavailable:           http.StatusServiceUnavailable,
}

// Status returns the HTTP status of the code; 500 for an unknown code.
func (c Code) Status() int {
	if s, ok := statuses[c]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// Retryable reports the envelope's retryable hint for the code.
func (c Code) Retryable() bool {
	switch c {
	case IdempotencyInProgress, WorkspaceNotReady, RateLimited, ConcurrencyLimit, RiskLimit,
		Internal, UpstreamError, AdmissionUnavailable, Unavailable:
		return true
	}
	return false
}

// Error is a refusal a client may see. Message is safe for operators; Err is
// for logs only and is never rendered.
type Error struct {
	Code       Code
	Message    string
	RetryAfter time.Duration // Retry-After on 429/503 when > 0
	Reason     string        // details.reason, where the spec defines one
	Details    map[string]any
	Err        error
}

// E returns an *Error with code and message.
func E(code Code, msg string) *Error { return &Error{Code: code, Message: msg} }

func (e *Error) Error() string {
	if e.Err != nil {
		return string(e.Code) + ": " + e.Message + ": " + e.Err.Error()
	}
	return string(e.Code) + ": " + e.Message
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// CodeOf finds the Error in err's chain: "" for nil, Internal for anything else.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Code
	}
	return Internal
}

// Envelope is the body of every non-2xx response.
type Envelope struct {
	Error EnvelopeError `json:"error"`
}

// EnvelopeError is the error object inside Envelope.
type EnvelopeError struct {
	Code      Code           `json:"code"`
	Message   string         `json:"message"`
	Retryable bool           `json:"retryable"`
	Details   map[string]any `json:"details"`
}
