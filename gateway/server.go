package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/httpapi"
	"github.com/sandgate/sandgate/internal/livecache"
	"github.com/sandgate/sandgate/openapi"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/saga"
	"github.com/sandgate/sandgate/store"
)

// Config configures a Server. A zero field means the default noted beside it.
type Config struct {
	// TrustedProxies are the addresses from which a plaintext request with
	// X-Forwarded-Proto: https is accepted (a TLS-terminating proxy). Empty
	// means every plaintext request is refused.
	TrustedProxies []netip.Prefix
	// TerminateTimeout is read by the test wiring only (internal/sgtest):
	// the gateway calls no provider, and saga.Config's TerminateTimeout
	// bounds the calls package saga makes for a request. 0 means 30
	// seconds.
	TerminateTimeout time.Duration
	// Meter records MetricRequests. nil means no metrics are recorded.
	Meter metric.Meter
	// MaxInflightPerWorkspace caps one workspace's execs and file
	// transfers in flight in this gateway process; past it they are
	// refused with 429 rate_limited and a Retry-After. 0 means
	// DefaultInflightPerWorkspace (8).
	MaxInflightPerWorkspace int
	// MaxInflightPerInstance caps one instance's execs and file transfers
	// in flight in this gateway process, across its workspaces, the same
	// way. 0 means DefaultInflightPerInstance (16).
	MaxInflightPerInstance int
	// InflightBytes is this gateway process's budget of bytes in flight:
	// every exec reserves its worst case (its body, and max_output_bytes
	// for each stream) and every file transfer its body and contents
	// before it runs; one that does not fit is refused with 503
	// unavailable and a Retry-After. 0 means DefaultInflightBytes (256 MiB).
	InflightBytes int64
	// InflightBytesPerInstance is one instance's share of InflightBytes:
	// a request that would take an instance holding bytes in flight past
	// it is refused with 429 rate_limited and a Retry-After (an instance
	// with nothing in flight may always reserve one request). 0 means a
	// quarter of InflightBytes.
	InflightBytesPerInstance int64
	// InflightBytesPerAccount is the same share for all of one account's
	// instances together. 0 means half of InflightBytes.
	InflightBytesPerAccount int64
	// BodyReadTimeout bounds reading the body of a request that holds an
	// in-flight reservation: a body that has not arrived by then ends the
	// request (400 invalid_request) and frees its reservation. 0 means
	// DefaultBodyReadTimeout (60 seconds).
	BodyReadTimeout time.Duration
	// Tracer makes each request's server span. nil means no spans.
	Tracer trace.TracerProvider
}

// Deps are what a Server works with, built once by the broker's wiring
// (cmd/sandgate); every one is required.
type Deps struct {
	DB   *store.DB
	Saga *saga.Saga
	// Limiter is the rate limiter the Saga counts workspace routes with
	// (saga.Deps.Limiter): the same one, since both spend its buckets.
	Limiter *admission.Limiter
	// Controls reads stop and pause state; the admission pipeline reads
	// the broker-wide stop through the same one (Controls.GlobalStop).
	Controls *admission.ControlCache
	Clock    sandgate.Clock
	Log      *slog.Logger // nil discards
	// Caches are in-process caches of other packages (billing's prices)
	// that Run's invalidation subscription drives with the gateway's own.
	// Optional.
	Caches []Cache
}

// Cache is a cache outside the gateway that is trusted only while an
// invalidation subscription is up, and dropped on every invalidation.
type Cache interface {
	Invalidate()
	SetLive(live bool)
}

// MetricRequests counts requests by route (the method and route template,
// or "unmatched"), status and protocol code: bounded attributes only, never
// an id, a query or a header.
const MetricRequests = "sandgate.http.requests"

