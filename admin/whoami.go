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
//
// POST /signin and POST /signout answer the same for a front end's sign-in
// and sign-out: as changes, they are audited (console.signin,
// console.signout), so the audit log shows who signed in to the console
// and from where; a refused sign-in is audited as every refusal is.
func (s *Server) whoamiRoutes(route func(method, path, action string, h echo.HandlerFunc, roles []Role)) {
	all := []Role{RoleAdmin, RoleOperator, RoleFinance}
	route(http.MethodGet, "/whoami", "whoami", s.whoami, all)
	route(http.MethodPost, "/signin", "console.signin", s.whoami, all)
	route(http.MethodPost, "/signout", "console.signout", s.whoami, all)
}

func (s *Server) whoami(c echo.Context) error {
	t := operator(c)
	note(c).target = "console"
	return c.JSON(http.StatusOK, Whoami{Name: t.Name, Role: t.Role, Actor: t.Actor()})
}
