package modal

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/modal/proto/clientpb"
	"github.com/sandgate/sandgate/providers/modal/proto/routerpb"
)

// Task scheduling and router connection, as the SDKs wait for them.
const (
	taskPoll        = 500 * time.Millisecond
	taskPolls       = 600 // 5 minutes
	routerReadyWait = 5 * time.Minute
	// Router retry policy: 10 retries, backoff from 10 ms doubling.
	routerRetries = 10
	routerBackoff = 10 * time.Millisecond
	// jwtFresh: an UNAUTHENTICATED router call refreshes the JWT unless
	// it is valid for longer than this.
	jwtFresh = 30 * time.Second
)

// router is the command router of one sandbox's task: its URL, JWT and
// connection. Routers of one URL (one worker host) share a connection.
type router struct {
	sandboxID, taskID string
	url               string
	conn              *grpc.ClientConn
	rc                routerpb.TaskCommandRouterClient

	mu  sync.Mutex
	jwt string
	exp time.Time
}

// authed returns ctx with the router's bearer JWT, the only metadata a
// router call carries.
func (r *router) authed(ctx context.Context) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+r.jwt)
}

// router returns the command router of sandbox id, connecting once per
// process. Returns providers.ErrSandboxGone when the sandbox has finished
// or does not exist.
func (p *Provider) router(ctx context.Context, id string) (*router, error) {
	p.mu.Lock()
	r, ok := p.routers[id]
	p.mu.Unlock()
	if ok {
		return r, nil
	}
	taskID, err := p.taskID(ctx, id)
	if err != nil {
		return nil, err
	}
	r, err = p.connectRouter(ctx, id, taskID)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if old, ok := p.routers[id]; ok {
		p.mu.Unlock()
		return old, nil
	}
	p.routers[id] = r
	p.mu.Unlock()
	return r, nil
}

// forget drops the cached router of sandbox id.
func (p *Provider) forget(id string) {
	p.mu.Lock()
	delete(p.routers, id)
	p.mu.Unlock()
}

// taskID polls SandboxGetTaskId every 500 ms, up to 600 times, until the
// sandbox is scheduled. It sends a timeout (the proto asks new clients to)
// and polls anyway, so it works whether or not the server long-polls.
func (p *Provider) taskID(ctx context.Context, id string) (string, error) {
	timeout := float32(10)
	deadline := time.Now().Add(taskPolls * taskPoll)
	for range taskPolls {
		if time.Now().After(deadline) {
			break
		}
		cctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
		resp, err := p.client.SandboxGetTaskId(cctx, &clientpb.SandboxGetTaskIdRequest{SandboxId: id, Timeout: &timeout}, retryable)
		cancel()
		switch {
		case status.Code(err) == codes.NotFound:
			return "", fmt.Errorf("modal: %w", providers.ErrSandboxGone)
		case err != nil:
			return "", vendorError("sandbox task", err)
		case resp.TaskResult != nil:
			return "", fmt.Errorf("modal: sandbox finished (%s): %w", resp.GetTaskResult().GetStatus(), providers.ErrSandboxGone)
		case resp.GetTaskId() != "":
			return resp.GetTaskId(), nil
		}
		if !sleep(ctx, taskPoll) {
			return "", ctx.Err()
		}
	}
	return "", errors.New("modal: the sandbox was not scheduled within 5 minutes")
}

// connectRouter gets router access for the task and waits until the
// connection is ready, for up to 5 minutes.
func (p *Provider) connectRouter(ctx context.Context, sandboxID, taskID string) (*router, error) {
	jwt, u, err := p.routerAccess(ctx, taskID)
	if err != nil {
		return nil, err
	}
	target, err := routerTarget(u)
	if err != nil {
		return nil, err
	}
	conn, err := p.routerConn(target)
	if err != nil {
		return nil, fmt.Errorf("modal: router: %w", err)
	}
	r := &router{sandboxID: sandboxID, taskID: taskID, url: u, conn: conn, rc: routerpb.NewTaskCommandRouterClient(conn),
		jwt: jwt, exp: jwtExpiry(jwt, time.Now().Add(time.Minute))}
	rctx, cancel := context.WithTimeout(ctx, routerReadyWait)
	defer cancel()
	conn.Connect()
	for {
		s := conn.GetState()
		if s == connectivity.Ready {
			return r, nil
		}
		if !conn.WaitForStateChange(rctx, s) {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, errors.New("modal: the sandbox's command router did not accept a connection within 5 minutes")
		}
	}
}

