package gateway

import (
	"log/slog"
	"time"

	"github.com/labstack/echo/v4"
)

// reqContext is the echo.Context the middleware chain hands on (serve
// makes it), with what the chain leaves for itself about the request:
// its id, its auth entry and the clock reading it was checked at. echo's
// own store (Set and Get) would allocate a map and take a lock for each of
// them on every request; a reqContext is pooled by the Server and reused.
type reqContext struct {
	echo.Context
	id   string     // the request id (serve)
	auth *authEntry // the resolved token (authenticate); nil before
	// route is the request's route, set by its handler (authenticate);
	// nil for a request echo routed to no route of the table (and
	// before): observe looks that one's up (Server.route).
	route *routeInfo
	now   time.Time // Server.clock when authenticate checked the token: the request's decisions' clock
	// start is time.Now when observe began serving the request.
	start time.Time
	// logAttrs are the access log line's attributes (accessLog).
	logAttrs [8]slog.Attr
}

// reqOf returns c's reqContext; nil for a context serve did not make.
func reqOf(c echo.Context) *reqContext {
	rc, _ := c.(*reqContext)
	return rc
}
