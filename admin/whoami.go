package admin

import (
	"net/http"

	"github.com/labstack/echo/v4"
)

// Whoami is the answer of GET /admin/v1/whoami: the operator token's
// configured name and role, so a front end (the console) shows only what
// the role may do. It never carries the token.
type Whoami struct {
	Name  string `json:"name"`
	Role  Role   `json:"role"`
	Actor string `json:"actor"` // as the audit log names it: name:prefix
}

// whoamiRoutes adds GET /whoami for every role; New calls it with its
// route helper.
func (s *Server) whoamiRoutes(route func(method, path, action string, h echo.HandlerFunc, roles []Role)) {
	route(http.MethodGet, "/whoami", "whoami", s.whoami, []Role{RoleAdmin, RoleOperator, RoleFinance})
}

func (s *Server) whoami(c echo.Context) error {
	t := operator(c)
	return c.JSON(http.StatusOK, Whoami{Name: t.Name, Role: t.Role, Actor: t.Actor()})
}
