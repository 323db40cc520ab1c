package gateway

import (
	"log/slog"
	"net/http"
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
	// req and res are Context's request and response, kept here so that
	// the chain's many reads of them are one call, not a second through
	// Context; SetRequest and SetResponse change both.
	req  *http.Request
	res  *echo.Response
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

// Request is Context's request.
func (c *reqContext) Request() *http.Request { return c.req }

// SetRequest makes r Context's request.
func (c *reqContext) SetRequest(r *http.Request) {
	c.Context.SetRequest(r)
	c.req = r
}

// Response is Context's response.
func (c *reqContext) Response() *echo.Response { return c.res }

// SetResponse makes r Context's response.
func (c *reqContext) SetResponse(r *echo.Response) {
	c.Context.SetResponse(r)
	c.res = r
}

// reqOf returns c's reqContext; nil for a context serve did not make.
func reqOf(c echo.Context) *reqContext {
	rc, _ := c.(*reqContext)
	return rc
}
