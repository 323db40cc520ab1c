package gateway

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate/protocol"
)

// decode reads the JSON body into v strictly: unknown fields, trailing data
// and a body over the limit are refused (spec §Conventions).
func decode(c echo.Context, v any) error {
	body, err := io.ReadAll(c.Request().Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return protocol.E(protocol.PayloadTooLarge, "request body is over 12 MiB")
		}
		return errInvalid("could not read the request body")
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return errInvalid("request body is required")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var ute *json.UnmarshalTypeError
		switch {
		case errors.As(err, &ute):
			return errInvalid("field " + ute.Field + " has the wrong JSON type")
		case isUnknownField(err):
			// encoding/json names the field; field names are not content.
			return errInvalid("unknown request field " + unknownFieldName(err))
		}
		return errInvalid("request body is not valid JSON")
	}
	// encoding/json matches field names case-insensitively; the spec wants a
	// typo such as "Label" to fail loudly, so check the exact names too.
	var tree any
	if err := json.Unmarshal(body, &tree); err == nil {
		if name, ok := unknownKey(tree, reflect.TypeOf(v)); !ok {
			return errInvalid("unknown request field " + name)
		}
	}
	if dec.More() {
		return errInvalid("request body has data after the JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return errInvalid("request body has data after the JSON object")
	}
	return nil
}

// unknownKey walks a decoded JSON tree beside the Go type it was decoded
// into and returns the first object key that is not exactly a field's JSON
// name. Maps (such as env) take any key.
func unknownKey(tree any, t reflect.Type) (string, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch node := tree.(type) {
	case map[string]any:
		if t.Kind() != reflect.Struct {
			return "", true
		}
		fields := map[string]reflect.Type{}
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" {
				name = f.Name
			}
			if name != "-" {
				fields[name] = f.Type
			}
		}
		for k, sub := range node {
			ft, ok := fields[k]
			if !ok {
				if len(k) > 64 {
					k = k[:64]
				}
				return k, false
			}
			if name, ok := unknownKey(sub, ft); !ok {
				return name, false
			}
		}
	case []any:
		if t.Kind() != reflect.Slice {
			return "", true
		}
		for _, sub := range node {
			if name, ok := unknownKey(sub, t.Elem()); !ok {
				return name, false
			}
		}
	}
	return "", true
}

const unknownFieldPrefix = "json: unknown field "

func isUnknownField(err error) bool {
	return len(err.Error()) > len(unknownFieldPrefix) && err.Error()[:len(unknownFieldPrefix)] == unknownFieldPrefix
}

func unknownFieldName(err error) string {
	name := err.Error()[len(unknownFieldPrefix):]
	if len(name) > 66 {
		name = name[:66]
	}
	return name
}

// decodeB64 decodes standard base64 with padding (RFC 4648 §4).
func decodeB64(field, s string) ([]byte, error) {
	b, err := base64.StdEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, errInvalid(field + " is not standard base64 with padding")
	}
	return b, nil
}
