// Package admin is the operator API (/admin/v1) on its own listener:
// accounts, instances and their scope, tokens (issue, rotate, end a grace
// period, revoke), emergency stops, pauses and risk limits, authenticated
// by operator tokens with roles. Every operator action and every refused
// operator request is written to the audit log. Its wire types, roles
// and client are package adminapi's.
package admin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/httpapi"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/saga"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
	"github.com/sandgate/sandgate/token"
)

// Config configures the operator API. A zero field means the default noted beside it.
type Config struct {
	Tokens []adminapi.OperatorToken
	// Grace is a superseded token's default grace period on rotate. 0 means 1 hour.
	Grace time.Duration
	// Defaults is the scope a new instance starts from before the
	// operator's fields apply.
	Defaults sandgate.Scope
	// AuditRetention is how long audit entries are kept. 0 means 400 days.
	AuditRetention time.Duration
}

// Deps are what the operator API acts through. Every field but Log is required.
type Deps struct {
	DB    *store.DB
	Clock sandgate.Clock
	Log   *slog.Logger // nil discards
	// Providers are the broker's providers: an instance names one, and its
	// scope is checked against that provider's capabilities.
	Providers *providers.Set
	// Terminator ends the running workspaces of a scope that is stopped,
	// paused or revoked: a stop that ends nothing is no stop.
	Terminator *termination.Terminator
	// Billing serves rate cards, billing settings, funds, budgets and
	// reconciliation.
	Billing *billing.Billing
	// Stripe is the Stripe Billing sync; nil when the broker runs none,
	// and its routes then answer that it is not configured.
	Stripe StripeSync
	// Meter records the operator API's metrics (MetricRequests and the
	// others); nil records none.
	Meter metric.Meter
	// Saga runs an operator's exec and file calls on a tenant's
	// workspace; nil answers them 503 unavailable.
	Saga *saga.Saga
	// Images is the broker's image store: it resolves the images of a
	// scope as it is set and serves /images; nil answers those 404.
	Images Images
}

// Server serves /admin/v1: the HTTP face of the service, whose methods
// carry out the operator actions.
type Server struct {
	*service
	// roles are the operator tokens by their hash; SetTokens swaps them
	// whole while requests read them.
	roles   atomic.Pointer[map[string]adminapi.OperatorToken]
	actions map[string]string // "METHOD /admin/v1/route" → audit action
	echo    *echo.Echo

	requestIDs httpapi.RequestIDs
	metrics    metrics
}

