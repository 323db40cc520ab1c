// Package admin is the operator API (/admin/v1) on its own listener:
// accounts, instances and their scope, and tokens (issue, rotate, end a
// grace period, revoke), authenticated by operator tokens with roles. It
// also holds the small client that `sandgate admin` drives it with.
package admin

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/token"
)

// Role is what an operator token may do.
type Role string

// Roles, from most to least powerful.
const (
	RoleAdmin    Role = "admin"    // everything
	RoleOperator Role = "operator" // stop, pause, revoke, read
	RoleFinance  Role = "finance"  // read usage and balances only
)

// OperatorToken is one configured operator credential. Only its SHA-256 is kept.
type OperatorToken struct {
	Name string
	Role Role
	Hash string // hex SHA-256 of the token
}

// HashToken returns the hex SHA-256 an OperatorToken keeps.
func HashToken(s sandgate.Secret) string {
	sum := sha256.Sum256([]byte(s.Reveal()))
	return hex.EncodeToString(sum[:])
}

// Config configures the operator API. A zero field means the default noted beside it.
type Config struct {
	Tokens []OperatorToken
	// Grace is a superseded token's default grace period on rotate. 0 means 1 hour.
	Grace time.Duration
	// Defaults is the scope a new instance starts from before the
	// operator's fields apply.
	Defaults sandgate.Scope
	// EgressFiltering is false when the provider cannot filter egress by
	// domain: every instance's ceiling is then [] (no network), and an
	// operator asking for more is refused.
	EgressFiltering bool
}

// Server serves /admin/v1.
type Server struct {
	cfg   Config
	db    *store.DB
	clock sandgate.Clock
	log   *slog.Logger
	roles map[string]OperatorToken
	echo  *echo.Echo
}

// New returns the operator API over db.
func New(cfg Config, db *store.DB, clock sandgate.Clock, log *slog.Logger) *Server {
	if cfg.Grace == 0 {
		cfg.Grace = time.Hour
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, db: db, clock: clock, log: log, roles: map[string]OperatorToken{}}
	for _, t := range cfg.Tokens {
		s.roles[t.Hash] = t
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			c.Response().Header().Set("Cache-Control", "no-store")
			c.Request().Body = http.MaxBytesReader(c.Response(), c.Request().Body, 1<<20)
			return next(c)
		}
	})
	g := e.Group("/admin/v1", s.authenticate)
	all := []Role{RoleAdmin, RoleOperator, RoleFinance}
	ops := []Role{RoleAdmin, RoleOperator}
	adm := []Role{RoleAdmin}
	g.POST("/accounts", s.createAccount, allow(adm...))
	g.GET("/accounts", s.listAccounts, allow(all...))
	g.POST("/instances", s.createInstance, allow(adm...))
	g.GET("/instances", s.listInstances, allow(all...))
	g.GET("/instances/:id", s.getInstance, allow(all...))
	g.GET("/instances/:id/tokens", s.listTokens, allow(ops...))
	g.POST("/instances/:id/tokens", s.issueToken(false), allow(adm...))
	g.POST("/instances/:id/tokens/rotate", s.issueToken(true), allow(adm...))
	g.POST("/instances/:id/tokens/end-grace", s.endGrace, allow(ops...))
	g.POST("/instances/:id/tokens/revoke", s.revoke, allow(ops...))
	s.echo = e
	return s
}

// Handler returns the HTTP handler of /admin/v1.
func (s *Server) Handler() http.Handler { return s.echo }

func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		scheme, raw, ok := strings.Cut(strings.TrimSpace(c.Request().Header.Get("Authorization")), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return protocol.E(protocol.Unauthenticated, "missing operator token")
		}
		t, ok := s.roles[HashToken(sandgate.Secret(strings.TrimSpace(raw)))]
		if !ok {
			return protocol.E(protocol.Unauthenticated, "unknown operator token")
		}
		c.Set("operator", t)
		return next(c)
	}
}

func allow(roles ...Role) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			t, _ := c.Get("operator").(OperatorToken)
			for _, r := range roles {
				if t.Role == r {
					return next(c)
				}
			}
			return protocol.E(protocol.Forbidden, "this operator token's role does not allow the action")
		}
	}
}

