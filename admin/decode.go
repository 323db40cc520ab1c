package admin

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate/protocol"
)

func decodeStrict(c echo.Context, v any) error {
	dec := json.NewDecoder(c.Request().Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return protocol.E(protocol.PayloadTooLarge, "request body is over 1 MiB")
		}
		return invalid("request body is not valid JSON for this route: " + err.Error())
	}
	return nil
}
