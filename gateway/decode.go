package gateway

import (
	"encoding/base64"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate/httpapi"
	"github.com/sandgate/sandgate/protocol"
)

// decode reads the JSON body into v strictly (httpapi.Decode).
func decode(c echo.Context, v any) error {
	return httpapi.Decode(c.Request(), v, protocol.MaxBodyBytes)
}

// decodeB64 decodes standard base64 with padding (RFC 4648 §4). Every byte
// must be of the alphabet: encoding/base64 skips CR and LF even in strict
// mode, so they are refused first.
func decodeB64(field, s string) ([]byte, error) {
	if strings.ContainsAny(s, "\r\n") {
		return nil, errInvalid(field + " is not standard base64 with padding: it contains a line break")
	}
	b, err := base64.StdEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, errInvalid(field + " is not standard base64 with padding")
	}
	return b, nil
}
