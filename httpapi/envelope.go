package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/sandgate/sandgate/protocol"
)

// WriteError writes pe as the protocol's error envelope with status:
// details.reason when pe has a Reason, Retry-After when pe.RetryAfter > 0,
// and no body for a HEAD request. The body is encoded as echo's JSON
// answers are (encoding/json's Encoder, a newline at the end), so either
// listener's envelopes read the same.
func WriteError(w http.ResponseWriter, r *http.Request, status int, pe *protocol.Error) {
	details := pe.Details
	if pe.Reason != "" {
		if details == nil {
			details = map[string]any{}
		}
		details["reason"] = pe.Reason
	}
	if details == nil {
		details = map[string]any{}
	}
	if pe.RetryAfter > 0 {
		SetRetryAfter(w.Header(), pe.RetryAfter)
	}
	if r.Method == http.MethodHead {
		w.WriteHeader(status)
		return
	}
	w.Header().Set("Content-Type", ContentTypeJSON)
	w.WriteHeader(status)
	_, _ = w.Write(envelope(pe.Code, pe.Message, details))
}

// EnvelopeBody is the envelope of an answer written without a
// ResponseWriter (a raw connection's answer), byte for byte as WriteError
// writes it for pe with no details.
func EnvelopeBody(code protocol.Code, msg string) []byte {
	return envelope(code, msg, map[string]any{})
}

// envelope is the envelope's JSON with a newline at the end, as
// encoding/json's Encoder (and so echo) writes it.
func envelope(code protocol.Code, msg string, details map[string]any) []byte {
	b, _ := json.Marshal(protocol.Envelope{Error: protocol.EnvelopeError{
		Code: code, Message: msg, Retryable: code.Retryable(), Details: details,
	}})
	return append(b, '\n')
}

// SetRetryAfter sets h's Retry-After to d (> 0) in whole seconds
// (RetryAfterSeconds).
func SetRetryAfter(h http.Header, d time.Duration) {
	h.Set(protocol.HeaderRetryAfter, strconv.FormatInt(RetryAfterSeconds(d), 10))
}

// RetryAfterSeconds is d as Retry-After's whole seconds, rounded up and
// at least 1: a client that waits what it is told is not refused again
// for the fraction a rounding down would cut off.
func RetryAfterSeconds(d time.Duration) int64 {
	return max(int64((d+time.Second-1)/time.Second), 1)
}