func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var pe *protocol.Error
	var he *echo.HTTPError
	switch {
	case errors.As(err, &pe):
	case errors.As(err, &he) && he.Code == http.StatusNotFound:
		pe = protocol.E(protocol.NotFound, "no such route")
	case errors.As(err, &he) && he.Code == http.StatusRequestEntityTooLarge:
		pe = protocol.E(protocol.PayloadTooLarge, "request body is over 1 MiB")
	case errors.As(err, &he) && he.Code < 500:
		pe = protocol.E(protocol.InvalidRequest, "invalid request")
	default:
		pe = &protocol.Error{Code: protocol.Internal, Message: "internal error", Err: err}
	}
	if pe.Code.Status() >= 500 {
		s.log.Error("operator request failed", slog.String("route", c.Path()), slog.Any("err", err))
	}
	_ = c.JSON(pe.Code.Status(), protocol.Envelope{Error: protocol.EnvelopeError{
		Code: pe.Code, Message: pe.Message, Retryable: pe.Code.Retryable(), Details: map[string]any{},
	}})
}

func internal(err error) error {
	return &protocol.Error{Code: protocol.Internal, Message: "the broker store failed", Err: err}
}

func invalid(msg string) error { return protocol.E(protocol.InvalidRequest, msg) }

func (s *Server) createAccount(c echo.Context) error {
	var req CreateAccountRequest
	if err := decodeStrict(c, &req); err != nil {
		return err
	}
	name := strings.TrimSpace(req.Name)
	if name == "" || len(name) > 200 {
		return invalid("name is required (at most 200 characters)")
	}
	a := sandgate.Account{ID: sandgate.NewID(sandgate.PrefixAccount), Name: name, CreatedAt: s.clock.Now()}
	if err := s.db.CreateAccount(c.Request().Context(), a); err != nil {
		return internal(err)
	}
	return c.JSON(http.StatusCreated, Account{ID: a.ID, Name: a.Name, CreatedAt: wireTime(a.CreatedAt)})
}

