package gateway

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate/openapi"
)

// serveOpenAPI answers GET /openapi/v1.json with the protocol's document,
// so that a client that can reach only the public listener can read it.
func serveOpenAPI(c echo.Context) error {
	b, err := openapi.Document(openapi.V1)
	if err != nil {
		return err
	}
	return c.Blob(http.StatusOK, "application/json; charset=utf-8", b)
}