// Server serves protocol v1. Create it with New; it is safe for concurrent use.
type Server struct {
	cfg      Config
	db       *store.DB
	saga     *saga.Saga
	clock    sandgate.Clock
	log      *slog.Logger
	cache    *livecache.Cache[*authEntry]
	controls *admission.ControlCache
	limiter  *admission.Limiter
	inflight *inflight       // caps on execs and file transfers in flight
	owners   owners          // the instance of each workspace seen, for exec's reservation
	table    []routeTemplate // every route, for the answer to a request that matches none (noRoute)
	echo     *echo.Echo
	draining atomic.Bool
	// routeInfos are the labels ("METHOD /template") of every route, for the
	// metrics and the server span, and unmatched every other request's.
	routeInfos  map[routeKey]*routeInfo
	unmatched   *routeInfo
	measureSets sync.Map  // measureKey → *measureOpts
	reqs        sync.Pool // *reqContext, reused by serve
	requestIDs  httpapi.RequestIDs
	tel         serverTelemetry
	external    []Cache
	logAttrs    attrsHandler       // log's handler, when it is one; nil otherwise
	systemClock bool               // clock is the system's: a request's start is its reading (requestNow)
	refusals    chan store.Refusal // refusals to count in Redis (refusals.go)
}

// New returns a Server. A missing dependency is an error.
func New(cfg Config, d Deps) (*Server, error) {
	switch {
	case d.DB == nil:
		return nil, errors.New("gateway: no store")
	case d.Saga == nil:
		return nil, errors.New("gateway: no saga")
	case d.Limiter == nil:
		return nil, errors.New("gateway: no rate limiter")
	case d.Controls == nil:
		return nil, errors.New("gateway: no controls reader")
	case d.Clock == nil:
		return nil, errors.New("gateway: no clock")
	}
	if cfg.TerminateTimeout == 0 {
		cfg.TerminateTimeout = 30 * time.Second
	}
	log := d.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, db: d.DB, saga: d.Saga, clock: d.Clock, log: log,
		cache: livecache.New[*authEntry](), controls: d.Controls, limiter: d.Limiter, external: d.Caches,
		refusals: make(chan store.Refusal, refusalQueue)}
	s.inflight = newInflight(cfg)
	s.logAttrs, _ = log.Handler().(attrsHandler)
	switch d.Clock.(type) {
	case sandgate.SystemClock, *sandgate.SystemClock:
		s.systemClock = true
	}
	s.reqs.New = func() any { return new(reqContext) }
	s.routeInfos, s.unmatched = map[routeKey]*routeInfo{}, &routeInfo{label: "unmatched"}
	// routes fills routeInfos with its routes' infos; echo's own routes
	// (its catch-alls) get theirs here.
	s.echo = s.routes()
	for _, r := range s.echo.Routes() {
		if k := (routeKey{r.Method, r.Path}); s.routeInfos[k] == nil {
			s.routeInfos[k] = &routeInfo{label: r.Method + " " + r.Path}
		}
	}
	s.tel = newServerTelemetry(cfg, log)
	if cfg.Meter == nil {
		cfg.Meter = noop.NewMeterProvider().Meter("")
	}
	var err error
	if _, err = cfg.Meter.Int64ObservableCounter(MetricRequests, metric.WithUnit("{request}"),
		metric.WithDescription("Requests to the v1 API, by route, status and protocol code."),
		metric.WithInt64Callback(s.observeRequests)); err != nil {
		log.Warn("gateway metric not registered", slog.String("metric", MetricRequests), slog.Any(sandgate.KeyError, err))
	}
	return s, nil
}

// Handler returns the HTTP handler of /v1.
func (s *Server) Handler() http.Handler { return s.echo }

// Run keeps the auth cache's invalidation subscription up until ctx ends.
// Until it has subscribed, every request reads the token from Redis. It
// also writes the counts of refusals (refusals.go) until ctx ends.
func (s *Server) Run(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.countRefusals(ctx)
	}()
	subscribe(ctx, s.db, s.log, append([]Cache{s.cache, s.controls}, s.external...)...)
	<-done
}

