package admin

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate/adminapi"
)

// whoamiRoutes adds GET /whoami for every role; New calls it with its
// route helper.
//
// POST /signin and POST /signout answer the same for a front end's sign-in
// and sign-out: as changes, they are audited (console.signin,
// console.signout), so the audit log shows who signed in to the console
// and from where; a refused sign-in is audited as every refusal is.
func (s *Server) whoamiRoutes(route func(method, path, action string, h echo.HandlerFunc, roles []adminapi.Role)) {
	all := []adminapi.Role{adminapi.RoleAdmin, adminapi.RoleOperator, adminapi.RoleFinance}
	route(http.MethodGet, "/whoami", "whoami", s.whoami, all)
	route(http.MethodPost, "/signin", "console.signin", s.whoami, all)
	route(http.MethodPost, "/signout", "console.signout", s.whoami, all)
}

func (s *Server) whoami(c echo.Context) error {
	t := operator(c)
	note(c).target = "console"
	return c.JSON(http.StatusOK, adminapi.Whoami{Name: t.Name, Role: t.Role, Actor: t.Actor()})
}
