// Package flytest is a fake Fly Machines API server for tests: TLS on
// loopback, with a CA file a client can trust through SSL_CERT_FILE. It
// behaves like Fly as the fact sheet describes it (the token scheme,
// apps, Machine states and wait with its deadline answers, exec answering
// JSON strings, the list's metadata filter and summaries, metadata,
// network policies, auto_destroy when the main process exits,
// config.files echoed in every config, error bodies), and it runs
// each Machine for real as a workspace of the local provider (bwrap) that
// behaves like Fly's Firecracker VM (guest.go): one pid namespace shared
// by the main process and every exec, the host's network (the guest
// reaches the host's loopback, as a real one reaches the internet; see
// [StartCanary]), a root with every capability inside the guest, and the
// FLY_* environment. Network policies are recorded, not enforced: what
// policy a Machine started under is kept so tests can check it.
package flytest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/internal/fakeserver"
	"github.com/sandgate/sandgate/providers/local"
)

// Options configures a Server. A zero field means the default noted beside it.
type Options struct {
	// Token is the one token the server accepts; required. A macaroon
	// (fm1r_, fm1a_, fm2_) must come as "FlyV1 TOKEN", any other as
	// "Bearer TOKEN".
	Token string
	// DataDir holds the Machines' workspaces and the CA file; required.
	DataDir string
	// Orgs are the organisations apps may be created in; nil means any.
	Orgs []string
	// MaxWait caps one wait request, whatever its timeout asks; 0 means
	// the request's timeout. Wait400 answers a wait that ran out with a
	// 400 deadline_exceeded instead of a 408.
	MaxWait time.Duration
	Wait400 bool
	// StartDelay delays every Machine's start.
	StartDelay time.Duration
	// ExecDeadline answers 408 deadline_exceeded to an exec still running
	// after it (third parties report about 30s at Fly); 0 means none
	// beyond the request's own timeout.
	ExecDeadline time.Duration
	// ExecOctetStream answers exec with the raw stdout as
	// application/octet-stream (the OpenAPI lists it beside JSON), with no
	// exit status.
	ExecOctetStream bool
	// PageSize > 0 answers machine lists as {machines, next_cursor}
	// pages of that size instead of a bare array.
	PageSize int
	Logger   *slog.Logger
}

// Server is the fake. Safe for concurrent use.
type Server struct {
	opts   Options
	srv    *httptest.Server
	local  *local.Provider
	caFile string
	log    *slog.Logger
	ctx    context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	apps     map[string]*app
	machines map[string]*Machine
	lose     map[string]int // "METHOD pattern" → answers still to lose
	refuse   map[string]int // "METHOD pattern" → requests still to refuse with 429
	failCmds int            // execs still to fail in the guest (FailCommands)
	failCode int
	requests []Request
}

type app struct {
	name, org, key string
	id             string
	policies       []NetworkPolicy
}

// Request is one request the server answered, for tests: never a body,
// only its size.
type Request struct {
	Method, Path string
	Query        string
	Status       int
	BodyBytes    int64
	AnswerBytes  int64 // the answer's body
}

// Machine is the fake's view of one Machine. Tests read copies of it
// through [Server.Machine].
type Machine struct {
	ID, App    string
	State      string
	InstanceID string
	Region     string
	Config     MachineConfig
	rawConfig  json.RawMessage
	CreatedAt  time.Time
	// Egress is the egress a network policy left the Machine when it
	// started: "open" (no policy), "deny-all" (only port 0, which no
	// connection can use) or "ports" (some real port). The fake does not
	// enforce it: every guest has the host's network.
	Egress string
	// EgressAtFirstExec is Egress as it stood at the first exec, "" before one.
	EgressAtFirstExec string
	Execs             int
	ExitCode          *int // the main process's, once it exited
	DestroyedAt       time.Time
	events            []eventJSON
	ws                providers.Sandbox
	started           chan struct{}
}

