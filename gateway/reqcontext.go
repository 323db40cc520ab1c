package gateway

import (
	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate/protocol"
)

// reqContext is the echo.Context the middleware chain hands on (base
// makes it), with what the chain leaves for itself about the request:
// its id, its auth entry and its protocol code. echo's own store (Set and
// Get) would allocate a map and take a lock for each of them on every
// request; a reqContext is pooled by the Server and reused.
type reqContext struct {
	echo.Context
	id   string        // the request id (base)
	auth *authEntry    // the resolved token (authenticate); nil before
	code protocol.Code // the answer's protocol code (accessLog), for the span and the latency
}

// reqOf returns c's reqContext; nil for a context base did not make.
func reqOf(c echo.Context) *reqContext {
	rc, _ := c.(*reqContext)
	return rc
}
