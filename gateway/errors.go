package gateway

import (
	"errors"
	"log/slog"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/httpapi"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/saga"
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
	httpapi.WriteError(c.Response(), c.Request(), status, pe)
}

func fromEchoError(he *echo.HTTPError) *protocol.Error {
	switch he.Code {
	case http.StatusNotFound:
		return errNoRoute
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

var errBadWorkspaceID = saga.ErrBadWorkspaceID
