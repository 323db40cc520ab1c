package modal

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sandgate/sandgate/internal/tick"
	"github.com/sandgate/sandgate/providers/internal/uuid"
	"github.com/sandgate/sandgate/providers/modal/proto/clientpb"
)

// Client identity, as the Modal Go SDK sends it (see README.md: the
// server may police these, and mirroring the Go SDK is what is known to
// work).
const (
	clientType     = "9" // ClientType CLIENT_TYPE_LIBMODAL_GO
	clientVersion  = "1.0.0"
	libmodalHeader = "modal-go/0.9.0"
)

// Channel settings Modal's SDKs use on both services.
const (
	maxMessage = 100 << 20
	windowSize = 64 << 20
)

// Control-plane retry policy of the SDK: at most 3 retries, backoff from
// 100 ms doubling to 1 s.
const (
	maxRetries     = 3
	initialBackoff = 100 * time.Millisecond
	maxBackoff     = time.Second
	minThrottle    = 100 * time.Millisecond
)

// dial opens a lazily connecting channel with Modal's channel options. The
// control plane (control) gets the metadata and retry interceptor; a
// router gets its own per call.
func (p *Provider) dial(target string, secure, control bool) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if secure {
		creds = credentials.NewTLS(&tls.Config{RootCAs: p.cfg.RootCAs, MinVersion: tls.VersionTLS12})
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage), grpc.MaxCallSendMsgSize(maxMessage)),
		grpc.WithInitialWindowSize(windowSize),
		grpc.WithInitialConnWindowSize(windowSize),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		// A router may refuse connections for a while after its task is
		// scheduled: reconnect at 1, 2, 4, 8, then every 10 s.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: time.Second, Multiplier: 2, Jitter: 0.1, MaxDelay: 10 * time.Second},
			MinConnectTimeout: 10 * time.Second,
		}),
	}
	if control {
		opts = append(opts, grpc.WithUnaryInterceptor(p.unary), grpc.WithStreamInterceptor(p.stream))
	}
	return grpc.NewClient(target, opts...)
}

// idempotent marks a control-plane call the interceptor may retry.
type idempotent struct{ grpc.EmptyCallOption }

// retryable is a call option: the call is idempotent.
var retryable grpc.CallOption = idempotent{}

// transient reports the codes the SDKs retry.
func transient(c codes.Code) bool {
	switch c {
	case codes.DeadlineExceeded, codes.Unavailable, codes.Canceled, codes.Internal, codes.Unknown:
		return true
	}
	return false
}

// identity is the metadata of every control-plane call.
func (p *Provider) identity() []string {
	return []string{
		"x-modal-token-id", p.cfg.TokenID,
		"x-modal-token-secret", p.cfg.TokenSecret.Reveal(),
		"x-modal-client-type", clientType,
		"x-modal-client-version", clientVersion,
		"x-modal-libmodal-version", libmodalHeader,
	}
}

const authTokenGet = "/modal.client.ModalClient/AuthTokenGet"

// unary adds the identity, the auth token and the retry headers to a
// control-plane call, and retries it as the SDK does: an idempotent call
// on a transient code, any call Modal throttled.
func (p *Provider) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	retry := false
	for _, o := range opts {
		if _, ok := o.(idempotent); ok {
			retry = true
		}
	}
	md := p.identity()
	if method != authTokenGet {
		tok, err := p.auth.get(ctx, p)
		if err != nil {
			return err
		}
		if tok != "" {
			md = append(md, "x-modal-auth-token", tok)
		}
	}
	key := uuid.New()
	start := time.Now()
	wait := initialBackoff
	var throttled int
	var throttleWait time.Duration
	for attempt := 0; ; {
		h := append(md[:len(md):len(md)], "x-idempotency-key", key, "x-retry-attempt", strconv.Itoa(attempt))
		if attempt > 0 {
			h = append(h, "x-retry-delay", strconv.FormatFloat(time.Since(start).Seconds(), 'f', 3, 64))
		}
		if throttled > 0 {
			h = append(h, "x-throttle-retry-attempt", strconv.Itoa(throttled),
				"x-throttle-retry-delay", strconv.FormatFloat(throttleWait.Seconds(), 'f', 3, 64))
		}
		err := invoker(metadata.AppendToOutgoingContext(ctx, h...), method, req, reply, cc, opts...)
		if err == nil || ctx.Err() != nil {
			return err
		}
		st := status.Convert(err)
		if d, ok := throttleDelay(st); ok {
			// The server refused the call and asks for a delay: it did
			// not run, so any call may be sent again.
			if p.cfg.MaxThrottleWait > 0 && throttleWait+d > p.cfg.MaxThrottleWait {
				return err
			}
			if !sleep(ctx, d) {
				return err
			}
			throttled++
			throttleWait += d
			continue
		}
		if !retry || attempt >= maxRetries || !transient(st.Code()) {
			return err
		}
		if !sleep(ctx, wait) {
			return err
		}
		wait = min(2*wait, maxBackoff)
		attempt++
	}
}

