// Package modaltest is a fake of Modal's gRPC API for tests: the control
// plane (modal.client.ModalClient) and a task command router
// (modal.task_command_router.TaskCommandRouter), over TLS on loopback with
// a CA of its own. Each sandbox is a workspace of the local provider in
// which one long-lived "container" process runs every exec, so processes
// outlive the exec that started them as they do on Modal. The fake
// enforces what Modal enforces: the token metadata, JWTs on the router,
// the sandbox timeout and idle timeout, tags, and the one network policy
// it models: an allowlist with both lists empty, no network at all. Any
// other network_access is refused (FAILED_PRECONDITION) rather than
// enforced more strictly than Modal would.
package modaltest

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sandgate/sandgate/internal/testpki"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/modal/proto/clientpb"
	"github.com/sandgate/sandgate/providers/modal/proto/routerpb"
)

// Config configures the fake. TokenID, TokenSecret and DataDir are required.
type Config struct {
	TokenID, TokenSecret string
	// DataDir holds the sandboxes (local provider workspaces), snapshots
	// and the CA certificate (ca.pem).
	DataDir   string
	BwrapPath string // "" means bwrap on PATH
	// JWTTTL is the lifetime of router JWTs; 0 means an hour.
	JWTTTL time.Duration
	// ListPage is the SandboxList page size; 0 means 3, so that tests
	// page.
	ListPage int
	Logger   *slog.Logger
}

// Server is a running fake. Its methods are safe for concurrent use.
type Server struct {
	// URL is the control plane, https://127.0.0.1:PORT.
	URL string
	// CAFile is the PEM file of the CA that signed the fake's
	// certificate, usable as SSL_CERT_FILE.
	CAFile string
	// CertPool holds that CA.
	CertPool *x509.CertPool

	cfg       Config
	log       *slog.Logger
	local     *local.Provider
	routerURL string
	key       []byte // JWT signing key
	grpcs     []*grpc.Server
	ctx       context.Context
	stop      context.CancelFunc
	wg        sync.WaitGroup

	mu        sync.Mutex
	apps      map[string]string // environment + "/" + name → app id
	appNames  map[string]string // app id → name
	images    map[string]*image
	secrets   map[string]map[string]string
	sandboxes map[string]*sandbox
	tasks     map[string]*sandbox
	snapIDs   map[string]string // TaskSnapshotDirectory snapshot_id → image id
	faults    map[string][]fault
	calls     map[string][]metadata.MD
	execReqs  []*routerpb.TaskExecStartRequest
	lastTime  time.Time
}

// image is a registry image or a directory snapshot.
type image struct {
	id       string
	tag      string // registry images
	built    bool
	failed   bool
	joins    int
	snapshot bool      // a directory snapshot, stored by the local provider
	expires  time.Time // snapshots: hard TTL, or a sliding 30 days when unset
	sliding  bool
}

// Start starts the fake on two loopback ports (control plane and router).
// It runs until ctx ends or Close is called.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.TokenID == "" || cfg.TokenSecret == "" || cfg.DataDir == "" {
		return nil, errors.New("modaltest: TokenID, TokenSecret and DataDir are required")
	}
	if cfg.JWTTTL == 0 {
		cfg.JWTTTL = time.Hour
	}
	if cfg.ListPage == 0 {
		cfg.ListPage = 3
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, err
	}
	lp, err := local.New(ctx, local.Config{DataDir: filepath.Join(cfg.DataDir, "local"), BwrapPath: cfg.BwrapPath, HostDirs: true},
		providers.Env{Logger: log, BrokerID: "modal-fake", DataDir: cfg.DataDir})
	if err != nil {
		return nil, err
	}
	cert, pool, caPEM, err := selfSigned()
	if err != nil {
		return nil, err
	}
	caFile := filepath.Join(cfg.DataDir, "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		return nil, err
	}
	key := make([]byte, 32)
	rand.Read(key)
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s := &Server{
		CAFile: caFile, CertPool: pool, cfg: cfg, log: log, local: lp, key: key, ctx: sctx, stop: stop,
		apps: map[string]string{}, appNames: map[string]string{}, images: map[string]*image{},
		secrets: map[string]map[string]string{}, sandboxes: map[string]*sandbox{}, tasks: map[string]*sandbox{},
		snapIDs: map[string]string{}, faults: map[string][]fault{}, calls: map[string][]metadata.MD{},
	}
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	opts := []grpc.ServerOption{
		grpc.Creds(creds),
		grpc.MaxRecvMsgSize(100 << 20), grpc.MaxSendMsgSize(100 << 20),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
	control := grpc.NewServer(append(opts, grpc.UnaryInterceptor(s.unaryControl), grpc.StreamInterceptor(s.streamControl))...)
	clientpb.RegisterModalClientServer(control, &controlPlane{s: s})
	rt := grpc.NewServer(append(opts, grpc.UnaryInterceptor(s.unaryRouter), grpc.StreamInterceptor(s.streamRouter))...)
	routerpb.RegisterTaskCommandRouterServer(rt, &taskRouter{s: s})
	s.grpcs = []*grpc.Server{control, rt}
	for i, gs := range s.grpcs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			s.Close()
			return nil, err
		}
		u := "https://" + ln.Addr().String()
		if i == 0 {
			s.URL = u
		} else {
			s.routerURL = u
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			gs.Serve(ln)
		}()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.janitor()
	}()
	go func() {
		<-sctx.Done()
		for _, gs := range s.grpcs {
			gs.Stop()
		}
	}()
	return s, nil
}