// New returns the operator API. A missing dependency is an error.
func New(cfg Config, deps Deps) (*Server, error) {
	switch {
	case deps.DB == nil:
		return nil, errors.New("admin: no store")
	case deps.Providers == nil:
		return nil, errors.New("admin: no providers")
	case deps.Terminator == nil:
		return nil, errors.New("admin: no terminator: stops, pauses and revocations would end no workspace")
	case deps.Billing == nil:
		return nil, errors.New("admin: no billing")
	case deps.Clock == nil:
		return nil, errors.New("admin: no clock")
	}
	if cfg.Grace == 0 {
		cfg.Grace = time.Hour
	}
	if cfg.AuditRetention == 0 {
		cfg.AuditRetention = 400 * 24 * time.Hour
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	svc := &service{cfg: cfg, db: deps.DB, clock: deps.Clock, log: deps.Log, provs: deps.Providers, term: deps.Terminator, bill: deps.Billing,
		stripe: deps.Stripe, saga: deps.Saga, images: deps.Images}
	s := &Server{service: svc, actions: map[string]string{}}
	s.SetTokens(cfg.Tokens)
	var err error
	if s.metrics, err = newMetrics(deps.Meter); err != nil {
		return nil, fmt.Errorf("admin: metrics: %w", err)
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	// The source IP of the audit log is the peer's: forwarding headers are
	// the client's to forge.
	e.IPExtractor = echo.ExtractIPDirect()
	e.HTTPErrorHandler = s.handleError
	e.Use(s.measure, s.base)
	g := e.Group("/admin/v1", s.audit, s.authenticate)
	all := []adminapi.Role{adminapi.RoleAdmin, adminapi.RoleOperator, adminapi.RoleFinance}
	ops := []adminapi.Role{adminapi.RoleAdmin, adminapi.RoleOperator}
	adm := []adminapi.Role{adminapi.RoleAdmin}
	route := func(method, path, action string, h echo.HandlerFunc, roles []adminapi.Role) {
		s.actions[method+" /admin/v1"+path] = action
		g.Add(method, path, h, allow(roles...))
	}
	route(http.MethodPost, "/accounts", "account.create", s.createAccount, adm)
	route(http.MethodGet, "/accounts", "account.list", s.listAccounts, all)
	route(http.MethodPut, "/accounts/:id/limits", "limits.set", s.setLimits, adm)
	route(http.MethodGet, "/accounts/:id/limits", "limits.get", s.getLimits, ops)
	route(http.MethodPost, "/instances", "instance.create", s.createInstance, adm)
	route(http.MethodGet, "/instances", "instance.list", s.listInstances, ops)
	route(http.MethodGet, "/instances/:id", "instance.get", s.getInstance, ops)
	route(http.MethodPut, "/instances/:id/provider", "instance.set_provider", s.setProvider, adm)
	route(http.MethodGet, "/providers", "provider.list", s.listProviders, ops)
	route(http.MethodGet, "/instances/:id/tokens", "token.list", s.listTokens, ops)
	route(http.MethodPost, "/instances/:id/tokens", "token.issue", s.issueToken(false), adm)
	route(http.MethodPost, "/instances/:id/tokens/rotate", "token.rotate", s.issueToken(true), adm)
	route(http.MethodPost, "/instances/:id/tokens/end-grace", "token.end_grace", s.endGrace, ops)
	route(http.MethodPost, "/instances/:id/tokens/revoke", "token.revoke", s.revoke, ops)
	route(http.MethodPost, "/leases/:lease/revoke", "token.revoke_lease", s.revokeLease, ops)
	route(http.MethodPost, "/stop", "stop", s.stop, ops)
	route(http.MethodPost, "/pause", "pause", s.pause, ops)
	route(http.MethodPost, "/resume", "resume", s.resume, ops)
	route(http.MethodGet, "/status", "status.read", s.status, ops)
	route(http.MethodGet, "/audit", "audit.export", s.exportAudit, ops)
	s.usageRoutes(route)
	s.workspaceRoutes(route)
	s.workspaceIORoutes(route)
	s.whoamiRoutes(route)
	s.billingRoutes(route)
	s.stripeRoutes(route)
	s.imageRoutes(route)
	s.detailRoutes(route)
	s.echo = e
	return s, nil
}

// SetTokens replaces the operator tokens the API accepts (Config.Tokens)
// with ts: a request from then on is authenticated against them, one
// already authenticated finishes as it began. The broker calls it when it
// reloads its configuration.
func (s *Server) SetTokens(ts []adminapi.OperatorToken) {
	roles := make(map[string]adminapi.OperatorToken, len(ts))
	for _, t := range ts {
		roles[t.Hash] = t
	}
	s.roles.Store(&roles)
}

// Handler returns the HTTP handler of /admin/v1.
func (s *Server) Handler() http.Handler { return s.echo }

// base sets what every answer carries: no-store, the request id (the
// client's X-Request-Id when valid, else a new one), and the body limit.
func (s *Server) base(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Response().Header()
		h.Set("Cache-Control", "no-store")
		id := httpapi.ClientRequestID(c.Request().Header)
		if id == nil {
			id = s.requestIDs.New()
		}
		c.Set(ctxRequestID, id[0])
		h[protocol.HeaderRequestID] = id
		c.Request().Body = http.MaxBytesReader(c.Response(), c.Request().Body, maxBody)
		return next(c)
	}
}

// Context keys of an operator request.
const (
	ctxRequestID = "request_id"
	ctxOperator  = "operator"
	ctxAudit     = "audit"
)

func requestID(c echo.Context) string {
	id, _ := c.Get(ctxRequestID).(string)
	return id
}

func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		scheme, raw, ok := strings.Cut(strings.TrimSpace(c.Request().Header.Get("Authorization")), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return protocol.E(protocol.Unauthenticated, "missing operator token")
		}
		t, ok := (*s.roles.Load())[token.Hash(sandgate.Secret(strings.TrimSpace(raw)))]
		if !ok {
			return protocol.E(protocol.Unauthenticated, "unknown operator token")
		}
		c.Set(ctxOperator, t)
		return next(c)
	}
}