// routerConn returns the shared connection to a router host, dialling it
// once per process; after Close it dials nothing.
func (p *Provider) routerConn(target string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("modal: the provider is closed")
	}
	if c, ok := p.routerConns[target]; ok {
		return c, nil
	}
	c, err := p.dial(target, true, false)
	if err != nil {
		return nil, err
	}
	p.routerConns[target] = c
	return c, nil
}

// routerAccess calls TaskGetCommandRouterAccess.
func (p *Provider) routerAccess(ctx context.Context, taskID string) (jwt, u string, err error) {
	cctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	resp, err := p.client.TaskGetCommandRouterAccess(cctx, &clientpb.TaskGetCommandRouterAccessRequest{TaskId: taskID}, retryable)
	switch {
	case status.Code(err) == codes.NotFound:
		return "", "", fmt.Errorf("modal: %w", providers.ErrSandboxGone)
	case status.Code(err) == codes.FailedPrecondition:
		return "", "", errors.New("modal: Modal has no command router for this sandbox's task (FAILED_PRECONDITION)")
	case err != nil:
		return "", "", vendorError("router access", err)
	}
	return resp.GetJwt(), resp.GetUrl(), nil
}

// routerTarget checks that a router URL is https://host[:port] and returns
// its dial target (port 443 by default).
func routerTarget(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return "", errors.New("modal: the router URL Modal handed out is not https")
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	host := u.Hostname()
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return host + ":" + port, nil
}

// refresh gets a new JWT after an UNAUTHENTICATED router call, unless the
// current one is valid for more than 30 s (then the refusal is not about
// expiry). A new URL is an error, as in the SDK.
func (p *Provider) refresh(ctx context.Context, r *router) error {
	r.mu.Lock()
	fresh := time.Until(r.exp) > jwtFresh
	r.mu.Unlock()
	if fresh {
		return errors.New("modal: the router refused a valid JWT")
	}
	jwt, u, err := p.routerAccess(ctx, r.taskID)
	if err != nil {
		return err
	}
	if u != r.url {
		return errors.New("modal: the router URL changed")
	}
	r.mu.Lock()
	r.jwt, r.exp = jwt, jwtExpiry(jwt, time.Now().Add(time.Minute))
	r.mu.Unlock()
	return nil
}

// retryPolicy says which codes a router call may be retried on; nil means
// never (the call may have run).
type retryPolicy func(codes.Code) bool

// snapshotRetry is the snapshot calls' policy: transient codes except
// DEADLINE_EXCEEDED and CANCELED.
func snapshotRetry(c codes.Code) bool {
	return transient(c) && c != codes.DeadlineExceeded && c != codes.Canceled
}

// call runs one router call with the JWT. UNAUTHENTICATED refreshes the
// JWT once and calls again (the refusal proves the call did not run);
// other failures are retried only under retry, 10 times from 10 ms.
func (p *Provider) call(ctx context.Context, r *router, retry retryPolicy, f func(context.Context) error) error {
	refreshed := false
	wait := routerBackoff
	for attempt := 0; ; {
		err := f(r.authed(ctx))
		if err == nil || ctx.Err() != nil {
			return err
		}
		code := status.Code(err)
		if code == codes.Unauthenticated && !refreshed {
			refreshed = true
			if rerr := p.refresh(ctx, r); rerr != nil {
				return rerr
			}
			continue
		}
		if retry == nil || attempt >= routerRetries || !retry(code) {
			return err
		}
		if !sleep(ctx, wait) {
			return err
		}
		wait *= 2
		attempt++
	}
}

// done reports whether sandbox id has finished (or never existed), by a
// SandboxWait with timeout 0.
func (p *Provider) done(ctx context.Context, id string) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	resp, err := p.client.SandboxWait(cctx, &clientpb.SandboxWaitRequest{SandboxId: id, Timeout: 0}, retryable)
	switch {
	case status.Code(err) == codes.NotFound:
		return true, nil
	case err != nil:
		return false, vendorError("sandbox wait", err)
	}
	return resp.Result != nil, nil
}

// routerError maps a failed router call of op: ErrSandboxGone when the
// sandbox has finished (the cached router is dropped), else a vendorErr.
func (p *Provider) routerError(ctx context.Context, r *router, op string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// A fresh context: the caller's may be nearly spent.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.Timeout)
	defer cancel()
	if gone, derr := p.done(cctx, r.sandboxID); derr == nil && gone {
		p.forget(r.sandboxID)
		return fmt.Errorf("modal: %s: %w", op, providers.ErrSandboxGone)
	}
	return vendorError(op, err)
}