// Close stops the fake and terminates every sandbox it still runs.
func (s *Server) Close() {
	s.stop()
	s.wg.Wait()
	s.mu.Lock()
	var live []*sandbox
	for _, sb := range s.sandboxes {
		live = append(live, sb)
	}
	s.mu.Unlock()
	for _, sb := range live {
		s.finish(sb, clientpb.GenericResult_GENERIC_STATUS_TERMINATED)
		// A watcher may still be reading the workspace's command: the
		// local provider must not close under it.
		<-sb.scheduled
		sb.watching.Wait()
	}
	// Its parent cgroups go too, with nothing left in them.
	s.local.Close()
}

// janitor deletes snapshot images at their expiry.
func (s *Server) janitor() {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		var expired []string
		s.mu.Lock()
		for id, im := range s.images {
			if im.snapshot && now.After(im.expires) {
				expired = append(expired, id)
				delete(s.images, id)
			}
		}
		s.mu.Unlock()
		for _, id := range expired {
			s.local.DeleteSnapshot(context.Background(), providers.SnapshotRef{ID: id, Ref: id})
		}
	}
}

// Fail makes the next n calls of method (its full path, for example
// "/modal.client.ModalClient/SandboxList") fail with code, before they do
// anything.
func (s *Server) Fail(method string, code codes.Code, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.faults[method] = append(s.faults[method], fault{code: code})
	}
}

// fault is an injected failure.
type fault struct {
	code       codes.Code
	retryAfter time.Duration // > 0: with an RPCRetryPolicy detail
}

// Throttle makes the next n calls of method fail with RESOURCE_EXHAUSTED
// and a modal.client.RPCRetryPolicy detail asking for a delay of after.
func (s *Server) Throttle(method string, after time.Duration, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.faults[method] = append(s.faults[method], fault{code: codes.ResourceExhausted, retryAfter: after})
	}
}

// Calls returns the metadata of every call of method so far.
func (s *Server) Calls(method string) []metadata.MD {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]metadata.MD{}, s.calls[method]...)
}

// ExecStarts returns every TaskExecStart request the router accepted, in
// order.
func (s *Server) ExecStarts() []*routerpb.TaskExecStartRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*routerpb.TaskExecStartRequest, len(s.execReqs))
	for i, r := range s.execReqs {
		out[i] = proto.Clone(r).(*routerpb.TaskExecStartRequest)
	}
	return out
}

// Sandbox is what the fake knows of one sandbox.
type Sandbox struct {
	ID      string
	AppID   string
	Request *clientpb.SandboxCreateRequest // as received
	Env     map[string]string              // from its secrets
	Result  *clientpb.GenericResult        // nil while it runs
}

// Sandboxes returns every sandbox the fake created, finished ones included.
func (s *Server) Sandboxes() []Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Sandbox
	for _, sb := range s.sandboxes {
		out = append(out, sb.info())
	}
	return out
}

// Images returns the ids of the images the fake holds (registry images
// and snapshots).
func (s *Server) Images() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for id := range s.images {
		out[id] = true
	}
	return out
}

func (s *Server) fault(method string, md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[method] = append(s.calls[method], md.Copy())
	f := s.faults[method]
	if len(f) == 0 {
		return nil
	}
	s.faults[method] = f[1:]
	st := status.New(f[0].code, "modaltest: injected failure")
	if f[0].retryAfter > 0 {
		if d, err := st.WithDetails(&clientpb.RPCRetryPolicy{RetryAfterSecs: float32(f[0].retryAfter.Seconds())}); err == nil {
			st = d
		}
	}
	return st.Err()
}