func (s *Server) listAccounts(c echo.Context) error {
	as, err := s.db.Accounts(c.Request().Context())
	if err != nil {
		return internal(err)
	}
	out := make([]Account, 0, len(as))
	for _, a := range as {
		out = append(out, Account{ID: a.ID, Name: a.Name, CreatedAt: wireTime(a.CreatedAt)})
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) createInstance(c echo.Context) error {
	var req CreateInstanceRequest
	if err := decodeStrict(c, &req); err != nil {
		return err
	}
	ctx := c.Request().Context()
	if _, err := s.db.Account(ctx, req.AccountID); errors.Is(err, store.ErrNotFound) {
		return protocol.E(protocol.NotFound, "no such account")
	} else if err != nil {
		return internal(err)
	}
	scope, err := s.mergeScope(req.Scope)
	if err != nil {
		return err
	}
	in := sandgate.Instance{ID: sandgate.NewID(sandgate.PrefixInstance), AccountID: req.AccountID, Name: req.Name, Scope: scope, CreatedAt: s.clock.Now()}
	if err := s.db.PutInstance(ctx, in); err != nil {
		return internal(err)
	}
	return c.JSON(http.StatusCreated, toInstance(in))
}

// mergeScope lays the operator's fields over the defaults and validates the result.
func (s *Server) mergeScope(w Scope) (sandgate.Scope, error) {
	req := toScope(w)
	out := s.cfg.Defaults
	if req.Sizes != nil {
		out.Sizes = req.Sizes
	}
	if req.DefaultSize != "" {
		out.DefaultSize = req.DefaultSize
	}
	if req.Images != nil {
		out.Images = req.Images
	}
	if req.DefaultImage != "" {
		out.DefaultImage = req.DefaultImage
	}
	switch {
	case w.AnyEgress && w.EgressCeiling != nil:
		return sandgate.Scope{}, invalid("set either any_egress or egress_ceiling, not both")
	case w.AnyEgress:
		out.EgressCeiling = nil
	case w.EgressCeiling != nil:
		out.EgressCeiling = req.EgressCeiling
	}
	if !s.cfg.EgressFiltering {
		if out.EgressCeiling == nil || len(out.EgressCeiling) > 0 {
			if w.AnyEgress || w.EgressCeiling != nil {
				return sandgate.Scope{}, invalid("this broker's provider cannot filter egress by domain; the only allowed egress ceiling is [] (no network)")
			}
		}
		out.EgressCeiling = []string{}
	}
	l, d := req.Limits, &out.Limits
	setI := func(dst *int, v int) {
		if v != 0 {
			*dst = v
		}
	}
	setD := func(dst *time.Duration, v time.Duration) {
		if v != 0 {
			*dst = v
		}
	}
	setI(&d.MaxConcurrentWorkspaces, l.MaxConcurrentWorkspaces)
	setD(&d.MaxLifetime, l.MaxLifetime)
	setD(&d.IdleTimeout, l.IdleTimeout)
	setD(&d.MaxExecTimeout, l.MaxExecTimeout)
	setD(&d.DefaultExecTimeout, l.DefaultExecTimeout)
	setI(&d.MaxSnapshots, l.MaxSnapshots)
	setD(&d.SnapshotTTL, l.SnapshotTTL)
	if l.MaxFileBytes != 0 {
		d.MaxFileBytes = l.MaxFileBytes
	}
	if l.MaxOutputBytes != 0 {
		d.MaxOutputBytes = l.MaxOutputBytes
	}
	setI(&d.MaxEnvEntries, l.MaxEnvEntries)
	setI(&d.MaxEgressDomains, l.MaxEgressDomains)
	out.Limits = out.Limits.WithDefaults()
	if err := policy.ValidateScope(out); err != nil {
		return sandgate.Scope{}, invalid("invalid scope: " + err.Error())
	}
	return out, nil
}

func (s *Server) listInstances(c echo.Context) error {
	ctx := c.Request().Context()
	acct := c.QueryParam("account")
	var accts []string
	if acct != "" {
		accts = []string{acct}
	} else {
		as, err := s.db.Accounts(ctx)
		if err != nil {
			return internal(err)
		}
		for _, a := range as {
			accts = append(accts, a.ID)
		}
	}
	out := []Instance{}
	for _, a := range accts {
		ins, err := s.db.Instances(ctx, a)
		if err != nil {
			return internal(err)
		}
		for _, in := range ins {
			out = append(out, toInstance(in))
		}
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) instance(c echo.Context) (sandgate.Instance, error) {
	in, err := s.db.Instance(c.Request().Context(), c.Param("id"))
	if errors.Is(err, store.ErrNotFound) {
		return in, protocol.E(protocol.NotFound, "no such instance")
	}
	if err != nil {
		return in, internal(err)
	}
	return in, nil
}

func (s *Server) getInstance(c echo.Context) error {
	in, err := s.instance(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, toInstance(in))
}

func (s *Server) listTokens(c echo.Context) error {
	in, err := s.instance(c)
	if err != nil {
		return err
	}
	ls, err := s.db.Leases(c.Request().Context(), in.AccountID, in.ID)
	if err != nil {
		return internal(err)
	}
	now := s.clock.Now()
	out := make([]Lease, 0, len(ls))
	for _, l := range ls {
		out = append(out, toLease(l, now))
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) issueToken(rotate bool) echo.HandlerFunc {
	return func(c echo.Context) error {
		in, err := s.instance(c)
		if err != nil {
			return err
		}
		var req IssueTokenRequest
		if c.Request().ContentLength != 0 {
			if err := decodeStrict(c, &req); err != nil {
				return err
			}
		}
		if req.TTLSeconds < 0 || req.GraceSeconds < 0 {
			return invalid("ttl_seconds and grace_seconds must not be negative")
		}
		now := s.clock.Now()
		tok := token.New(token.Prefix)
		l := sandgate.Lease{
			ID: sandgate.NewID(sandgate.PrefixLease), TokenHash: token.Hash(tok), TokenPrefix: token.DisplayPrefix(tok),
			InstanceID: in.ID, AccountID: in.AccountID, IssuedAt: now,
		}
		if req.TTLSeconds > 0 {
			l.ExpiresAt = now.Add(sec(req.TTLSeconds))
		}
		grace := s.cfg.Grace
		if req.GraceSeconds > 0 {
			grace = sec(req.GraceSeconds)
		}
		if err := s.db.IssueLease(c.Request().Context(), l, rotate, now, grace); err != nil {
			return internal(err)
		}
		s.log.Info("token issued", sandgate.InstanceAttr(in.ID), slog.String(sandgate.KeyLeaseID, l.ID), slog.Bool("rotate", rotate))
		return c.JSON(http.StatusCreated, IssuedToken{Token: tok.Reveal(), LeaseID: l.ID, InstanceID: in.ID, ExpiresAt: timePtr(l.ExpiresAt)})
	}
}

func (s *Server) endGrace(c echo.Context) error {
	in, err := s.instance(c)
	if err != nil {
		return err
	}
	n, err := s.db.EndGrace(c.Request().Context(), in.AccountID, in.ID, s.clock.Now())
	if err != nil {
		return internal(err)
	}
	return c.JSON(http.StatusOK, Count{Count: n})
}

func (s *Server) revoke(c echo.Context) error {
	in, err := s.instance(c)
	if err != nil {
		return err
	}
	n, err := s.db.RevokeLeases(c.Request().Context(), in.AccountID, in.ID, s.clock.Now())
	if err != nil {
		return internal(err)
	}
	s.log.Info("tokens revoked", sandgate.InstanceAttr(in.ID), slog.Int("count", n))
	return c.JSON(http.StatusOK, Count{Count: n})
}
