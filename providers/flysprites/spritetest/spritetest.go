// Package spritetest is a fake Fly Sprites API for tests: REST, the exec
// WebSocket with the real frame layout, the fs API, checkpoints and the
// network policy of the fact sheet, over TLS on loopback. Each sprite is a
// workspace of the local provider (bwrap) in which one long-lived agent
// runs the commands, so processes outlive their exec as on a real sprite.
//
// A sprite's guest behaves like the vendor's Firecracker VM
// (local.Config.GuestVM): the agent and every command share one pid
// namespace, the guest has the host's network (it reaches the host's
// loopback as a real sprite reaches the internet; see [StartCanary]),
// and its root has every capability inside the guest and writes /usr,
// /etc and / for the sprite's life (fakeserver.GuestBoot). Network
// policies are recorded, not enforced: the fake records every policy and
// exec so tests can check their order. The sheet documents no
// environment variable of the vendor's in an exec, so the fake adds none;
// nor does it document the guest's hostname, which the fake sets to the
// sprite's name, as a VM's commonly names it, so that a test sees a
// vendor identifier wherever a client could leak it.
//
// The user: the vendor runs exec as user "sprite" with passwordless sudo
// (sheet §8a). The fake runs every command as the guest's root instead:
// its guest is an unprivileged user namespace in which only one uid (root)
// is mapped, so no second user can exist. It does install a sudo on the
// guest's PATH (/usr/bin/sudo, sudoScript) that takes sudo's usual
// options (-n, -E, -H, -u root, --, NAME=VALUE) and resets the
// environment as Ubuntu's sudo does, so that a client that prefixes
// "sudo -n", as it must on the vendor, works unchanged.
//
// The fs API reads and writes the guest's whole file system, as the
// guest's root: /workspace, /root and /tmp directly on the host, every
// other path through the guest's mount namespace.
package spritetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/internal/fakeserver"
	"github.com/sandgate/sandgate/providers/internal/uuid"
	"github.com/sandgate/sandgate/providers/local"
)

// Config configures a Server.
type Config struct {
	// Token is the one Bearer token it accepts; required.
	Token string
	// DataDir holds the sprites (local provider workspaces); required.
	DataDir string
	// SessionInfoDelay holds back an exec's session_info message this
	// long after its command started, as a slow vendor may: a client
	// that needs the session's id (to kill it) must wait for it.
	SessionInfoDelay time.Duration
}

// Server is a running fake. Its methods are safe for concurrent use.
type Server struct {
	URL    string // https://127.0.0.1:port
	CAFile string // PEM of the server's certificate, usable as SSL_CERT_FILE

	token     string
	lp        *local.Provider
	hs        *httptest.Server
	data      string
	infoDelay time.Duration // Config.SessionInfoDelay

	mu      sync.Mutex
	sprites map[string]*sprite
	events  map[string][]Event // by sprite name; kept after a delete
	inject  []injection
	nextSID int
}

// Event is something that happened to a sprite, in order.
type Event struct {
	Kind  string   // "create", "policy", "exec", "delete"
	Rules []string // "allow:domain" / "deny:*" for a policy
	Argv  []string // for an exec
	Time  time.Time
}

// Info is what the fake holds of a sprite.
type Info struct {
	Name        string
	Labels      []string
	Environment map[string]string
	CPUs, RAMMB int
}

// New starts a fake.
func New(ctx context.Context, c Config) (*Server, error) {
	if c.Token == "" || c.DataDir == "" {
		return nil, errors.New("spritetest: a token and a data directory are required")
	}
	lp, err := local.New(ctx, local.Config{DataDir: filepath.Join(c.DataDir, "local"), GuestVM: true, HostDirs: true}, providers.Env{BrokerID: "spritetest"})
	if err != nil {
		return nil, err
	}
	s := &Server{token: c.Token, lp: lp, data: filepath.Join(c.DataDir, "local"), infoDelay: c.SessionInfoDelay,
		sprites: map[string]*sprite{}, events: map[string][]Event{}}
	if s.hs, s.CAFile, err = fakeserver.StartTLS(s.routes(), c.DataDir); err != nil {
		return nil, err
	}
	s.URL = s.hs.URL
	return s, nil
}

// Start starts a fake for a test, with a fresh token, and closes it when
// the test ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	return StartWith(tb, Config{})
}