// throttleDelay reads a modal.client.RPCRetryPolicy detail.
func throttleDelay(st *status.Status) (time.Duration, bool) {
	for _, d := range st.Proto().GetDetails() {
		if d.GetTypeUrl() != "type.googleapis.com/modal.client.RPCRetryPolicy" {
			continue
		}
		var pol clientpb.RPCRetryPolicy
		if err := d.UnmarshalTo(&pol); err != nil {
			return 0, false
		}
		return max(time.Duration(float64(pol.GetRetryAfterSecs())*float64(time.Second)), minThrottle), true
	}
	return 0, false
}

// stream adds the identity to a control-plane stream. Like the Go SDK it
// sends no auth token on streams, and the call site loops on failures.
func (p *Provider) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return streamer(metadata.AppendToOutgoingContext(ctx, p.identity()...), desc, cc, method, opts...)
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool { return tick.Sleep(ctx, d) == nil }

// authToken is the JWT of AuthTokenGet, refreshed lazily when less than 5
// minutes remain, one refresh at a time.
type authToken struct {
	mu          sync.Mutex
	token       string
	exp         time.Time
	unsupported bool // the server has no AuthTokenGet: calls go without it
}

const (
	authRefresh    = 5 * time.Minute
	authDefaultTTL = 20 * time.Minute
)

func (a *authToken) get(ctx context.Context, p *Provider) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.unsupported {
		return "", nil
	}
	if a.token != "" && time.Until(a.exp) > authRefresh {
		return a.token, nil
	}
	resp, err := p.client.AuthTokenGet(ctx, &clientpb.AuthTokenGetRequest{}, retryable)
	switch {
	case status.Code(err) == codes.Unimplemented:
		// The sheet reads the token as likely optional for these RPCs:
		// a server without the exchange gets id and secret alone.
		a.unsupported = true
		return "", nil
	case err != nil && a.token != "" && time.Now().Before(a.exp):
		return a.token, nil // still valid; refresh again next call
	case err != nil:
		return "", vendorError("auth token", err)
	}
	a.token = resp.GetToken()
	a.exp = jwtExpiry(a.token, time.Now().Add(authDefaultTTL))
	return a.token, nil
}

// jwtExpiry reads the exp claim of a JWT's payload, or returns def.
func jwtExpiry(tok string, def time.Time) time.Time {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return def
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return def
	}
	var claims struct {
		Exp *float64 `json:"exp"`
	}
	if json.Unmarshal(b, &claims) != nil || claims.Exp == nil {
		return def
	}
	return time.Unix(int64(*claims.Exp), 0)
}

// vendorErr is a failed Modal call. It keeps the operation and the gRPC
// code only: Modal's message text may quote what a command or a path held.
type vendorErr struct {
	op   string
	code codes.Code
}

func (e *vendorErr) Error() string {
	msg := fmt.Sprintf("modal: %s: %s", e.op, e.code)
	switch e.code {
	case codes.Unauthenticated, codes.PermissionDenied:
		msg += " (Modal refused the credentials: check " + EnvTokenID + " and " + EnvTokenSecret + ")"
	case codes.Unavailable, codes.DeadlineExceeded:
		msg += " (Modal could not be reached in time: check " + EnvServerURL + " and Modal's status)"
	case codes.ResourceExhausted:
		msg += " (Modal refused for quota or rate: check the Modal workspace's limits)"
	case codes.InvalidArgument, codes.FailedPrecondition:
		msg += " (Modal refused the request)"
	}
	return msg
}

// Code returns the gRPC code.
func (e *vendorErr) Code() codes.Code { return e.code }

// vendorError wraps err of op as a *vendorErr, or returns err itself when
// it is the context's (the caller gave up).
func vendorError(op string, err error) error {
	if err == nil {
		return nil
	}
	if err == context.Canceled || err == context.DeadlineExceeded {
		return err
	}
	if _, ok := err.(*vendorErr); ok {
		return err
	}
	return &vendorErr{op: op, code: status.Code(err)}
}