// checkControl enforces the control plane's metadata: the token id and
// secret, a numeric client type and a client version, and a valid
// x-modal-auth-token when one is sent.
func (s *Server) checkControl(ctx context.Context, method string) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if err := s.fault(method, md); err != nil {
		return err
	}
	one := func(k string) string {
		if v := md.Get(k); len(v) == 1 {
			return v[0]
		}
		return ""
	}
	if !hmac.Equal([]byte(one("x-modal-token-id")), []byte(s.cfg.TokenID)) ||
		!hmac.Equal([]byte(one("x-modal-token-secret")), []byte(s.cfg.TokenSecret)) {
		return status.Error(codes.Unauthenticated, "invalid token id or secret")
	}
	if _, err := strconv.Atoi(one("x-modal-client-type")); err != nil || one("x-modal-client-version") == "" {
		return status.Error(codes.Unauthenticated, "missing client type or version")
	}
	if tok := one("x-modal-auth-token"); tok != "" {
		if _, err := s.verifyJWT(tok, "client"); err != nil {
			return status.Error(codes.Unauthenticated, "invalid auth token")
		}
	}
	return nil
}

func (s *Server) unaryControl(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := s.checkControl(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (s *Server) streamControl(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := s.checkControl(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}

// checkRouter enforces the router's only metadata, a bearer JWT of the
// task; the handler checks the task id against the JWT's subject.
func (s *Server) checkRouter(ctx context.Context, method string) (context.Context, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if err := s.fault(method, md); err != nil {
		return ctx, err
	}
	for k := range md {
		if strings.HasPrefix(k, "x-modal-") {
			return ctx, status.Error(codes.InvalidArgument, "the router takes no x-modal-* metadata")
		}
	}
	v := md.Get("authorization")
	if len(v) != 1 || !strings.HasPrefix(v[0], "Bearer ") {
		return ctx, status.Error(codes.Unauthenticated, "missing bearer token")
	}
	sub, err := s.verifyJWT(strings.TrimPrefix(v[0], "Bearer "), "")
	if err != nil {
		return ctx, status.Error(codes.Unauthenticated, "invalid or expired JWT")
	}
	return context.WithValue(ctx, taskKey{}, sub), nil
}

type taskKey struct{}

// authorizedTask returns the sandbox of taskID when the call's JWT names it.
func (s *Server) authorizedTask(ctx context.Context, taskID string) (*sandbox, error) {
	if sub, _ := ctx.Value(taskKey{}).(string); sub != taskID {
		return nil, status.Error(codes.Unauthenticated, "the JWT is for another task")
	}
	s.mu.Lock()
	sb := s.tasks[taskID]
	s.mu.Unlock()
	if sb == nil {
		return nil, status.Error(codes.NotFound, "no such task")
	}
	if sb.finished() {
		return nil, status.Error(codes.NotFound, "the task has finished")
	}
	return sb, nil
}

func (s *Server) unaryRouter(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ctx, err := s.checkRouter(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return h(ctx, req)
}

type authedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (a authedStream) Context() context.Context { return a.ctx }

func (s *Server) streamRouter(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx, err := s.checkRouter(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return h(srv, authedStream{ss, ctx})
}

// jwt signs a JWT for sub, with exp.
func (s *Server) jwt(sub string, ttl time.Duration) string {
	enc := base64.RawURLEncoding
	head := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	body, _ := json.Marshal(map[string]any{"sub": sub, "exp": time.Now().Add(ttl).Unix()})
	msg := head + "." + enc.EncodeToString(body)
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(msg))
	return msg + "." + enc.EncodeToString(m.Sum(nil))
}

// verifyJWT checks a JWT's signature and expiry (and its subject when
// want is set) and returns the subject.
func (s *Server) verifyJWT(tok, want string) (string, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return "", errors.New("malformed")
	}
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(parts[0] + "." + parts[1]))
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || !hmac.Equal(sig, m.Sum(nil)) {
		return "", errors.New("bad signature")
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", err
	}
	var c struct {
		Sub string `json:"sub"`
		Exp int64  `json:"exp"`
	}
	if err := json.Unmarshal(b, &c); err != nil || time.Now().Unix() >= c.Exp || (want != "" && c.Sub != want) {
		return "", errors.New("expired or wrong subject")
	}
	return c.Sub, nil
}

// newID returns prefix + 20 random hex digits, Modal's shape of ids.
func newID(prefix string) string {
	var b [10]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// now returns a time strictly after every earlier one, so that created_at
// orders sandboxes for SandboxList's pages.
func (s *Server) now() time.Time {
	t := time.Now()
	if !t.After(s.lastTime) {
		t = s.lastTime.Add(time.Microsecond)
	}
	s.lastTime = t
	return t
}

// selfSigned makes a CA and a certificate for 127.0.0.1 and localhost.
func selfSigned() (tls.Certificate, *x509.CertPool, []byte, error) {
	pki, err := testpki.New("modaltest CA", []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, 7*24*time.Hour)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(pki.CA)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pki.CADER})
	return tls.Certificate{Certificate: [][]byte{pki.LeafDER}, PrivateKey: pki.Key}, pool, caPEM, nil
}

// String names the fake for test logs.
func (s *Server) String() string { return fmt.Sprintf("modaltest at %s", s.URL) }
