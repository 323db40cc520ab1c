package modal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/modal/proto/clientpb"
)

// Bounds Modal puts on a sandbox: whole seconds, a lifetime of at most 24 h.
const maxLifetime = 24 * time.Hour

// app returns the id of the broker's App, get-or-created once per process.
func (p *Provider) app(ctx context.Context) (string, error) {
	p.mu.Lock()
	id := p.appID
	p.mu.Unlock()
	if id != "" {
		return id, nil
	}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	resp, err := p.client.AppGetOrCreate(cctx, &clientpb.AppGetOrCreateRequest{
		AppName:            p.cfg.App,
		EnvironmentName:    p.cfg.Environment,
		ObjectCreationType: clientpb.ObjectCreationType_OBJECT_CREATION_TYPE_CREATE_IF_MISSING,
	}, retryable)
	if err != nil {
		return "", vendorError("app get-or-create", err)
	}
	p.mu.Lock()
	p.appID = resp.GetAppId()
	p.mu.Unlock()
	return resp.GetAppId(), nil
}

// image returns the image id of a registry tag, built or looked up once
// per process and cached by tag.
func (p *Provider) image(ctx context.Context, appID, tag string) (string, error) {
	p.mu.Lock()
	l, ok := p.imageMu[tag]
	if !ok {
		l = &sync.Mutex{}
		p.imageMu[tag] = l
	}
	p.mu.Unlock()
	l.Lock()
	defer l.Unlock()
	p.mu.Lock()
	id, ok := p.images[tag]
	p.mu.Unlock()
	if ok {
		return id, nil
	}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	resp, err := p.client.ImageGetOrCreate(cctx, &clientpb.ImageGetOrCreateRequest{
		Image:          &clientpb.Image{DockerfileCommands: []string{"FROM " + tag}},
		AppId:          appID,
		BuilderVersion: p.cfg.BuilderVersion,
	}, retryable)
	cancel()
	if err != nil {
		return "", vendorError("image get-or-create", err)
	}
	id = resp.GetImageId()
	result := resp.GetResult()
	if result.GetStatus() == clientpb.GenericResult_GENERIC_STATUS_UNSPECIFIED {
		if result, err = p.joinImage(ctx, id); err != nil {
			return "", err
		}
	}
	if s := result.GetStatus(); s != clientpb.GenericResult_GENERIC_STATUS_SUCCESS {
		// The exception text stays out: it is Modal's build log.
		return "", fmt.Errorf("modal: the image build ended %s; check that the registry tag exists and is public", s)
	}
	p.mu.Lock()
	p.images[tag] = id
	p.mu.Unlock()
	return id, nil
}

// joinImage follows ImageJoinStreaming until the build has a result,
// reopening the stream from the last entry id when it ends without one.
func (p *Provider) joinImage(ctx context.Context, id string) (*clientpb.GenericResult, error) {
	last := ""
	wait := initialBackoff
	for {
		stream, err := p.client.ImageJoinStreaming(ctx, &clientpb.ImageJoinStreamingRequest{ImageId: id, Timeout: 55, LastEntryId: last})
		for err == nil {
			var msg *clientpb.ImageJoinStreamingResponse
			msg, err = stream.Recv()
			if err != nil {
				break
			}
			if e := msg.GetEntryId(); e != "" {
				last = e
			}
			if r := msg.GetResult(); r.GetStatus() != clientpb.GenericResult_GENERIC_STATUS_UNSPECIFIED {
				return r, nil
			}
		}
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err == io.EOF:
			wait = initialBackoff
			continue
		case !transient(status.Code(err)):
			return nil, vendorError("image join", err)
		}
		if !sleep(ctx, wait) {
			return nil, ctx.Err()
		}
		wait = min(2*wait, maxBackoff)
	}
}

// tags are the broker's identifiers on a sandbox, never anything a client sent.
func tags(labels map[string]string) []*clientpb.SandboxTag {
	var out []*clientpb.SandboxTag
	for _, k := range []string{providers.LabelBroker, providers.LabelInstance, providers.LabelWorkspace} {
		if v, ok := labels[k]; ok {
			out = append(out, &clientpb.SandboxTag{TagName: k, TagValue: v})
		}
	}
	return out
}

// noNetwork is the only egress policy sandgate gives a Modal sandbox: an
// allowlist with both lists empty, which the sheet says blocks all public
// egress (and keeps no private sandbox networking, since i6pn is never
// enabled). Modal's domain allowlist is not used: the sheet is uncertain
// whether it judges connections to literal IP addresses at all, and a
// workspace's allowlist must not rest on that.
func noNetwork() *clientpb.NetworkAccess {
	return &clientpb.NetworkAccess{NetworkAccessType: clientpb.NetworkAccess_ALLOWLIST}
}

// errNoEgress refuses an allowlist with domains (see noNetwork).
var errNoEgress = errors.New("modal: create: Modal offers no domain allowlist sandgate can rely on; only an empty allowlist (no network) is supported")