func (s *Server) routes() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	// Every request, matched or not, goes through serve. echo would
	// apply middleware given to Use around the route's handler on every
	// request, allocating each closure again; the one it is given hands
	// back serve, which ends in the handler echo found for the request
	// (c.Handler(): what echo passes as next).
	serve := echo.HandlerFunc(s.serve) // a method value, made once: a closure on every call otherwise
	e.Use(func(echo.HandlerFunc) echo.HandlerFunc { return serve })
	// Every /v1 route is authenticated, unknown ones too (a 401 before a
	// 404), as echo's group middleware would do. The route's middleware is
	// applied here, once, not handed to echo, which would apply it again
	// on every request.
	v1 := e.Group("/v1")
	auth := func(ri *routeInfo, h echo.HandlerFunc, m ...echo.MiddlewareFunc) echo.HandlerFunc {
		for i := len(m) - 1; i >= 0; i-- {
			h = m[i](h)
		}
		return s.authenticate(ri, exactPath(h))
	}
	// A route's handler knows its route: it tells observe, which would
	// otherwise look it up by the request's method and template.
	route := func(method, path string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) {
		ri := new(routeInfo)
		r := v1.Add(method, path, auth(ri, h, m...))
		ri.label = r.Method + " " + r.Path
		s.routeInfos[routeKey{r.Method, r.Path}] = ri
		s.table = append(s.table, routeTemplate{method: r.Method, segs: strings.Split(r.Path, "/")})
	}
	v1.RouteNotFound("", auth(nil, s.noRoute))
	v1.RouteNotFound("/*", auth(nil, s.noRoute))
	// Routes on one workspace count against their class's limit in usable,
	// sharing the workspace read's round trip.
	read, acquire := s.rateLimit(admission.ClassRead), s.rateLimit(admission.ClassAcquire)
	route(http.MethodGet, "/lease", s.getLease, read)
	route(http.MethodPost, "/workspaces", s.acquire, acquire)
	route(http.MethodGet, "/workspaces", s.listWorkspaces, read)
	route(http.MethodGet, "/workspaces/:id", s.getWorkspace, read)
	route(http.MethodDelete, "/workspaces/:id", s.release) // cleanup is never rate limited
	route(http.MethodPost, "/workspaces/:id/exec", s.exec)
	route(http.MethodPost, "/workspaces/:id/files/read", s.readFile)
	route(http.MethodPost, "/workspaces/:id/files/write", s.writeFile)
	route(http.MethodPost, "/workspaces/:id/snapshots", s.createSnapshot)
	route(http.MethodDelete, "/snapshots/:id", s.deleteSnapshot) // cleanup is never rate limited
	route(http.MethodPut, "/workspaces/:id/commands/:identity", s.startCommand)
	route(http.MethodGet, "/workspaces/:id/commands/:identity", s.readCommand)
	route(http.MethodPost, "/workspaces/:id/commands/:identity/cancel", s.cancelCommand) // like release: never rate limited
	e.GET("/openapi/"+openapi.V1, serveOpenAPI)                                          // no token: it describes the API, it does not call it
	return e
}

// The values of the headers every response carries, shared by every
// response: net/http copies a response's headers when it writes them, and
// a Set replaces a value, never changes it in place.
var (
	noStore  = []string{"no-store"}
	jsonType = []string{httpapi.ContentTypeJSON}
)

// serve is what every request goes through, error or not, in this order:
// the headers every response carries (no-store and the request id), the
// body limit, the server span and the request's latency, the TLS check,
// the access log line and MetricRequests, panics made into 500s, and the
// refusal while draining; then the route's handler. Errors are answered
// here, as echo would answer them (its HTTPErrorHandler is handleError),
// so that they see the request's reqContext.
func (s *Server) serve(c echo.Context) error {
	h := c.Response().Header()
	h["Cache-Control"] = noStore
	var idv []string // the response's X-Request-Id: the client's, or one made here
	if idv = httpapi.ClientRequestID(c.Request().Header); idv == nil {
		idv = s.requestIDs.New()
	}
	id := idv[0]
	h[protocol.HeaderRequestID] = idv
	rc := s.reqs.Get().(*reqContext) // zero: new, or zeroed before it was put back
	rc.Context, rc.req, rc.res, rc.id = c, c.Request(), c.Response(), id
	if err := s.serveBody(rc); err != nil {
		s.handleError(err, rc)
	}
	*rc = reqContext{} // nothing of the request is kept, nor zeroed again
	s.reqs.Put(rc)
	return nil
}

