package gateway

import (
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/protocol"
)

// handleError is Echo's HTTPErrorHandler: it finds the *protocol.Error in
// err's chain and writes the envelope; anything else is 500 internal with a
// fixed message. Only 5xx are logged, with the whole chain (which never
// holds content: providers and the store keep it out of their errors).
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var pe *protocol.Error
	var he *echo.HTTPError
	switch {
	case errors.As(err, &pe):
	case errors.As(err, &he):
		pe = fromEchoError(he)
	default:
		pe = &protocol.Error{Code: protocol.Internal, Message: "internal error", Err: err}
	}
	status := pe.Code.Status()
	if he != nil && pe.Code == protocol.InvalidRequest && he.Code == http.StatusMethodNotAllowed {
		status = http.StatusMethodNotAllowed
	}
	if status >= 500 {
		s.log.Error("request failed",
			slog.String(sandgate.KeyRequestID, requestID(c)),
			slog.String(sandgate.KeyCode, string(pe.Code)),
			slog.String("route", c.Path()),
			slog.Any(sandgate.KeyError, err))
	}
	writeEnvelope(c, status, pe)
}

func writeEnvelope(c echo.Context, status int, pe *protocol.Error) {
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
		c.Response().Header().Set(protocol.HeaderRetryAfter, strconv.FormatInt(retryAfterSeconds(pe.RetryAfter), 10))
	}
	env := protocol.Envelope{Error: protocol.EnvelopeError{
		Code: pe.Code, Message: pe.Message, Retryable: pe.Code.Retryable(), Details: details,
	}}
	if c.Request().Method == http.MethodHead {
		_ = c.NoContent(status)
		return
	}
	_ = c.JSON(status, env)
}

func fromEchoError(he *echo.HTTPError) *protocol.Error {
	switch he.Code {
	case http.StatusNotFound:
		return protocol.E(protocol.NotFound, "no such route")
	case http.StatusMethodNotAllowed:
		return protocol.E(protocol.InvalidRequest, "method not allowed on this route")
	case http.StatusRequestEntityTooLarge:
		return protocol.E(protocol.PayloadTooLarge, "request body is over 12 MiB")
	case http.StatusUnauthorized:
		return protocol.E(protocol.Unauthenticated, "missing or malformed bearer token")
	}
	if he.Code >= 500 {
		return &protocol.Error{Code: protocol.Internal, Message: "internal error", Err: he}
	}
	return protocol.E(protocol.InvalidRequest, "invalid request")
}

// errInvalid is a 400 with an operator-actionable message.
func errInvalid(msg string) error { return protocol.E(protocol.InvalidRequest, msg) }

var errNotFound = protocol.E(protocol.NotFound, "no such workspace for this instance")

// retryAfterSeconds is d (> 0) as Retry-After's whole seconds, rounded
// up: a client that waits what it is told is not refused again for the
// fraction a rounding down would cut off.
func retryAfterSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}