// StartWith is Start with c's options; its Token and DataDir are filled
// in when empty.
func StartWith(tb testing.TB, c Config) *Server {
	tb.Helper()
	if c.Token == "" {
		var b [16]byte
		rand.Read(b[:])
		c.Token = "spr_" + hex.EncodeToString(b[:])
	}
	if c.DataDir == "" {
		c.DataDir = tb.TempDir()
	}
	s, err := New(tb.Context(), c)
	if err != nil {
		tb.Fatalf("spritetest: %v", err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Token is the token the fake accepts.
func (s *Server) Token() string { return s.token }

// Client is an HTTP client that trusts the fake's certificate.
func (s *Server) Client() *http.Client { return s.hs.Client() }

// Close deletes every sprite and stops the server.
func (s *Server) Close() {
	s.mu.Lock()
	names := make([]string, 0, len(s.sprites))
	for n := range s.sprites {
		names = append(names, n)
	}
	s.mu.Unlock()
	for _, n := range names {
		s.deleteSprite(n)
	}
	s.hs.CloseClientConnections()
	s.hs.Close()
	// Its parent cgroups go too, with nothing left in them.
	s.lp.Close()
}

// Events returns what happened to the sprite called name.
func (s *Server) Events(name string) []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events[name])
}

// AllEvents returns what happened to every sprite ever created, by name.
func (s *Server) AllEvents() map[string][]Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]Event{}
	for n, evs := range s.events {
		out[n] = slices.Clone(evs)
	}
	return out
}

// Sprite returns what the fake holds of the sprite called name.
func (s *Server) Sprite(name string) (Info, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp, ok := s.sprites[name]
	if !ok {
		return Info{}, false
	}
	return Info{Name: sp.name, Labels: slices.Clone(sp.labels), Environment: sp.environment, CPUs: sp.cpus, RAMMB: sp.ramMB}, true
}

