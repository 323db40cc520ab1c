package gateway

import "github.com/labstack/echo/v4"

// reqContext is the echo.Context the middleware chain hands on (serve
// makes it), with what the chain leaves for itself about the request:
// its id and its auth entry. echo's own store (Set and Get) would
// allocate a map and take a lock for each of them on every request; a
// reqContext is pooled by the Server and reused.
type reqContext struct {
	echo.Context
	id   string     // the request id (serve)
	auth *authEntry // the resolved token (authenticate); nil before
}

// reqOf returns c's reqContext; nil for a context serve did not make.
func reqOf(c echo.Context) *reqContext {
	rc, _ := c.(*reqContext)
	return rc
}