func allow(roles ...adminapi.Role) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			t, _ := c.Get(ctxOperator).(adminapi.OperatorToken)
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
	pe := toProtocolError(err)
	if pe.Code.Status() >= 500 {
		s.log.Error("operator request failed", slog.String("route", c.Path()),
			slog.String(sandgate.KeyRequestID, requestID(c)), slog.Any("err", err))
	}
	httpapi.WriteError(c.Response(), c.Request(), pe.Code.Status(), pe)
}

// toProtocolError is the refusal err answers as; the audit log records
// the same status and code.
func toProtocolError(err error) *protocol.Error {
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
	return pe
}

// storeFailed is the answer when the store (Redis, and billing over it)
// fails: 503 unavailable with Retry-After, as the gateway answers, never
// 500 internal, which the spec keeps for a broker bug. An outage of Redis
// is the usual cause, and an operator should retry, not file a bug.
func storeFailed(err error) error {
	return &protocol.Error{Code: protocol.Unavailable, Message: "the broker cannot reach its store; retry shortly",
		RetryAfter: time.Second, Err: err}
}

func invalid(msg string) error { return protocol.E(protocol.InvalidRequest, msg) }

func (s *Server) createAccount(c echo.Context) error {
	var req adminapi.CreateAccountRequest
	if err := decodeStrict(c, &req); err != nil {
		return err
	}
	name := strings.TrimSpace(req.Name)
	if name == "" || len(name) > 200 {
		return invalid("name is required (at most 200 characters)")
	}
	a := sandgate.Account{ID: sandgate.NewID(sandgate.PrefixAccount), Name: name, CreatedAt: s.clock.Now()}
	var taken *store.NameTakenError
	if err := s.db.CreateNamedAccount(c.Request().Context(), a); errors.As(err, &taken) {
		return protocol.E(protocol.Conflict, fmt.Sprintf("account name %q is taken by account %s (names are compared ignoring case and surrounding spaces)", name, taken.AccountID))
	} else if err != nil {
		return storeFailed(err)
	}
	out := toAccount(a)
	return answer(c, http.StatusCreated, out, change{target: "account:" + a.ID, after: out}, nil)
}

// listAccounts is GET /accounts: every account, or those whose name or
// id starts with q, sorted by id (or sort), a page at a time with limit.
func (s *Server) listAccounts(c echo.Context) error {
	lq, err := parseList(c, []string{"id", "name", "created"}, "id", 0)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	as, err := s.db.Accounts(ctx)
	if err != nil {
		return storeFailed(err)
	}
	as = slices.DeleteFunc(as, func(a sandgate.Account) bool { return !lq.matches(a.Name, a.ID) })
	as, next := page(lq, as, map[string]sortKey[sandgate.Account]{
		"id":      func(a sandgate.Account) string { return a.ID },
		"name":    func(a sandgate.Account) string { return store.AccountNameKey(a.Name) },
		"created": func(a sandgate.Account) string { return timeKey(a.CreatedAt.UnixNano()) },
	}, func(a sandgate.Account) string { return a.ID })
	ids := make([]string, len(as))
	for i, a := range as {
		ids[i] = a.ID
	}
	states, err := s.bill.States(ctx, ids)
	if next != "" {
		c.Response().Header().Set(adminapi.HeaderNextCursor, next)
	}
	return listed(c, as, err, func(a sandgate.Account) adminapi.Account {
		out := toAccount(a)
		out.Billing = states[a.ID]
		return out
	})
}