// Names returns the names of the sprites that exist.
func (s *Server) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for n := range s.sprites {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Run runs argv in the sprite directly, as the vendor would, bypassing any
// client: for tests that look inside a sprite.
func (s *Server) Run(ctx context.Context, name string, argv ...string) (providers.ExecResult, error) {
	sp, err := s.get(name)
	if err != nil {
		return providers.ExecResult{}, err
	}
	j, err := sp.start(argv, nil, "", nil)
	if err != nil {
		return providers.ExecResult{}, err
	}
	select {
	case <-j.done:
	case <-ctx.Done():
		sp.signal(j, "KILL")
		return providers.ExecResult{}, ctx.Err()
	}
	out, _ := os.ReadFile(filepath.Join(j.dir, "out"))
	errb, _ := os.ReadFile(filepath.Join(j.dir, "err"))
	return providers.ExecResult{ExitCode: j.code, Stdout: out, Stderr: errb}, nil
}

// injection replaces the answer of the next matching request.
type injection struct {
	method, suffix string
	status         int
	body           string
	after          bool // the request is served first, then its answer replaced
}

// Inject makes the next request whose method is method and whose path ends
// in suffix answer status with body instead, without serving it.
func (s *Server) Inject(method, suffix string, status int, body string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inject = append(s.inject, injection{method: method, suffix: suffix, status: status, body: body})
}

// InjectAfter is Inject, but the request is served before its answer is
// replaced: an unclear answer to a call that did take effect.
func (s *Server) InjectAfter(method, suffix string, status int, body string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inject = append(s.inject, injection{method: method, suffix: suffix, status: status, body: body, after: true})
}

func (s *Server) takeInjection(r *http.Request) (injection, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, in := range s.inject {
		if in.method == r.Method && strings.HasSuffix(r.URL.Path, in.suffix) {
			s.inject = slices.Delete(s.inject, i, i+1)
			return in, true
		}
	}
	return injection{}, false
}

func (s *Server) record(name string, e Event) {
	e.Time = time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events[name] = append(s.events[name], e)
}

// apiErr writes the vendor's error body (sheet §2).
func apiErr(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": code, "message": msg})
}

// fsErr writes the fs API's error body (sheet §2, fsError).
func fsErr(w http.ResponseWriter, status int, code, path string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": code, "code": code, "path": path})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sprites", s.create)
	mux.HandleFunc("GET /v1/sprites", s.list)
	mux.HandleFunc("GET /v1/sprites/{name}", s.getSprite)
	mux.HandleFunc("DELETE /v1/sprites/{name}", s.delete)
	mux.HandleFunc("GET /v1/sprites/{name}/exec", s.exec)
	mux.HandleFunc("POST /v1/sprites/{name}/exec/{session}/kill", s.kill)
	mux.HandleFunc("GET /v1/sprites/{name}/policy/network", s.getPolicy)
	mux.HandleFunc("POST /v1/sprites/{name}/policy/network", s.setPolicy)
	mux.HandleFunc("GET /v1/sprites/{name}/fs/read", s.fsRead)
	mux.HandleFunc("PUT /v1/sprites/{name}/fs/write", s.fsWrite)
	mux.HandleFunc("GET /v1/sprites/{name}/fs/list", s.fsList)
	mux.HandleFunc("DELETE /v1/sprites/{name}/fs/delete", s.fsDelete)
	mux.HandleFunc("POST /v1/sprites/{name}/checkpoint", s.checkpoint)
	mux.HandleFunc("GET /v1/sprites/{name}/checkpoints", s.listCheckpoints)
	mux.HandleFunc("GET /v1/sprites/{name}/checkpoints/{id}", s.getCheckpoint)
	mux.HandleFunc("POST /v1/sprites/{name}/checkpoints/{id}/restore", s.restoreCheckpoint)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+s.token {
			apiErr(w, http.StatusUnauthorized, "unauthorized", "invalid or missing token")
			return
		}
		w.Header().Set("Sprite-Version", "0.0.1-rc46-fake")
		// Bodies as the sheet sends them (§1): JSON as application/json,
		// file writes as application/octet-stream.
		if ct := r.Header.Get("Content-Type"); r.ContentLength > 0 || r.Method == http.MethodPut {
			want := "application/json"
			if strings.HasSuffix(r.URL.Path, "/fs/write") {
				want = "application/octet-stream"
			}
			if ct != want {
				apiErr(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "wrong Content-Type")
				return
			}
		}
		if in, ok := s.takeInjection(r); ok {
			if in.after {
				mux.ServeHTTP(discard{}, r)
			}
			if in.status == http.StatusTooManyRequests {
				w.Header().Set("Retry-After", "1")
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(in.status)
			io.WriteString(w, in.body)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// discard is a ResponseWriter that drops the answer.
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}

// createRequest is CreateSpriteRequest (sheet §4).
type createRequest struct {
	Name   string `json:"name"`
	Config *struct {
		RAMMB     int    `json:"ram_mb"`
		CPUs      int    `json:"cpus"`
		Region    string `json:"region"`
		StorageGB int    `json:"storage_gb"`
	} `json:"config"`
	Environment map[string]string `json:"environment"`
	Labels      []string          `json:"labels"`
}

func validName(n string) bool {
	if n == "" || len(n) > 63 || n[0] == '-' {
		return false
	}
	for _, c := range []byte(n) {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		apiErr(w, http.StatusBadRequest, "invalid_request", "the body is not a CreateSpriteRequest")
		return
	}
	if !validName(req.Name) {
		apiErr(w, http.StatusBadRequest, "invalid_name", "invalid sprite name")
		return
	}
	s.mu.Lock()
	if _, dup := s.sprites[req.Name]; dup {
		s.mu.Unlock()
		apiErr(w, http.StatusConflict, "sprite_already_exists", "a sprite of this name exists")
		return
	}
	sp := &sprite{s: s, name: req.Name, labels: req.Labels, environment: req.Environment,
		created: time.Now().UTC(), id: uuid.New(), jobs: map[string]*job{}, sessions: map[string]*job{}}
	if req.Config != nil {
		sp.cpus, sp.ramMB = req.Config.CPUs, req.Config.RAMMB
	}
	s.sprites[req.Name] = sp // reserved; ready once the agent runs
	s.mu.Unlock()
	if err := sp.boot(r.Context()); err != nil {
		s.mu.Lock()
		delete(s.sprites, req.Name)
		s.mu.Unlock()
		apiErr(w, http.StatusInternalServerError, "internal", "the sprite did not start")
		return
	}
	s.record(req.Name, Event{Kind: "create"})
	writeJSON(w, http.StatusCreated, map[string]any{"name": req.Name})
}

// spriteInfo is SpriteInfo (sheet §4).
func (sp *sprite) info() map[string]any {
	m := map[string]any{
		"id": sp.id, "name": sp.name, "organization": "fake", "status": "running",
		"created_at": sp.created.Format(time.RFC3339Nano), "updated_at": sp.created.Format(time.RFC3339Nano),
		"url": "https://" + sp.name + ".sprites.app",
	}
	if sp.cpus != 0 || sp.ramMB != 0 {
		m["config"] = map[string]any{"cpus": sp.cpus, "ram_mb": sp.ramMB}
	}
	if len(sp.labels) > 0 {
		m["labels"] = sp.labels
	}
	if len(sp.environment) > 0 {
		m["environment"] = sp.environment
	}
	return m
}

func (s *Server) get(name string) (*sprite, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp, ok := s.sprites[name]
	if !ok || !sp.ready {
		return nil, errNoSprite
	}
	return sp, nil
}

var errNoSprite = errors.New("spritetest: no such sprite")

// spriteOr404 returns the sprite of the request, or answers 404.
func (s *Server) spriteOr404(w http.ResponseWriter, r *http.Request) *sprite {
	sp, err := s.get(r.PathValue("name"))
	if err != nil {
		apiErr(w, http.StatusNotFound, "sprite_not_found", "no such sprite")
		return nil
	}
	return sp
}

func (s *Server) getSprite(w http.ResponseWriter, r *http.Request) {
	if sp := s.spriteOr404(w, r); sp != nil {
		writeJSON(w, http.StatusOK, sp.info())
	}
}

// list pages by name order; the continuation token is the last name of
// the previous page. max_results must be 1–50, as the docs say.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	max := 50
	if v := q.Get("max_results"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 50 {
			apiErr(w, http.StatusBadRequest, "invalid_request", "max_results must be 1 to 50")
			return
		}
		max = n
	}
	prefix, after := q.Get("prefix"), q.Get("continuation_token")
	s.mu.Lock()
	var names []string
	for n, sp := range s.sprites {
		if sp.ready && strings.HasPrefix(n, prefix) && n > after {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	more := len(names) > max
	if more {
		names = names[:max]
	}
	items := []map[string]any{}
	for _, n := range names {
		items = append(items, s.sprites[n].info())
	}
	s.mu.Unlock()
	resp := map[string]any{"sprites": items, "has_more": more,
		"org": map[string]any{"name": "fake", "running": len(items)}}
	if more {
		resp["next_continuation_token"] = names[len(names)-1]
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) {
	if !s.deleteSprite(r.PathValue("name")) {
		apiErr(w, http.StatusNotFound, "sprite_not_found", "no such sprite")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) deleteSprite(name string) bool {
	s.mu.Lock()
	sp, ok := s.sprites[name]
	if ok {
		delete(s.sprites, name)
	}
	s.mu.Unlock()
	if !ok {
		return false
	}
	sp.shutdown()
	s.record(name, Event{Kind: "delete"})
	return true
}

// Network policy (sheet §8). The fake answers a set with 204, as sprites-go
// expects, and refuses a rule that is neither a domain rule nor an include.
type policyRule struct {
	Domain  string `json:"domain,omitempty"`
	Action  string `json:"action,omitempty"`
	Include string `json:"include,omitempty"`
}

func (s *Server) getPolicy(w http.ResponseWriter, r *http.Request) {
	sp := s.spriteOr404(w, r)
	if sp == nil {
		return
	}
	s.mu.Lock()
	rules := slices.Clone(sp.policy)
	s.mu.Unlock()
	if rules == nil {
		rules = []policyRule{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"rules": rules})
}

func (s *Server) setPolicy(w http.ResponseWriter, r *http.Request) {
	sp := s.spriteOr404(w, r)
	if sp == nil {
		return
	}
	var body struct {
		Rules []policyRule `json:"rules"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || body.Rules == nil {
		http.Error(w, "invalid policy", http.StatusBadRequest)
		return
	}
	var ev []string
	for _, ru := range body.Rules {
		ok := (ru.Include != "" && ru.Domain == "" && ru.Action == "") ||
			(ru.Include == "" && ru.Domain != "" && (ru.Action == "allow" || ru.Action == "deny"))
		if !ok {
			http.Error(w, "invalid policy", http.StatusBadRequest)
			return
		}
		if ru.Include != "" {
			ev = append(ev, "include:"+ru.Include)
		} else {
			ev = append(ev, ru.Action+":"+ru.Domain)
		}
	}
	s.mu.Lock()
	sp.policy = body.Rules
	s.mu.Unlock()
	s.record(sp.name, Event{Kind: "policy", Rules: ev})
	w.WriteHeader(http.StatusNoContent)
}

// sprite is one fake sprite: a local-provider workspace with an agent.
type sprite struct {
	s           *Server
	name, id    string
	labels      []string
	environment map[string]string
	cpus, ramMB int
	created     time.Time

	lsb    providers.Sandbox
	mntNS  string       // the guest's mount namespace, "mnt:[N]"
	spool  string       // host path of the agent's spool, /tmp/.sprite-spool inside
	ctl    *os.File     // the agent's control FIFO, held open for writing
	ready  bool         // guarded by s.mu
	policy []policyRule // guarded by s.mu; nil: none set

	mu          sync.Mutex
	jobs        map[string]*job // by job id
	sessions    map[string]*job // by session id
	nextJob     int
	checkpoints []checkpoint
	closed      bool
	rootPID     int // a process in the guest's mount namespace (guestRoot); 0: not found yet
}

// spriteLife bounds a fake sprite: its sandbox and agent end by then even
// if the fake was killed without deleting them.
const spriteLife = 6 * time.Hour

// Inside the sprite: the spool the agent reads its jobs from.
const guestSpool = "/tmp/.sprite-spool"

// agentScript runs in the sprite for its whole life. It reads lines from
// the control FIFO: "run JOB" starts JOB's run.sh in a session of its own
// (double-forked, so the sandbox's init reaps it) and records its exit;
// "kill JOB SIG" signals JOB's whole process group. A kill before the job
// wrote its pid leaves a "killed" fence the job obeys.
const agentScript = `s=$1
exec 3<>"$s/ctl"
readlink /proc/self/ns/mnt >"$s/mntns" || exit 1
: >"$s/ready"
while IFS=' ' read -r op j sig <&3; do
	case $op in
	run)
		( ( setsid sh "$s/$j/run.sh" <"$s/$j/stdin" >"$s/$j/out" 2>"$s/$j/err" &
		    wait $!
		    echo $? >"$s/$j/exit.tmp" && mv "$s/$j/exit.tmp" "$s/$j/exit" ) & )
		;;
	kill)
		[ -e "$s/$j/pid" ] || : >"$s/$j/killed"
		[ -e "$s/$j/pid" ] && kill -s "$sig" -- "-$(cat "$s/$j/pid")" 2>/dev/null
		;;
	esac
done
`

// boot creates the local workspace and starts the agent in it.
func (sp *sprite) boot(ctx context.Context) error {
	size := sandgate.Size{Name: "fake", CPUCores: max(sp.cpus, 1), MemoryMiB: max(sp.ramMB, 512)}
	lsb, err := sp.s.lp.Create(ctx, providers.CreateSpec{
		WorkspaceID: sp.name, InstanceID: "spritetest", Size: size,
		Egress: sandgate.EgressPolicy{AllowedDomains: []string{}}, ExpiresAt: time.Now().Add(spriteLife),
	})
	if err != nil {
		return err
	}
	sp.lsb = lsb
	// The local provider's layout: the workspace's /tmp is
	// <data>/workspaces/<ref>/tmp on the host (providers/local/workspace.go).
	sp.spool = filepath.Join(sp.s.data, "workspaces", lsb.Ref, "tmp", filepath.Base(guestSpool))
	fail := func(err error) error {
		sp.s.lp.Terminate(context.WithoutCancel(ctx), lsb)
		return err
	}
	if err := os.MkdirAll(sp.spool, 0o777); err != nil {
		return fail(err)
	}
	if err := syscall.Mkfifo(filepath.Join(sp.spool, "ctl"), 0o600); err != nil {
		return fail(err)
	}
	ctl, err := os.OpenFile(filepath.Join(sp.spool, "ctl"), os.O_RDWR, 0)
	if err != nil {
		return fail(err)
	}
	sp.ctl = ctl
	if err := sp.s.lp.StartCommand(ctx, lsb, "agent", providers.ExecSpec{
		Argv: []string{"sh", "-c", bootScript(sp.name) + agentScript, "sh", guestSpool}, Timeout: spriteLife,
	}); err != nil {
		ctl.Close()
		return fail(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(sp.spool, "ready")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			ctl.Close()
			return fail(errors.New("spritetest: the agent did not start"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	ns, err := os.ReadFile(filepath.Join(sp.spool, "mntns"))
	if err != nil {
		ctl.Close()
		return fail(err)
	}
	sp.mntNS = strings.TrimSpace(string(ns))
	sp.s.mu.Lock()
	sp.ready = true
	sp.s.mu.Unlock()
	return nil
}

// shutdown ends every job and the sandbox.
func (sp *sprite) shutdown() {
	sp.mu.Lock()
	sp.closed = true
	jobs := make([]*job, 0, len(sp.jobs))
	for _, j := range sp.jobs {
		jobs = append(jobs, j)
	}
	sp.mu.Unlock()
	if sp.lsb.Ref != "" {
		sp.s.lp.Terminate(context.Background(), sp.lsb)
	}
	if sp.ctl != nil {
		sp.ctl.Close()
	}
	for _, j := range jobs {
		j.finish(137)
	}
}

// job is one command run by the agent.
type job struct {
	id      string
	dir     string // host path
	session string

	once sync.Once
	done chan struct{}
	code int
}

func (j *job) finish(code int) {
	j.once.Do(func() {
		j.code = code
		close(j.done)
	})
}

// shellQuote quotes s for sh: every byte but NUL survives.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// defaultEnv is a sprite's environment when an exec sends none.
var defaultEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}

// start writes a job and hands it to the agent. env nil means defaultEnv
// (the exec env parameter replaces the default environment, sheet §5.1);
// dir "" means /workspace. stdin nil means none.
func (sp *sprite) start(argv, env []string, dir string, stdin []byte) (*job, error) {
	sp.mu.Lock()
	if sp.closed {
		sp.mu.Unlock()
		return nil, errNoSprite
	}
	sp.nextJob++
	j := &job{id: "j" + strconv.Itoa(sp.nextJob), done: make(chan struct{})}
	j.dir = filepath.Join(sp.spool, j.id)
	sp.jobs[j.id] = j
	sp.mu.Unlock()
	if env == nil {
		env = defaultEnv
	}
	if dir == "" {
		dir = "/workspace"
	}
	gj := guestSpool + "/" + j.id
	var b strings.Builder
	fmt.Fprintf(&b, "echo $$ >%s/pid.tmp && mv %s/pid.tmp %s/pid || exit 1\n", gj, gj, gj)
	fmt.Fprintf(&b, "[ -e %s/killed ] && exit 137\n", gj)
	fmt.Fprintf(&b, "cd -- %s || exit 1\n", shellQuote(dir))
	b.WriteString("exec env -i")
	for _, kv := range env {
		b.WriteString(" " + shellQuote(kv))
	}
	for _, a := range argv {
		b.WriteString(" " + shellQuote(a))
	}
	b.WriteString("\n")
	if err := os.Mkdir(j.dir, 0o777); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(j.dir, "run.sh"), []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(j.dir, "stdin"), stdin, 0o644); err != nil {
		return nil, err
	}
	if err := sp.send("run " + j.id); err != nil {
		return nil, err
	}
	go sp.watch(j)
	return j, nil
}

func (sp *sprite) send(line string) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.closed {
		return errNoSprite
	}
	_, err := sp.ctl.Write([]byte(line + "\n"))
	return err
}

// watch waits for the job's exit file.
func (sp *sprite) watch(j *job) {
	for {
		select {
		case <-j.done:
			return
		default:
		}
		b, err := os.ReadFile(filepath.Join(j.dir, "exit"))
		if err == nil {
			code, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			j.finish(code)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// signal signals the job's process group; false when it had already ended.
func (sp *sprite) signal(j *job, sig string) bool {
	select {
	case <-j.done:
		return false
	default:
	}
	return sp.send("kill "+j.id+" "+sig) == nil
}

// remove drops a finished job's files.
func (sp *sprite) remove(j *job) {
	sp.mu.Lock()
	delete(sp.jobs, j.id) // its session stays: a kill of it answers 410
	sp.mu.Unlock()
	os.RemoveAll(j.dir)
}