// lifetimeAt is the sandbox's timeout at now: whole seconds that end it no
// later than expiresAt, within Modal's 24 h.
func lifetimeAt(expiresAt, now time.Time) (time.Duration, error) {
	lifetime := expiresAt.Sub(now).Truncate(time.Second)
	switch {
	case lifetime < time.Second:
		return 0, errors.New("modal: create: expires_at is less than a second away")
	case lifetime > maxLifetime:
		return 0, errors.New("modal: create: Modal ends every sandbox within 24 h; max_lifetime must not be longer")
	}
	return lifetime, nil
}

// Create creates the sandbox: the broker's App, the image, the env as an
// ephemeral Secret, then SandboxCreate with the timeout, idle timeout,
// limits equal to requests, no network (noNetwork) and the broker's tags.
// It returns once the sandbox's task runs and its command router accepts a
// connection; a failure after SandboxCreate terminates the sandbox.
func (p *Provider) Create(ctx context.Context, spec providers.CreateSpec) (providers.Sandbox, error) {
	if len(spec.Egress.AllowedDomains) > 0 {
		return providers.Sandbox{}, errNoEgress
	}
	size, ok := p.Capabilities().Size(spec.Size.Name)
	if !ok || size != spec.Size {
		return providers.Sandbox{}, errors.New("modal: create: not one of Modal's sizes")
	}
	image := spec.Image
	if image == "" {
		image = p.cfg.DefaultImage
	}
	if !p.Capabilities().RunsImage(image) {
		return providers.Sandbox{}, errors.New("modal: create: image not allowed by the provider's images")
	}
	lifetime, err := lifetimeAt(spec.ExpiresAt, p.clock.Now())
	if err != nil {
		return providers.Sandbox{}, err
	}
	def := &clientpb.Sandbox{
		Resources: &clientpb.Resources{
			MilliCpu: uint32(1000 * size.CPUCores), MilliCpuMax: uint32(1000 * size.CPUCores),
			MemoryMb: uint32(size.MemoryMiB), MemoryMbMax: uint32(size.MemoryMiB),
			GpuConfig: &clientpb.GPUConfig{}, // all zero, as the SDK sends it
		},
		TimeoutSecs:    uint32(lifetime / time.Second),
		OpenPortsOneof: &clientpb.Sandbox_OpenPorts{OpenPorts: &clientpb.PortSpecs{}},
		NetworkAccess:  noNetwork(),
	}
	if spec.IdleTimeout > 0 {
		idle := uint32(min(max(spec.IdleTimeout.Truncate(time.Second), time.Second), lifetime) / time.Second)
		def.IdleTimeoutSecs = &idle
	}
	appID, err := p.app(ctx)
	if err != nil {
		return providers.Sandbox{}, fmt.Errorf("modal: create: %w", err)
	}
	if def.ImageId, err = p.image(ctx, appID, image); err != nil {
		return providers.Sandbox{}, fmt.Errorf("modal: create: %w", err)
	}
	if len(spec.Env) > 0 {
		// The env travels as an ephemeral Secret of the App, as the SDKs
		// send a sandbox's env; the broker keeps no copy.
		cctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
		resp, err := p.client.SecretGetOrCreate(cctx, &clientpb.SecretGetOrCreateRequest{
			EnvironmentName:    p.cfg.Environment,
			ObjectCreationType: clientpb.ObjectCreationType_OBJECT_CREATION_TYPE_EPHEMERAL,
			EnvDict:            spec.Env,
			AppId:              appID,
		})
		cancel()
		if err != nil {
			return providers.Sandbox{}, vendorError("create: env secret", err)
		}
		def.SecretIds = []string{resp.GetSecretId()}
	}
	labels := map[string]string{
		providers.LabelBroker:    p.brokerID,
		providers.LabelWorkspace: spec.WorkspaceID,
		providers.LabelInstance:  spec.InstanceID,
	}
	// The App, the image (a build can stream for minutes) and the Secret
	// took time: the timeout counts from now, so that it still ends the
	// sandbox by expires_at.
	now := p.clock.Now()
	if lifetime, err = lifetimeAt(spec.ExpiresAt, now); err != nil {
		return providers.Sandbox{}, err
	}
	def.TimeoutSecs = uint32(lifetime / time.Second)
	if def.IdleTimeoutSecs != nil {
		*def.IdleTimeoutSecs = min(*def.IdleTimeoutSecs, def.TimeoutSecs)
	}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	// Not retried: a retry could create a second sandbox. The reaper's
	// unconfirmed-create pass finds a sandbox created anyway by its tags.
	resp, err := p.client.SandboxCreate(cctx, &clientpb.SandboxCreateRequest{AppId: appID, Definition: def, Tags: tags(labels)})
	cancel()
	if err != nil {
		return providers.Sandbox{}, vendorError("create", err)
	}
	sb := providers.Sandbox{Ref: resp.GetSandboxId(), Labels: labels, StartedAt: now}
	if _, err := p.router(ctx, sb.Ref); err != nil {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.Timeout)
		if terr := p.Terminate(tctx, sb); terr != nil {
			p.log.Error("terminate after failed create", sandgate.WorkspaceAttr(spec.WorkspaceID), sandgate.KeyError, terr)
		}
		cancel()
		if errors.Is(err, providers.ErrSandboxGone) {
			return providers.Sandbox{}, fmt.Errorf("modal: create: the sandbox ended before it ran: %w", err)
		}
		return providers.Sandbox{}, fmt.Errorf("modal: create: %w", err)
	}
	p.log.Info("sandbox created", sandgate.WorkspaceAttr(spec.WorkspaceID), sandgate.InstanceAttr(spec.InstanceID),
		"cpu_cores", size.CPUCores, "memory_mib", size.MemoryMiB, "env_count", len(spec.Env),
		"egress_domains", len(spec.Egress.AllowedDomains), "timeout_secs", def.TimeoutSecs)
	return sb, nil
}