// serveBody bounds the request's body and serves it. A body declared
// too large is refused before anything else, and neither logged nor
// measured.
func (s *Server) serveBody(c *reqContext) error {
	// Refuse a declared length before wrapping the body: net/http only
	// skips reading an unread body before the answer while it is its own.
	r := c.Request()
	if r.ContentLength > protocol.MaxBodyBytes {
		return protocol.E(protocol.PayloadTooLarge, "request body is over 12 MiB")
	}
	if r.Body != http.NoBody { // what net/http gives a request without a body: nothing to bound
		r.Body = http.MaxBytesReader(c.Response(), r.Body, protocol.MaxBodyBytes)
	}
	s.observe(c)
	return nil
}

// observe serves the request inside its server span (telemetry.go), and
// records its latency in MetricRequestDuration (recordDuration: in a
// batch that every collection sees). A plaintext request is refused
// there, neither logged nor counted in MetricRequests; every other is,
// once answered (accessLog).
func (s *Server) observe(c *reqContext) {
	start := time.Now()
	c.start = start
	ctx, span := s.startSpan(c)
	var code protocol.Code
	refused := s.requireTLS(c)
	if refused != nil {
		s.handleError(refused, c)
		code = protocol.CodeOf(refused)
	} else {
		code = s.answer(c)
	}
	end := time.Now()
	ri := c.route // the route's handler's, when it ran
	if ri == nil {
		ri = s.route(c)
	}
	m := s.measuresOf(ri, c.Response().Status, code)
	if refused == nil {
		s.accessLog(c.Request().Context(), c, m, code, start, end)
		if code != "" {
			s.queueRefusal(c, string(code), s.clock.Now())
		}
	}
	s.endSpan(span, c, code)
	if s.tel.duration != nil {
		s.recordDuration(ctx, m, end.Sub(start).Seconds())
	}
}

// answer runs the request's handler and answers its error, and returns
// the answer's protocol code ("" for a success).
func (s *Server) answer(c *reqContext) protocol.Code {
	err := s.handle(c)
	if err == nil {
		return ""
	}
	s.handleError(err, c)
	code := protocol.CodeOf(err)
	if he, ok := err.(*echo.HTTPError); ok && code != "" {
		code = fromEchoError(he).Code
	}
	return code
}

// handle runs the route's handler, refusing every request while the
// server drains, and makes a panic an internal error.
func (s *Server) handle(c echo.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if r == http.ErrAbortHandler {
				panic(r)
			}
			err = &protocol.Error{Code: protocol.Internal, Message: "internal error", Err: panicError{r}}
		}
	}()
	if s.draining.Load() {
		c.Response().Header().Set("Connection", "close")
		return &protocol.Error{Code: protocol.Unavailable, Message: "this gateway is shutting down; retry shortly", RetryAfter: 2 * time.Second}
	}
	return c.Handler()(c)
}

// headerValue is h.Get(key) for a key spelled canonically, as net/http
// stores a request's: without canonicalising it again.
func headerValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func requestID(c echo.Context) string {
	if rc := reqOf(c); rc != nil {
		return rc.id
	}
	return ""
}

// Drain makes the server refuse every new request with 503 unavailable
// and a Retry-After, while requests already in flight finish: the first
// step of a graceful shutdown, so clients retry on another gateway.
func (s *Server) Drain() { s.draining.Store(true) }