func (s *Server) createInstance(c echo.Context) error {
	var req adminapi.CreateInstanceRequest
	if err := decodeStrict(c, &req); err != nil {
		return err
	}
	out, ch, err := s.service.createInstance(c.Request().Context(), req)
	return answer(c, http.StatusCreated, out, ch, err)
}

// createInstance creates an instance of an existing account, its scope
// laid over the defaults and enforceable by its provider.
func (v *service) createInstance(ctx context.Context, req adminapi.CreateInstanceRequest) (adminapi.Instance, change, error) {
	if err := v.account(ctx, req.AccountID); err != nil {
		return adminapi.Instance{}, change{}, err
	}
	prov, err := v.provider(req.Provider)
	if err != nil {
		return adminapi.Instance{}, change{}, err
	}
	scope, err := v.mergeScope(req.Scope, prov)
	if err != nil {
		return adminapi.Instance{}, change{}, err
	}
	if err := v.resolveImages(ctx, prov, scope); err != nil {
		return adminapi.Instance{}, change{}, err
	}
	in := sandgate.Instance{ID: sandgate.NewID(sandgate.PrefixInstance), AccountID: req.AccountID, Name: req.Name,
		Provider: prov.Name, Scope: scope, CreatedAt: v.clock.Now()}
	if err := v.db.PutInstance(ctx, in); err != nil {
		return adminapi.Instance{}, change{}, storeFailed(err)
	}
	out := toInstance(in)
	return out, change{target: "instance:" + in.ID, after: out}, nil
}

// provider returns the configured provider called name ("" for the
// default), refusing a name no provider has.
func (v *service) provider(name string) (*providers.Entry, error) {
	e, err := v.provs.ForInstance(name)
	if err != nil {
		return nil, invalid(fmt.Sprintf("no provider named %q is configured on this broker; configured: %s", name, strings.Join(v.provs.Names(), ", ")))
	}
	return e, nil
}

// setProvider is PUT /instances/{id}/provider: the instance's new
// workspaces run on another provider, which must enforce its scope as it
// is; running workspaces stay where they are.
func (s *Server) setProvider(c echo.Context) error {
	var req adminapi.SetProviderRequest
	if err := decodeStrict(c, &req); err != nil {
		return err
	}
	out, ch, err := s.moveInstance(c.Request().Context(), c.Param("id"), req.Provider)
	return answer(c, http.StatusOK, out, ch, err)
}

// moveInstance sets the provider the instance id's new workspaces run
// on, which must enforce its scope as it is.
func (v *service) moveInstance(ctx context.Context, id, provider string) (adminapi.Instance, change, error) {
	in, err := v.instanceByID(ctx, id)
	if err != nil {
		return adminapi.Instance{}, change{}, err
	}
	if provider == "" {
		return adminapi.Instance{}, change{}, invalid("provider is required")
	}
	prov, err := v.provider(provider)
	if err != nil {
		return adminapi.Instance{}, change{}, err
	}
	if err := prov.Provider.Capabilities().CheckScope(prov.Name, in.Scope); err != nil {
		return adminapi.Instance{}, change{}, invalid(err.Error() + "; change the instance's scope first")
	}
	if err := v.resolveImages(ctx, prov, in.Scope); err != nil {
		return adminapi.Instance{}, change{}, err
	}
	ch := change{target: "instance:" + in.ID, before: toInstance(in)}
	in.Provider = prov.Name
	if err := v.db.PutInstance(ctx, in); err != nil {
		return adminapi.Instance{}, ch, storeFailed(err)
	}
	out := toInstance(in)
	ch.after = out
	return out, ch, nil
}

// listProviders is GET /providers: the configured providers, what each
// enforces, and whether it takes new workspaces.
func (s *Server) listProviders(c echo.Context) error {
	out := []adminapi.Provider{}
	for _, e := range s.provs.All() {
		out = append(out, toProvider(e, e.Name == s.provs.Default()))
	}
	return c.JSON(http.StatusOK, out)
}

