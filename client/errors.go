package client

import (
	"errors"
	"io/fs"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sandgate/sandgate/protocol"
)

// ErrCommandNotStarted is matched (errors.Is) by a StartCommand refusal with
// 422 command_not_started: preflight failed before dispatch, so nothing ran
// (spec §Durable commands).
var ErrCommandNotStarted = errors.New("client: command not started")

// ErrOutcomeUnknown is matched (errors.Is) when an Exec or StartCommand got
// no answer (a transport error or its timeout): the command may or may not
// have run. Neither call is retried (spec §Idempotency and retries); after a
// StartCommand, ReadCommand learns the outcome.
var ErrOutcomeUnknown = errors.New("client: outcome unknown")

// maxMessage bounds Error.Message: the envelope's message is meant for an
// operator, and a broker that sends a page of text should not flood a log.
const maxMessage = 512

// Error is a non-2xx answer of the broker. Only the envelope's fields are
// kept: a body that is not the envelope (a load balancer's HTML 502) leaves
// Code, Message and Details empty and is keyed by Status alone, and is never
// rendered.
//
// errors.Is(err, fs.ErrNotExist) holds for file_not_found, and
// errors.Is(err, ErrCommandNotStarted) for command_not_started.
type Error struct {
	Status  int           // the HTTP status
	Code    protocol.Code // "" when the body was not the error envelope
	Message string        // the envelope's message, safe for operators; capped
	// Retryable is the envelope's retryable hint; without an envelope it is
	// true for 502 and 503, the statuses the spec retries.
	Retryable bool
	Details   map[string]any
	// RequestID is the response's X-Request-Id, or the one the client sent
	// when the response carried none.
	RequestID string
	// RetryAfter is the response's Retry-After, 0 when absent.
	RetryAfter time.Duration
}

// Error returns the status, the code and the envelope's message.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("broker answered ")
	b.WriteString(strconv.Itoa(e.Status))
	if e.Code != "" {
		b.WriteString(" ")
		b.WriteString(string(e.Code))
	} else {
		b.WriteString(" without an error envelope")
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	if e.RequestID != "" {
		b.WriteString(" (request ")
		b.WriteString(e.RequestID)
		b.WriteString(")")
	}
	return b.String()
}

// Is maps the codes the spec's client checklist names to their sentinels.
func (e *Error) Is(target error) bool {
	switch target {
	case fs.ErrNotExist:
		return e.Code == protocol.FileNotFound
	case ErrCommandNotStarted:
		return e.Code == protocol.CommandNotStarted
	}
	return false
}

// CodeOf returns the Code of the *Error in err's chain: "" for nil, for an
// error without an *Error (a transport failure), and for a non-envelope answer.
func CodeOf(err error) protocol.Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// isCode reports whether err holds an *Error with status and code.
func isCode(err error, status int, code protocol.Code) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == status && e.Code == code
}

// capMessage cuts s to maxMessage bytes on a rune boundary.
func capMessage(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= maxMessage {
		return s
	}
	s = s[:maxMessage]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}