// Terminate ends the sandbox and waits until Modal reports it finished. A
// sandbox that is already gone is not an error.
func (p *Provider) Terminate(ctx context.Context, sb providers.Sandbox) error {
	p.forget(sb.Ref)
	if sb.Ref == "" {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	_, err := p.client.SandboxTerminate(cctx, &clientpb.SandboxTerminateRequest{SandboxId: sb.Ref}, retryable)
	cancel()
	switch {
	case status.Code(err) == codes.NotFound:
		return nil
	case err != nil:
		return vendorError("terminate", err)
	}
	for {
		cctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
		resp, err := p.client.SandboxWait(cctx, &clientpb.SandboxWaitRequest{SandboxId: sb.Ref, Timeout: 10}, retryable)
		cancel()
		switch {
		case status.Code(err) == codes.NotFound, err == nil && resp.Result != nil:
			p.forget(sb.Ref)
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("modal: terminate: not confirmed: %w", ctx.Err())
		case err != nil && status.Code(err) != codes.DeadlineExceeded:
			return vendorError("terminate: wait", err)
		}
	}
}

// List returns the live sandboxes of the broker's App that carry this
// broker's tag.
func (p *Provider) List(ctx context.Context) ([]providers.Sandbox, error) {
	appID, err := p.app(ctx)
	if err != nil {
		return nil, fmt.Errorf("modal: list: %w", err)
	}
	return p.list(ctx, appID, p.brokerID)
}

// ListBroker implements providers.BrokerLister: the live sandboxes that
// carry broker id's tag, in that broker's App when App names come from
// broker ids (none when it has no App), in the configured App otherwise.
func (p *Provider) ListBroker(ctx context.Context, id string) ([]providers.Sandbox, error) {
	if id == p.brokerID {
		return p.List(ctx)
	}
	appID, err := p.app(ctx)
	if err != nil {
		return nil, fmt.Errorf("modal: list: %w", err)
	}
	if p.ownApp {
		cctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
		resp, err := p.client.AppGetOrCreate(cctx, &clientpb.AppGetOrCreateRequest{
			AppName:         appName(id),
			EnvironmentName: p.cfg.Environment,
		}, retryable)
		cancel()
		if status.Code(err) == codes.NotFound {
			return nil, nil // that broker never created a sandbox here
		}
		if err != nil {
			return nil, vendorError("list: app lookup", err)
		}
		appID = resp.GetAppId()
	}
	return p.list(ctx, appID, id)
}

// appName is the App of broker id when the configuration names none.
func appName(brokerID string) string { return "sandgate-" + strings.TrimPrefix(brokerID, "sandgate-") }

// list returns the live sandboxes of App appID that carry broker id's
// tag, page by page (each page before the last one's created_at).
func (p *Provider) list(ctx context.Context, appID, brokerID string) ([]providers.Sandbox, error) {
	var out []providers.Sandbox
	seen := map[string]bool{}
	before := 0.0
	for {
		cctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
		resp, err := p.client.SandboxList(cctx, &clientpb.SandboxListRequest{
			AppId:           appID,
			BeforeTimestamp: before,
			EnvironmentName: p.cfg.Environment,
			Tags:            []*clientpb.SandboxTag{{TagName: providers.LabelBroker, TagValue: brokerID}},
		}, retryable)
		cancel()
		if err != nil {
			return nil, vendorError("list", err)
		}
		page := resp.GetSandboxes()
		if len(page) == 0 {
			return out, nil
		}
		for _, s := range page {
			if seen[s.GetId()] {
				continue
			}
			seen[s.GetId()] = true
			labels := map[string]string{}
			for _, t := range s.GetTags() {
				switch t.GetTagName() {
				case providers.LabelBroker, providers.LabelInstance, providers.LabelWorkspace:
					labels[t.GetTagName()] = t.GetTagValue()
				}
			}
			if labels[providers.LabelBroker] != brokerID {
				continue // Modal returns only sandboxes with every tag asked; this is a guard
			}
			out = append(out, providers.Sandbox{Ref: s.GetId(), Labels: labels, StartedAt: epoch(s.GetCreatedAt())})
		}
		next := page[len(page)-1].GetCreatedAt()
		if before != 0 && next >= before {
			return out, nil // no progress: stop rather than loop
		}
		before = next
	}
}

// epoch converts Modal's float epoch seconds.
func epoch(s float64) time.Time {
	if s <= 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(s*float64(time.Second))).UTC()
}