// New starts a server.
func New(ctx context.Context, o Options) (*Server, error) {
	if o.Token == "" || o.DataDir == "" {
		return nil, errors.New("flytest: Token and DataDir are required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	lp, err := local.New(ctx, local.Config{DataDir: filepath.Join(o.DataDir, "machines"), GuestVM: true, HostDirs: true},
		providers.Env{BrokerID: "flytest", Logger: o.Logger})
	if err != nil {
		return nil, fmt.Errorf("flytest: %w", err)
	}
	s := &Server{opts: o, local: lp, log: o.Logger, apps: map[string]*app{}, machines: map[string]*Machine{}, lose: map[string]int{}, refuse: map[string]int{}}
	s.ctx, s.stop = context.WithCancel(context.Background())
	if s.srv, s.caFile, err = fakeserver.StartTLS(s.handler(), o.DataDir); err != nil {
		return nil, fmt.Errorf("flytest: %w", err)
	}
	return s, nil
}

// URL is the base URL, for FLY_FLAPS_BASE_URL.
func (s *Server) URL() string { return s.srv.URL }

// CAFile is the PEM file of the server's certificate, for SSL_CERT_FILE.
func (s *Server) CAFile() string { return s.caFile }

// Transport trusts the server's certificate.
func (s *Server) Transport() http.RoundTripper { return s.srv.Client().Transport }

// Close destroys every Machine and stops the server.
func (s *Server) Close() {
	s.srv.Close()
	s.stop()
	s.mu.Lock()
	var live []*Machine
	for _, m := range s.machines {
		if m.State != "destroyed" {
			live = append(live, m)
		}
	}
	s.mu.Unlock()
	for _, m := range live {
		s.destroy(m, "closed")
	}
	s.wg.Wait()
	// Belt and braces: no workspace of the fake outlives it.
	if sbs, err := s.local.List(context.Background()); err == nil {
		for _, sb := range sbs {
			s.local.Terminate(context.Background(), sb)
		}
	}
	// Its parent cgroups go too, with nothing left in them.
	s.local.Close()
}

// Machine returns a copy of the Machine id.
func (s *Server) Machine(id string) (Machine, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.machines[id]
	if !ok {
		return Machine{}, false
	}
	return *m, true
}

// Machines returns copies of every Machine, destroyed ones included.
func (s *Server) Machines() []Machine {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Machine, 0, len(s.machines))
	for _, m := range s.machines {
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b Machine) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out
}

// Policies returns the app's network policies.
func (s *Server) Policies(appName string) []NetworkPolicy {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.apps[appName]; a != nil {
		return slices.Clone(a.policies)
	}
	return nil
}

// Requests returns the requests answered so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// LoseAnswers makes the next n requests to route (e.g. "POST /v1/apps")
// happen, but answer 502 instead of their answer, as a lost answer would.
func (s *Server) LoseAnswers(route string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lose[route] = n
}

// RateLimit makes the next n requests to route answer 429 without
// doing anything, as Fly's rate limiter does.
func (s *Server) RateLimit(route string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse[route] = n
}

// FailCommands makes the commands of the next n execs fail in the guest
// at once, exiting with code and printing nothing; each exec is answered
// as such a command's would be (with no exit status over octet-stream).
func (s *Server) FailCommands(n, code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failCmds, s.failCode = n, code
}

// CreateApp creates an app directly, as if made beforehand.
func (s *Server) CreateApp(name, org string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.apps[name] = &app{name: name, org: org, id: randomID()}
}

func randomID() string {
	var b [7]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	route := func(pattern string, h func(w http.ResponseWriter, r *http.Request) (int, any)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			r.Body = &countingBody{ReadCloser: r.Body}
			if !s.authorized(r) {
				s.answer(w, r, pattern, http.StatusUnauthorized, errorResponse{Error: "Authenticate: token validation error"})
				return
			}
			s.mu.Lock()
			limited := s.refuse[pattern] > 0
			if limited {
				s.refuse[pattern]--
			}
			s.mu.Unlock()
			if limited {
				s.answer(w, r, pattern, http.StatusTooManyRequests, errorResponse{Error: "rate limit exceeded"})
				return
			}
			status, body := h(w, r)
			s.answer(w, r, pattern, status, body)
		})
	}
	route("POST /v1/apps", s.createApp)
	route("GET /v1/apps/{app}", s.getApp)
	route("GET /v1/apps/{app}/machines", s.listMachines)
	route("POST /v1/apps/{app}/machines", s.createMachine)
	route("GET /v1/apps/{app}/machines/{id}", s.getMachine)
	route("DELETE /v1/apps/{app}/machines/{id}", s.destroyMachine)
	route("GET /v1/apps/{app}/machines/{id}/wait", s.waitMachine)
	route("POST /v1/apps/{app}/machines/{id}", s.updateMachine)
	route("POST /v1/apps/{app}/machines/{id}/start", s.startMachine)
	route("POST /v1/apps/{app}/machines/{id}/stop", s.stopMachine)
	route("POST /v1/apps/{app}/machines/{id}/exec", s.execMachine)
	route("GET /v1/apps/{app}/machines/{id}/metadata", s.getMetadata)
	route("PATCH /v1/apps/{app}/machines/{id}/metadata", s.patchMetadata)
	route("POST /v1/apps/{app}/network_policies", s.createPolicy)
	route("GET /v1/apps/{app}/network_policies/{$}", s.listPolicies)
	route("DELETE /v1/apps/{app}/network_policies/{pid}", s.deletePolicy)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.answer(w, r, "", http.StatusNotFound, errorResponse{Error: "not found"})
	})
	return mux
}