// requireTLS refuses plaintext (spec §Conventions), except from a trusted
// TLS-terminating proxy that says the client spoke https.
func (s *Server) requireTLS(c echo.Context) error {
	r := c.Request()
	if r.TLS != nil {
		return nil
	}
	if strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https") && s.trustedProxy(r.RemoteAddr) {
		return nil
	}
	return errInvalid("plaintext HTTP is refused; use https")
}

func (s *Server) trustedProxy(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return false
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	addr = addr.Unmap()
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// accessLog adds the request to MetricRequests and logs its line: route
// template, status, code and ids, never the URL's query, a body, a header
// value or the token. start and end are when it came and was answered.
func (s *Server) accessLog(ctx context.Context, c *reqContext, m *measureOpts, code protocol.Code, start, end time.Time) {
	m.n.Add(1)
	// The record goes to the handler directly: Logger.LogAttrs would
	// walk the stack for the caller's PC on every line, which the
	// handler (no AddSource) never writes. An attrsHandler asks Enabled
	// itself; another is asked here.
	h := s.log.Handler()
	if s.logAttrs == nil && !h.Enabled(ctx, slog.LevelInfo) {
		return
	}
	// The attributes are the reqContext's, which is reused: an array on
	// the stack would escape to the heap through the handler's interface.
	attrs := &c.logAttrs
	*attrs = [len(c.logAttrs)]slog.Attr{
		slog.String(sandgate.KeyRequestID, c.id),
		slog.String("method", c.Request().Method),
		slog.String("route", c.Path()),
		slog.Int(sandgate.KeyStatus, c.Response().Status),
		slog.Duration("duration", end.Sub(start))}
	n := 5
	if a := c.auth; a != nil && a.Lease.ID != "" {
		attrs[n], attrs[n+1] = slog.String(sandgate.KeyInstanceID, a.Lease.InstanceID), slog.String(sandgate.KeyLeaseID, a.Lease.ID)
		n += 2
	}
	if code != "" {
		attrs[n] = slog.String(sandgate.KeyCode, string(code))
		n++
	}
	if s.logAttrs != nil {
		_ = s.logAttrs.HandleAttrs(ctx, end, slog.LevelInfo, "request", attrs[:n])
		return
	}
	r := slog.NewRecord(end, slog.LevelInfo, "request", 0)
	r.AddAttrs(attrs[:n]...)
	_ = h.Handle(ctx, r)
}

// attrsHandler is a log handler that writes a line from its attributes
// without a slog.Record (telemetry's JSON handler, as `sandgate serve`
// logs): the same line as Handle of the record, without building and
// copying one (and allocating for its attributes past the fifth), and
// nothing at a level it is not Enabled for. It keeps nothing of attrs
// once it returns.
type attrsHandler interface {
	HandleAttrs(ctx context.Context, t time.Time, level slog.Level, msg string, attrs []slog.Attr) error
}

type panicError struct{ v any }

func (p panicError) Error() string { return "panic" }

// rateLimit limits the token's requests of one class. When Redis cannot be
// reached it lets the request through: the handler then meets the same
// outage and answers for itself (Acquire fails closed), and the lease can
// still report it.
func (s *Server) rateLimit(class admission.Class) echo.MiddlewareFunc {
	slot := slices.Index(limitedClasses[:], class)
	if slot < 0 {
		panic("gateway: rateLimit of a class not in limitedClasses: " + string(class))
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			var start time.Time // the limiter's clock's reading of the request (observe), not s.clock's
			if rc := reqOf(c); rc != nil {
				start = rc.start
			}
			err := s.limiter.AllowBucket(c.Request().Context(), authEntryFrom(c).bucket(s.limiter, slot), start)
			if protocol.CodeOf(err) == protocol.RateLimited {
				return err
			}
			if err != nil {
				s.log.Warn("rate limiter unavailable; request let through", slog.String(sandgate.KeyRequestID, requestID(c)), slog.Any("err", err))
			}
			return next(c)
		}
	}
}