// mergeScope lays the operator's fields over the defaults and validates
// the result, and that prov can enforce it. An egress ceiling left out
// is [] on a provider that cannot filter by domain.
func (v *service) mergeScope(w adminapi.Scope, prov *providers.Entry) (sandgate.Scope, error) {
	caps := prov.Provider.Capabilities()
	req, err := toScope(w)
	if err != nil {
		return sandgate.Scope{}, err
	}
	out := v.cfg.Defaults
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
	if caps.Egress == providers.EgressNoneOnly && !w.AnyEgress && w.EgressCeiling == nil {
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
	if l.MaxSnapshotBytes != 0 {
		d.MaxSnapshotBytes = l.MaxSnapshotBytes
	}
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
	if out.DefaultImage == "" && len(out.Images) == 0 {
		out.DefaultImage = caps.DefaultImage // the provider's
	}
	if err := policy.ValidateScope(out); err != nil {
		return sandgate.Scope{}, invalid("invalid scope: " + err.Error())
	}
	if err := caps.CheckScope(prov.Name, out); err != nil {
		return sandgate.Scope{}, invalid(err.Error())
	}
	return out, nil
}

// listInstances is GET /instances: every account's instances (or one
// account's, named by id or name), or those whose name or id, or whose
// account's name, starts with q; sorted by id (or sort), a page at a time
// with limit.
func (s *Server) listInstances(c echo.Context) error {
	lq, err := parseList(c, []string{"id", "name", "created", "account"}, "id", 0)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	acct := c.QueryParam("account")
	if acct != "" {
		if acct, err = s.accountByRef(ctx, acct); err != nil {
			return err
		}
	}
	out, err := s.instances(ctx, acct)
	if err != nil {
		return err
	}
	acctNames := map[string]string{}
	if lq.q != "" || lq.col == "account" {
		as, err := s.db.Accounts(ctx)
		if err != nil {
			return storeFailed(err)
		}
		for _, a := range as {
			acctNames[a.ID] = a.Name
		}
	}
	out = slices.DeleteFunc(out, func(in adminapi.Instance) bool { return !lq.matches(in.Name, in.ID, acctNames[in.AccountID]) })
	out, next := page(lq, out, map[string]sortKey[adminapi.Instance]{
		"id":      func(in adminapi.Instance) string { return in.ID },
		"name":    func(in adminapi.Instance) string { return strings.ToLower(in.Name) },
		"created": func(in adminapi.Instance) string { return in.CreatedAt },
		"account": func(in adminapi.Instance) string { return store.AccountNameKey(acctNames[in.AccountID]) },
	}, func(in adminapi.Instance) string { return in.ID })
	if next != "" {
		c.Response().Header().Set(adminapi.HeaderNextCursor, next)
	}
	return c.JSON(http.StatusOK, out)
}

// instances lists acct's instances, or every account's when acct is "".
func (v *service) instances(ctx context.Context, acct string) ([]adminapi.Instance, error) {
	accts := []string{acct}
	if acct == "" {
		var err error
		if accts, err = v.accountIDs(ctx, ""); err != nil {
			return nil, err
		}
	}
	out := []adminapi.Instance{}
	for _, a := range accts {
		ins, err := v.db.Instances(ctx, a)
		if err != nil {
			return nil, storeFailed(err)
		}
		for _, in := range ins {
			out = append(out, toInstance(in))
		}
	}
	return out, nil
}

func (s *Server) instance(c echo.Context) (sandgate.Instance, error) {
	return s.instanceByID(c.Request().Context(), c.Param("id"))
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
	out, err := s.leases(c.Request().Context(), in)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) issueToken(rotate bool) echo.HandlerFunc {
	return func(c echo.Context) error {
		in, err := s.instance(c)
		if err != nil {
			return err
		}
		var req adminapi.IssueTokenRequest
		if err := decodeOptional(c, &req); err != nil {
			return err
		}
		if req.TTLSeconds < 0 || req.GraceSeconds < 0 {
			return invalid("ttl_seconds and grace_seconds must not be negative")
		}
		if err := cmp.Or(checkSeconds("ttl_seconds", req.TTLSeconds), checkSeconds("grace_seconds", req.GraceSeconds)); err != nil {
			return err
		}
		out, ch, err := s.service.issueToken(c.Request().Context(), in, req, rotate)
		return answer(c, http.StatusCreated, out, ch, err)
	}
}

func (s *Server) endGrace(c echo.Context) error {
	in, err := s.instance(c)
	if err != nil {
		return err
	}
	out, ch, err := s.service.endGrace(c.Request().Context(), in)
	return answer(c, http.StatusOK, out, ch, err)
}

// revokeLease revokes one token, named by its lease id, as immediately as
// revoke: every gateway's auth cache is invalidated before the answer. The
// instance's other tokens (a rotated token's successor) keep working, and
// so its workspaces keep running: they belong to the instance, not to the
// token.
func (s *Server) revokeLease(c echo.Context) error {
	out, ch, err := s.service.revokeLease(c.Request().Context(), c.Param("lease"), operator(c).Actor())
	return answer(c, http.StatusOK, out, ch, err)
}

// revoke revokes every token of an instance and, unless the operator
// keeps them, terminates its running workspaces (lease_revoked).
func (s *Server) revoke(c echo.Context) error {
	in, err := s.instance(c)
	if err != nil {
		return err
	}
	var req adminapi.RevokeRequest
	if err := decodeOptional(c, &req); err != nil {
		return err
	}
	terminate := req.TerminateWorkspaces == nil || *req.TerminateWorkspaces
	out, ch, err := s.service.revoke(c.Request().Context(), in, terminate, operator(c).Actor())
	return answer(c, http.StatusOK, out, ch, err)
}

// accountParam returns the account the route's :id names. Returns NotFound.
func (s *Server) accountParam(c echo.Context) (string, error) {
	acct := c.Param("id")
	return acct, s.account(c.Request().Context(), acct)
}

// accountRequest returns the account the route's :id names and decodes
// the body into req. Returns NotFound, before any complaint about the body.
func (s *Server) accountRequest(c echo.Context, req any) (string, error) {
	acct, err := s.accountParam(c)
	if err != nil {
		return "", err
	}
	return acct, decodeStrict(c, req)
}

// listed answers a list the store read, each item as conv renders it,
// or unavailable when the read failed.
func listed[T, W any](c echo.Context, items []T, err error, conv func(T) W) error {
	if err != nil {
		return storeFailed(err)
	}
	out := make([]W, 0, len(items))
	for _, it := range items {
		out = append(out, conv(it))
	}
	return c.JSON(http.StatusOK, out)
}

// accountGet answers a read of the account the route's :id names:
// NotFound for an unknown account, unavailable when read fails.
func accountGet[T any](c echo.Context, v *service, read func(ctx context.Context, acct string) (T, error)) error {
	ctx, acct := c.Request().Context(), c.Param("id")
	if err := v.account(ctx, acct); err != nil {
		return err
	}
	out, err := read(ctx, acct)
	if err != nil {
		return storeFailed(err)
	}
	return c.JSON(http.StatusOK, out)
}

// decodeOptional decodes a body the route lets the client leave out.
func decodeOptional(c echo.Context, v any) error {
	if c.Request().ContentLength == 0 {
		return nil
	}
	return decodeStrict(c, v)
}

// queryTime parses the query parameter name, an RFC 3339 time, into dst;
// an absent parameter leaves dst as it is.
func queryTime(c echo.Context, name string, dst *time.Time) error {
	v := c.QueryParam(name)
	if v == "" {
		return nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return invalid(name + " must be an RFC 3339 time, for example 2026-01-02T15:04:05Z")
	}
	*dst = t
	return nil
}