// authorized checks the Authorization header by fly-go's scheme rule.
func (s *Server) authorized(r *http.Request) bool {
	tok := strings.TrimSpace(s.opts.Token)
	for _, p := range []string{"FlyV1 ", "Bearer "} {
		tok = strings.TrimPrefix(tok, p)
	}
	want := "Bearer " + tok
	if pre, _, _ := strings.Cut(tok, "_"); pre == "fm1r" || pre == "fm1a" || pre == "fm2" {
		want = "FlyV1 " + tok
	}
	return r.Header.Get("Authorization") == want
}

// answer writes status and body as JSON with a fly-request-id, or a lost
// answer's 502 when the route is set to lose it.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, pattern string, status int, body any) {
	if status == 0 {
		return // the client went away
	}
	var n int64
	if cb, ok := r.Body.(*countingBody); ok {
		io.Copy(io.Discard, cb) // what the handler did not read
		n = cb.n
	}
	var out []byte // outside the lock: an answer may hold megabytes
	ctype := "application/json"
	switch b := body.(type) {
	case nil:
	case rawBody:
		out, ctype = b, "application/octet-stream"
	default:
		out, _ = json.Marshal(b)
		out = append(out, '\n')
	}
	s.mu.Lock()
	if n := s.lose[pattern]; n > 0 {
		s.lose[pattern] = n - 1
		status, body, out = http.StatusBadGateway, nil, nil
	}
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Status: status, BodyBytes: n, AnswerBytes: int64(len(out))})
	s.mu.Unlock()
	w.Header().Set("fly-request-id", randomID())
	if body == nil {
		w.WriteHeader(status)
		return
	}
	w.Header().Set("Content-Type", ctype)
	w.WriteHeader(status)
	w.Write(out)
}

// countingBody counts the bytes of a request's body.
type countingBody struct {
	io.ReadCloser
	n int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	return n, err
}

// privateIP is every Machine's 6PN address, as the API and FLY_PRIVATE_IP show it.
const privateIP = "fdaa::1"

// rawBody is an answer sent as application/octet-stream.
type rawBody []byte

func errAnswer(status int, code, msg string) (int, any) {
	return status, errorResponse{Error: msg, Status: code}
}

