package gateway

import (
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate/httpapi"
)

// routeTemplate is one route of the table: its method and its path's
// segments, a parameter written ":name".
type routeTemplate struct {
	method string
	segs   []string
}

// matches reports whether path (split at "/") fits the template: the same
// number of segments, each equal or a non-empty parameter.
func (t routeTemplate) matches(path []string) bool {
	if len(path) != len(t.segs) {
		return false
	}
	for i, seg := range t.segs {
		if strings.HasPrefix(seg, ":") {
			if path[i] == "" {
				return false
			}
		} else if path[i] != seg {
			return false
		}
	}
	return true
}

// noRoute answers a request no route serves. A path some route serves
// with other methods is 405 with Allow; any other path, a trailing slash
// included, is errNoRoute. Neither is 404 not_found, which the client
// reads as success for Release and DeleteSnapshot.
func (s *Server) noRoute(c echo.Context) error {
	path := strings.Split(c.Request().URL.EscapedPath(), "/")
	var allow []string
	for _, t := range s.table {
		if t.matches(path) {
			allow = append(allow, t.method)
		}
	}
	if len(allow) == 0 {
		return errNoRoute
	}
	c.Response().Header().Set("Allow", strings.Join(allow, ", "))
	return echo.NewHTTPError(http.StatusMethodNotAllowed)
}

// errNoRoute is the answer to a path no route serves.
var errNoRoute = httpapi.ErrNoRoute

// answerJSON answers status with v encoded, as c.JSON does but with the
// Content-Type every JSON answer carries (httpapi.ContentTypeJSON).
func answerJSON(c echo.Context, status int, v any) error {
	c.Response().Header()[echo.HeaderContentType] = jsonType
	return c.JSON(status, v)
}

// exactPath refuses a path with a trailing slash before h: echo routes
// "/v1/snapshots/x/" to the route of "/v1/snapshots/x", and no route of
// the protocol ends in a slash.
func exactPath(h echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if p := c.Request().URL.EscapedPath(); len(p) > 1 && p[len(p)-1] == '/' {
			return errNoRoute
		}
		return h(c)
	}
}
