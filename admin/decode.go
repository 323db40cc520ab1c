package admin

import (
	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate/httpapi"
)

// maxBody bounds every operator request's body.
const maxBody = 1 << 20

// decodeStrict decodes the request's JSON body into v as the public
// listener does (httpapi.Decode): unknown fields, trailing data and an
// over-size body are refused, with messages that never echo
// encoding/json's own text.
func decodeStrict(c echo.Context, v any) error {
	return httpapi.Decode(c.Request(), v, maxBody)
}