// decodeStrict decodes r's body into v, refusing unknown fields.
func decodeStrict(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<20))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func (s *Server) createApp(_ http.ResponseWriter, r *http.Request) (int, any) {
	var req createAppRequest
	if err := decodeStrict(r, &req); err != nil {
		return errAnswer(http.StatusBadRequest, "", "invalid request body: "+err.Error())
	}
	if req.Name == "" || req.OrgSlug == "" {
		return errAnswer(http.StatusBadRequest, "", "name and org_slug are required")
	}
	if s.opts.Orgs != nil && !slices.Contains(s.opts.Orgs, req.OrgSlug) {
		return errAnswer(http.StatusNotFound, "", "organization not found")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.apps[req.Name]; a != nil {
		if req.IdempotencyKey != "" && a.key == req.IdempotencyKey {
			return http.StatusCreated, map[string]any{"id": a.id, "created_at": time.Now().UnixMilli()}
		}
		return errAnswer(http.StatusUnprocessableEntity, "name_taken", "Name has already been taken")
	}
	a := &app{name: req.Name, org: req.OrgSlug, key: req.IdempotencyKey, id: randomID()}
	s.apps[req.Name] = a
	return http.StatusCreated, map[string]any{"id": a.id, "created_at": time.Now().UnixMilli()}
}

func (s *Server) getApp(_ http.ResponseWriter, r *http.Request) (int, any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.apps[r.PathValue("app")]
	if a == nil {
		return errAnswer(http.StatusNotFound, "", "app not found")
	}
	return http.StatusOK, map[string]any{"id": a.id, "name": a.name, "organization": map[string]string{"slug": a.org}, "status": "deployed"}
}

// app returns the request's app, or an answer.
func (s *Server) app(r *http.Request) (*app, int, any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.apps[r.PathValue("app")]
	if a == nil {
		st, b := errAnswer(http.StatusNotFound, "", "app not found")
		return nil, st, b
	}
	return a, 0, nil
}

func (s *Server) createPolicy(_ http.ResponseWriter, r *http.Request) (int, any) {
	a, st, b := s.app(r)
	if a == nil {
		return st, b
	}
	var np NetworkPolicy
	if err := decodeStrict(r, &np); err != nil {
		return errAnswer(http.StatusBadRequest, "", "invalid request body: "+err.Error())
	}
	if np.Name == "" {
		return errAnswer(http.StatusBadRequest, "", "name is required")
	}
	for _, rule := range np.Rules {
		if rule.Action != "allow" || (rule.Direction != "egress" && rule.Direction != "ingress") {
			return errAnswer(http.StatusBadRequest, "", "a rule needs action allow and direction egress or ingress")
		}
		for _, p := range rule.Ports {
			if (p.Protocol != "tcp" && p.Protocol != "udp") || p.Port < 0 || p.Port > 65535 {
				return errAnswer(http.StatusBadRequest, "", "a port needs protocol tcp or udp and a port number")
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if np.ID == "" {
		np.ID = "np_" + randomID()
	}
	a.policies = slices.DeleteFunc(a.policies, func(p NetworkPolicy) bool { return p.ID == np.ID })
	a.policies = append(a.policies, np)
	return http.StatusCreated, np
}

func (s *Server) listPolicies(_ http.ResponseWriter, r *http.Request) (int, any) {
	a, st, b := s.app(r)
	if a == nil {
		return st, b
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return http.StatusOK, append([]NetworkPolicy{}, a.policies...)
}

func (s *Server) deletePolicy(_ http.ResponseWriter, r *http.Request) (int, any) {
	a, st, b := s.app(r)
	if a == nil {
		return st, b
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a.policies = slices.DeleteFunc(a.policies, func(p NetworkPolicy) bool { return p.ID == r.PathValue("pid") })
	return http.StatusNoContent, nil
}

// egressOf is the egress the app's policies leave m, at its start.
func egressOf(a *app, m *Machine) string {
	rules, open := 0, false
	for _, np := range a.policies {
		sel := np.Selector
		match := sel.All || slices.ContainsFunc(sel.Machines, func(x struct {
			ID string `json:"id"`
		}) bool {
			return x.ID == m.ID
		})
		if len(sel.Metadata) > 0 {
			match = true
			for k, v := range sel.Metadata {
				if m.Config.Metadata[k] != v {
					match = false
				}
			}
		}
		if !match {
			continue
		}
		for _, rule := range np.Rules {
			if rule.Direction != "egress" {
				continue
			}
			rules++
			for _, p := range rule.Ports {
				if p.Port != 0 {
					open = true
				}
			}
			if len(rule.Ports) == 0 {
				open = true // the reading in which [] allows every port
			}
		}
	}
	switch {
	case rules == 0:
		return "open"
	case open:
		return "ports"
	}
	return "deny-all"
}

func (s *Server) createMachine(_ http.ResponseWriter, r *http.Request) (int, any) {
	a, st, b := s.app(r)
	if a == nil {
		return st, b
	}
	req, cfg, st, b := decodeMachineRequest(r)
	if st != 0 {
		return st, b
	}
	now := time.Now()
	m := &Machine{ID: randomID(), App: a.name, State: "created", InstanceID: strings.ToUpper(randomID() + randomID())[:26],
		Region: cmpOr(req.Region, "iad"), Config: cfg, rawConfig: req.Config, CreatedAt: now, started: make(chan struct{})}
	s.mu.Lock()
	s.machines[m.ID] = m
	m.event("launch", "created", nil)
	s.mu.Unlock()
	if !req.SkipLaunch {
		s.wg.Add(1)
		go s.run(m)
	}
	return http.StatusOK, s.view(m)
}

// decodeMachineRequest decodes and checks a create or update body; a
// non-zero status is the refusal to answer.
func decodeMachineRequest(r *http.Request) (req createMachineRequest, cfg MachineConfig, status int, body any) {
	if err := decodeStrict(r, &req); err != nil {
		status, body = errAnswer(http.StatusBadRequest, "", "invalid request body: "+err.Error())
		return
	}
	dec := json.NewDecoder(bytes.NewReader(req.Config))
	dec.DisallowUnknownFields()
	if len(req.Config) == 0 || dec.Decode(&cfg) != nil {
		status, body = errAnswer(http.StatusBadRequest, "", "invalid config")
		return
	}
	if cfg.Image == "" {
		status, body = errAnswer(http.StatusUnprocessableEntity, "", "config.image is required")
		return
	}
	if msg := checkFiles(cfg.Files); msg != "" {
		status, body = errAnswer(http.StatusBadRequest, "invalid_argument", "invalid_argument: "+msg)
		return
	}
	g := Guest{CPUKind: "shared", CPUs: 1, MemoryMB: 256}
	if cfg.Guest != nil {
		g = *cfg.Guest
	}
	lo, hi := 256, 2048
	if g.CPUKind == "performance" {
		lo, hi = 2048, 8192
	} else if g.CPUKind != "shared" {
		status, body = errAnswer(http.StatusUnprocessableEntity, "", "unknown cpu_kind")
		return
	}
	if g.CPUs < 1 || g.MemoryMB < lo*g.CPUs || g.MemoryMB > hi*g.CPUs || (g.CPUKind == "shared" && g.CPUs > 8) {
		status, body = errAnswer(http.StatusUnprocessableEntity, "", "invalid guest: memory out of range for its cpus")
	}
	return
}

// updateMachine replaces the config of a Machine that is not running
// (created with skip_launch, or stopped), which gets a new version; it
// stays as it is until a start. A running Machine's update would reboot
// it, which the fake does not model: 412.
func (s *Server) updateMachine(_ http.ResponseWriter, r *http.Request) (int, any) {
	req, cfg, st, b := decodeMachineRequest(r)
	if st != 0 {
		return st, b
	}
	m, st, b := s.machine(r)
	if m == nil {
		return st, b
	}
	s.mu.Lock()
	if m.State != "created" && m.State != "stopped" {
		s.mu.Unlock()
		return errAnswer(http.StatusPreconditionFailed, "", "failed_precondition: the fake updates only a machine that is not running")
	}
	m.Config, m.rawConfig = cfg, req.Config
	m.InstanceID = strings.ToUpper(randomID() + randomID())[:26]
	m.event("update", m.State, nil)
	s.mu.Unlock()
	return http.StatusOK, s.view(m)
}

// getMetadata answers a Machine's metadata, a map (sheet §1.3).
func (s *Server) getMetadata(_ http.ResponseWriter, r *http.Request) (int, any) {
	m, st, b := s.machine(r)
	if m == nil {
		return st, b
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	md := maps.Clone(m.Config.Metadata)
	if md == nil {
		md = map[string]string{}
	}
	return http.StatusOK, md
}

// patchMetadata is the bulk metadata update (sheet §1.3): each key given
// is set, and a null or "" value removes it; 412 when machine_version is
// not the Machine's version. Nothing else of the Machine changes: it
// neither reboots nor gets a new version.
func (s *Server) patchMetadata(_ http.ResponseWriter, r *http.Request) (int, any) {
	var req metadataRequest
	if err := decodeStrict(r, &req); err != nil || req.Metadata == nil {
		return errAnswer(http.StatusBadRequest, "", "invalid request body")
	}
	m, st, b := s.machine(r)
	if m == nil {
		return st, b
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if req.MachineVersion != "" && req.MachineVersion != m.InstanceID {
		return errAnswer(http.StatusPreconditionFailed, "", "failed_precondition: machine_version does not match")
	}
	md := maps.Clone(m.Config.Metadata)
	if md == nil {
		md = map[string]string{}
	}
	for k, v := range req.Metadata {
		if v == nil || *v == "" {
			delete(md, k)
		} else {
			md[k] = *v
		}
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(m.rawConfig, &raw); err != nil {
		return errAnswer(http.StatusInternalServerError, "", "config not decodable")
	}
	raw["metadata"], _ = json.Marshal(md)
	m.rawConfig, _ = json.Marshal(raw)
	m.Config.Metadata = md
	return http.StatusNoContent, nil
}

// startMachine boots a Machine created with skip_launch; a stopped one
// has ended for good in this fake (its sandbox is gone): 412.
func (s *Server) startMachine(_ http.ResponseWriter, r *http.Request) (int, any) {
	m, st, b := s.machine(r)
	if m == nil {
		return st, b
	}
	if state, ok := s.launch(m); !ok {
		return errAnswer(http.StatusPreconditionFailed, "", "failed_precondition: machine is "+state)
	}
	return http.StatusOK, map[string]any{"previous_state": "created"}
}

// launch boots m if it has never started; otherwise it reports m's state.
func (s *Server) launch(m *Machine) (state string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.State != "created" {
		return m.State, false
	}
	m.State = "starting"
	s.wg.Add(1)
	go s.run(m)
	return "", true
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// event records an event; s.mu is held.
func (m *Machine) event(typ, status string, req map[string]any) {
	m.events = append(m.events, eventJSON{ID: randomID(), Type: typ, Status: status, Source: "flyd", Timestamp: time.Now().UnixMilli(), Request: req})
}

// run starts m and watches its main process until it exits.
func (s *Server) run(m *Machine) {
	defer s.wg.Done()
	ctx := s.ctx
	s.setState(m, "starting")
	if d := s.opts.StartDelay; d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return
		}
	}
	g := Guest{CPUs: 1, MemoryMB: 256}
	if m.Config.Guest != nil {
		g = *m.Config.Guest
	}
	ws, err := s.local.Create(ctx, providers.CreateSpec{
		WorkspaceID: m.ID, InstanceID: m.App,
		Size:   sandgate.Size{Name: "fly", CPUCores: g.CPUs, MemoryMiB: g.MemoryMB},
		Image:  local.Image,
		Env:    flyEnv(m, privateIP),
		Egress: sandgate.EgressPolicy{AllowedDomains: []string{}},
		// A backstop should the fake itself die; Machines end long before.
		ExpiresAt: time.Now().Add(3 * time.Hour),
	})
	if err != nil {
		s.log.Error("flytest: machine not started", sandgate.KeyError, err)
		s.setState(m, "failed")
		return
	}
	s.mu.Lock()
	if m.State == "destroyed" || m.State == "destroying" {
		// Destroyed while it was being made: nothing may keep running.
		s.mu.Unlock()
		s.local.Terminate(context.Background(), ws)
		return
	}
	m.ws = ws
	m.Egress = egressOf(s.apps[m.App], m)
	s.mu.Unlock()
	files, err := stageFiles(filepath.Join(s.opts.DataDir, "machines", "workspaces", ws.Ref, "tmp"), m.Config.Files)
	if err != nil {
		s.log.Error("flytest: files not staged", sandgate.KeyError, err)
		s.destroy(m, "failed")
		return
	}
	init := []string{"sleep", "2147483647"}
	if m.Config.Init != nil && len(m.Config.Init.Exec) > 0 {
		init = m.Config.Init.Exec
	}
	argv := append([]string{"sh", "-c", bootScript(m, files) + agentScript, "sh"}, init...)
	if err := s.local.StartCommand(ctx, ws, "main", providers.ExecSpec{Argv: argv}); err != nil {
		s.log.Error("flytest: main process not started", sandgate.KeyError, err)
		s.destroy(m, "failed")
		return
	}
	for {
		res, err := s.local.Exec(ctx, ws, providers.ExecSpec{Argv: []string{"sh", "-c", readyScript}, Timeout: 10 * time.Second})
		if err == nil && res.ExitCode == 0 {
			break
		}
		if st, err := s.local.ReadCommand(ctx, ws, "main", 0); ctx.Err() != nil || errors.Is(err, providers.ErrSandboxGone) || (err == nil && st.State != providers.CommandRunning) {
			break // the main process ended first: the watch below sees it
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.mu.Lock()
	if m.State == "starting" {
		m.State = "started"
		m.event("start", "started", nil)
	}
	close(m.started)
	s.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
		s.mu.Lock()
		gone := m.State == "destroyed"
		s.mu.Unlock()
		if gone {
			return
		}
		st, err := s.local.ReadCommand(ctx, ws, "main", 0)
		if errors.Is(err, providers.ErrSandboxGone) {
			s.destroy(m, "gone")
			return
		}
		if err != nil || st.State == providers.CommandRunning {
			continue
		}
		code := st.ExitCode
		s.mu.Lock()
		m.ExitCode = &code
		m.State = "stopped"
		m.event("exit", "stopped", map[string]any{"exit_event": map[string]any{"exit_code": code, "requested_stop": false}})
		policy := ""
		if m.Config.Restart != nil {
			policy = m.Config.Restart.Policy
		}
		autoDestroy := m.Config.AutoDestroy && (policy == "no" || policy == "")
		s.mu.Unlock()
		if autoDestroy {
			s.destroy(m, "auto_destroy")
		} else {
			s.local.Terminate(context.Background(), ws)
		}
		return
	}
}

func (s *Server) setState(m *Machine, state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.State != "destroyed" {
		m.State = state
		m.event(state, state, nil)
	}
}

// destroy kills m and marks it destroyed.
func (s *Server) destroy(m *Machine, why string) {
	s.mu.Lock()
	if m.State == "destroyed" {
		s.mu.Unlock()
		return
	}
	m.State = "destroying"
	ws := m.ws
	s.mu.Unlock()
	if ws.Ref != "" {
		if err := s.local.Terminate(context.Background(), ws); err != nil {
			s.log.Error("flytest: machine not terminated", sandgate.KeyError, err)
		}
	}
	s.mu.Lock()
	m.State = "destroyed"
	m.DestroyedAt = time.Now()
	m.event("destroy", "destroyed", map[string]any{"reason": why})
	s.mu.Unlock()
}

// machine returns the request's Machine, or an answer.
func (s *Server) machine(r *http.Request) (*Machine, int, any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.apps[r.PathValue("app")] == nil {
		st, b := errAnswer(http.StatusNotFound, "", "app not found")
		return nil, st, b
	}
	m := s.machines[r.PathValue("id")]
	if m == nil || m.App != r.PathValue("app") {
		st, b := errAnswer(http.StatusNotFound, "", "machine not found")
		return nil, st, b
	}
	return m, 0, nil
}

// view is m's JSON; s.mu must not be held.
func (s *Server) view(m *Machine) machineJSON {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.viewLocked(m)
}

func (s *Server) viewLocked(m *Machine) machineJSON {
	evs := slices.Clone(m.events)
	slices.Reverse(evs) // newest first, as Fly lists them
	return machineJSON{ID: m.ID, Name: "m-" + m.ID, State: m.State, Region: m.Region, InstanceID: m.InstanceID,
		PrivateIP: privateIP, Config: m.rawConfig, HostStatus: "ok", Events: evs,
		CreatedAt: m.CreatedAt.UTC().Format(time.RFC3339), UpdatedAt: time.Now().UTC().Format(time.RFC3339)}
}

func (s *Server) getMachine(_ http.ResponseWriter, r *http.Request) (int, any) {
	m, st, b := s.machine(r)
	if m == nil {
		return st, b
	}
	return http.StatusOK, s.view(m)
}

func (s *Server) listMachines(_ http.ResponseWriter, r *http.Request) (int, any) {
	a, st, b := s.app(r)
	if a == nil {
		return st, b
	}
	q := r.URL.Query()
	want := map[string]string{}
	for k, v := range q {
		if key, ok := strings.CutPrefix(k, "metadata."); ok {
			want[key] = v[0]
		}
	}
	var states []string
	if v := q.Get("state"); v != "" {
		states = strings.Split(v, ",")
	}
	deleted := q.Get("include_deleted") == "true"
	s.mu.Lock()
	var all []*Machine
	for _, m := range s.machines {
		if m.App != a.name || (!deleted && m.State == "destroyed") || (states != nil && !slices.Contains(states, m.State)) {
			continue
		}
		ok := true
		for k, v := range want {
			if m.Config.Metadata[k] != v {
				ok = false
			}
		}
		if ok {
			all = append(all, m)
		}
	}
	slices.SortFunc(all, func(x, y *Machine) int { return strings.Compare(x.ID, y.ID) })
	summary := q.Get("summary") == "true"
	views := make([]machineJSON, 0, len(all))
	for _, m := range all {
		v := s.viewLocked(m)
		if summary { // no config, no events (sheet §1.3)
			v.Config, v.Events = nil, nil
		}
		views = append(views, v)
	}
	s.mu.Unlock()
	if s.opts.PageSize <= 0 {
		return http.StatusOK, views
	}
	start := 0
	if c := q.Get("cursor"); c != "" {
		start = slices.IndexFunc(views, func(v machineJSON) bool { return v.ID > c })
		if start < 0 {
			start = len(views)
		}
	}
	end := min(start+s.opts.PageSize, len(views))
	next := ""
	if end < len(views) {
		next = views[end-1].ID
	}
	return http.StatusOK, map[string]any{"machines": views[start:end], "next_cursor": next}
}

func (s *Server) destroyMachine(_ http.ResponseWriter, r *http.Request) (int, any) {
	m, st, b := s.machine(r)
	if m == nil {
		return st, b
	}
	s.mu.Lock()
	state := m.State
	s.mu.Unlock()
	force := r.URL.Query().Get("force") == "true" || r.URL.Query().Get("kill") == "true"
	if state == "destroyed" {
		return http.StatusOK, map[string]bool{"ok": true}
	}
	if !force && (state == "started" || state == "starting") {
		return errAnswer(http.StatusPreconditionFailed, "", "failed_precondition: machine still active, refusing to delete")
	}
	s.destroy(m, "api")
	return http.StatusOK, map[string]bool{"ok": true}
}

func (s *Server) stopMachine(_ http.ResponseWriter, r *http.Request) (int, any) {
	m, st, b := s.machine(r)
	if m == nil {
		return st, b
	}
	s.mu.Lock()
	ws, state := m.ws, m.State
	s.mu.Unlock()
	if state != "started" {
		return errAnswer(http.StatusPreconditionFailed, "", "failed_precondition: machine not started")
	}
	s.local.CancelCommand(r.Context(), ws, "main")
	return http.StatusOK, map[string]any{"ok": true}
}

// waitMachine answers once m is in one of the states asked (default
// started), or 408 (a 400 with Wait400) when the wait runs out.
func (s *Server) waitMachine(_ http.ResponseWriter, r *http.Request) (int, any) {
	m, st, b := s.machine(r)
	if m == nil {
		return st, b
	}
	q := r.URL.Query()
	states := []string{"started"}
	if v := q["state"]; len(v) > 0 {
		states = nil
		for _, x := range v {
			states = append(states, strings.Split(x, ",")...)
		}
	}
	for _, x := range states {
		if !slices.Contains([]string{"started", "stopped", "suspended", "destroyed", "failed", "settled"}, x) {
			return errAnswer(http.StatusBadRequest, "invalid_argument", "invalid_argument: unknown state")
		}
	}
	secs := 60
	if v := q.Get("timeout"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 60 {
			return errAnswer(http.StatusBadRequest, "invalid_argument", "invalid_argument: timeout must be between 1 and 60 seconds")
		}
		secs = n
	}
	wait := time.Duration(secs) * time.Second
	if s.opts.MaxWait > 0 {
		wait = min(wait, s.opts.MaxWait)
	}
	deadline := time.Now().Add(wait)
	for {
		s.mu.Lock()
		state := m.State
		s.mu.Unlock()
		if slices.Contains(states, state) {
			return http.StatusOK, map[string]any{"ok": true, "state": state, "version": m.InstanceID, "event_id": randomID()}
		}
		if time.Now().After(deadline) {
			if s.opts.Wait400 {
				return errAnswer(http.StatusBadRequest, "", "deadline_exceeded: timed out waiting for machine state")
			}
			return errAnswer(http.StatusRequestTimeout, "", "Request timed out")
		}
		select {
		case <-r.Context().Done():
			return 0, nil
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// execMachine runs the request's argv through the Machine's agent and
// answers stdout and stderr as JSON strings: bytes that are not UTF-8 do
// not survive them, as at Fly.
func (s *Server) execMachine(_ http.ResponseWriter, r *http.Request) (int, any) {
	m, st, b := s.machine(r)
	if m == nil {
		return st, b
	}
	var req execRequest
	if err := decodeStrict(r, &req); err != nil {
		return errAnswer(http.StatusBadRequest, "", "invalid request body: "+err.Error())
	}
	argv := req.Command
	if len(argv) == 0 {
		argv = strings.Fields(req.Cmd)
	}
	if len(argv) == 0 {
		return errAnswer(http.StatusBadRequest, "", "command is required")
	}
	s.mu.Lock()
	state, ws := m.State, m.ws
	if state == "started" {
		m.Execs++
		if m.EgressAtFirstExec == "" {
			m.EgressAtFirstExec = m.Egress
		}
	}
	s.mu.Unlock()
	switch state {
	case "started":
	case "destroyed":
		return errAnswer(http.StatusNotFound, "", "machine not found")
	default:
		return errAnswer(http.StatusPreconditionFailed, "", "failed_precondition: machine is "+state)
	}
	s.mu.Lock()
	fail, failCode := s.failCmds > 0, s.failCode
	if fail {
		s.failCmds--
	}
	s.mu.Unlock()
	if fail {
		if s.opts.ExecOctetStream {
			return http.StatusOK, rawBody{}
		}
		return http.StatusOK, execResponse{ExitCode: failCode}
	}
	timeout := 60 * time.Second
	if req.Timeout > 0 {
		timeout = time.Duration(req.Timeout) * time.Second
	}
	if d := s.opts.ExecDeadline; d > 0 {
		timeout = min(timeout, d)
	}
	lines := make([]string, len(argv))
	for i, a := range argv {
		lines[i] = base64.StdEncoding.EncodeToString([]byte(a))
	}
	id := randomID()
	res, err := s.local.Exec(r.Context(), ws, providers.ExecSpec{
		Argv:  []string{"sh", "-c", submitScript, "sh", id, strings.Join(lines, "\n")},
		Stdin: []byte(req.Stdin), Timeout: timeout, MaxOutputBytes: 256 << 20,
	})
	switch {
	case r.Context().Err() != nil:
		return 0, nil // the client went away; the command runs on, as it may at Fly
	case errors.Is(err, providers.ErrSandboxGone):
		return errAnswer(http.StatusNotFound, "", "machine not found")
	case err != nil:
		return errAnswer(http.StatusInternalServerError, "unknown", "exec failed")
	case res.TimedOut:
		s.local.Exec(context.Background(), ws, providers.ExecSpec{Argv: []string{"sh", "-c", killScript, "sh", id}, Timeout: 10 * time.Second})
		return errAnswer(http.StatusRequestTimeout, "", "deadline_exceeded: exec timed out")
	case res.ExitCode != 0:
		return errAnswer(http.StatusInternalServerError, "unknown", fmt.Sprintf("exec agent failed (%d)", res.ExitCode))
	}
	head, rest, _ := bytes.Cut(res.Stdout, []byte("\n"))
	f := strings.Fields(string(head))
	if len(f) != 4 || f[0] != "exit" {
		return errAnswer(http.StatusInternalServerError, "unknown", "exec agent answer malformed")
	}
	code, _ := strconv.Atoi(f[1])
	no, _ := strconv.Atoi(f[2])
	if no > len(rest) {
		return errAnswer(http.StatusInternalServerError, "unknown", "exec agent answer short")
	}
	if s.opts.ExecOctetStream {
		return http.StatusOK, rawBody(rest[:no])
	}
	return http.StatusOK, execResponse{Stdout: string(rest[:no]), Stderr: string(rest[no:]), ExitCode: code}
}
