package modaltest

import (
	"context"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/sandgate/sandgate/providers/modal/proto/clientpb"
)

// controlPlane implements modal.client.ModalClient.
type controlPlane struct {
	clientpb.UnimplementedModalClientServer
	s *Server
}

func (c *controlPlane) AuthTokenGet(ctx context.Context, _ *clientpb.AuthTokenGetRequest) (*clientpb.AuthTokenGetResponse, error) {
	return &clientpb.AuthTokenGetResponse{Token: c.s.jwt("client", 20*time.Minute)}, nil
}

func (c *controlPlane) AppGetOrCreate(ctx context.Context, req *clientpb.AppGetOrCreateRequest) (*clientpb.AppGetOrCreateResponse, error) {
	if req.GetAppName() == "" {
		return nil, status.Error(codes.InvalidArgument, "app name required")
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	k := req.GetEnvironmentName() + "/" + req.GetAppName()
	id, ok := s.apps[k]
	switch {
	case ok && req.GetObjectCreationType() == clientpb.ObjectCreationType_OBJECT_CREATION_TYPE_CREATE_FAIL_IF_EXISTS:
		return nil, status.Error(codes.AlreadyExists, "app exists")
	case ok:
	case req.GetObjectCreationType() == clientpb.ObjectCreationType_OBJECT_CREATION_TYPE_UNSPECIFIED:
		return nil, status.Error(codes.NotFound, "no such app")
	default:
		id = newID("ap-")
		s.apps[k] = id
		s.appNames[id] = req.GetAppName()
	}
	return &clientpb.AppGetOrCreateResponse{AppId: id}, nil
}

func (c *controlPlane) ImageGetOrCreate(ctx context.Context, req *clientpb.ImageGetOrCreateRequest) (*clientpb.ImageGetOrCreateResponse, error) {
	s := c.s
	cmds := req.GetImage().GetDockerfileCommands()
	if len(cmds) != 1 || !strings.HasPrefix(cmds[0], "FROM ") || req.GetBuilderVersion() == "" {
		return nil, status.Error(codes.InvalidArgument, "the fake builds only FROM <tag> with a builder version")
	}
	tag := strings.TrimPrefix(cmds[0], "FROM ")
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.appNames[req.GetAppId()] == "" {
		return nil, status.Error(codes.NotFound, "no such app")
	}
	for _, im := range s.images {
		if im.tag == tag && !im.snapshot {
			return &clientpb.ImageGetOrCreateResponse{ImageId: im.id, Result: im.result()}, nil
		}
	}
	im := &image{id: newID("im-"), tag: tag, failed: strings.Contains(tag, "does-not-exist")}
	s.images[im.id] = im
	// The build finishes a moment later; its result comes by ImageJoinStreaming.
	go func() {
		time.Sleep(50 * time.Millisecond)
		s.mu.Lock()
		im.built = true
		s.mu.Unlock()
	}()
	return &clientpb.ImageGetOrCreateResponse{ImageId: im.id}, nil
}

// result is the build's result, nil while it builds.
func (im *image) result() *clientpb.GenericResult {
	switch {
	case !im.built:
		return nil
	case im.failed:
		return &clientpb.GenericResult{Status: clientpb.GenericResult_GENERIC_STATUS_FAILURE, Exception: "manifest unknown"}
	}
	return &clientpb.GenericResult{Status: clientpb.GenericResult_GENERIC_STATUS_SUCCESS}
}

// ImageJoinStreaming ends its first stream without a result, as Modal's
// may, so that clients resume from the last entry id.
func (c *controlPlane) ImageJoinStreaming(req *clientpb.ImageJoinStreamingRequest, stream grpc.ServerStreamingServer[clientpb.ImageJoinStreamingResponse]) error {
	s := c.s
	s.mu.Lock()
	im := s.images[req.GetImageId()]
	if im == nil {
		s.mu.Unlock()
		return status.Error(codes.NotFound, "no such image")
	}
	im.joins++
	first := im.joins == 1 && req.GetLastEntryId() == ""
	s.mu.Unlock()
	if err := stream.Send(&clientpb.ImageJoinStreamingResponse{EntryId: "1"}); err != nil {
		return err
	}
	if first {
		return nil
	}
	deadline := time.Now().Add(time.Duration(req.GetTimeout() * float32(time.Second)))
	for {
		s.mu.Lock()
		r := im.result()
		s.mu.Unlock()
		if r != nil {
			return stream.Send(&clientpb.ImageJoinStreamingResponse{Result: r, EntryId: "2", Eof: true})
		}
		if time.Now().After(deadline) {
			return nil
		}
		select {
		case <-stream.Context().Done():
			return stream.Context().Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (c *controlPlane) ImageFromId(ctx context.Context, req *clientpb.ImageFromIdRequest) (*clientpb.ImageFromIdResponse, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.images[req.GetImageId()] == nil {
		return nil, status.Error(codes.NotFound, "no such image")
	}
	return &clientpb.ImageFromIdResponse{ImageId: req.GetImageId()}, nil
}

func (c *controlPlane) ImageDelete(ctx context.Context, req *clientpb.ImageDeleteRequest) (*emptypb.Empty, error) {
	s := c.s
	s.mu.Lock()
	im := s.images[req.GetImageId()]
	delete(s.images, req.GetImageId())
	s.mu.Unlock()
	if im == nil {
		return nil, status.Error(codes.NotFound, "no such image")
	}
	if im.snapshot {
		if err := s.local.DeleteSnapshot(ctx, localRef(im.id)); err != nil {
			return nil, status.Error(codes.Internal, "delete failed")
		}
	}
	return &emptypb.Empty{}, nil
}

func (c *controlPlane) SecretGetOrCreate(ctx context.Context, req *clientpb.SecretGetOrCreateRequest) (*clientpb.SecretGetOrCreateResponse, error) {
	s := c.s
	if req.GetObjectCreationType() != clientpb.ObjectCreationType_OBJECT_CREATION_TYPE_EPHEMERAL || req.GetDeploymentName() != "" {
		return nil, status.Error(codes.Unimplemented, "the fake makes ephemeral secrets only")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.appNames[req.GetAppId()] == "" {
		return nil, status.Error(codes.NotFound, "no such app")
	}
	id := newID("st-")
	env := map[string]string{}
	for k, v := range req.GetEnvDict() {
		env[k] = v
	}
	s.secrets[id] = env
	return &clientpb.SecretGetOrCreateResponse{SecretId: id}, nil
}

func (c *controlPlane) SandboxCreate(ctx context.Context, req *clientpb.SandboxCreateRequest) (*clientpb.SandboxCreateResponse, error) {
	s := c.s
	def := req.GetDefinition()
	res := def.GetResources()
	na := def.GetNetworkAccess()
	switch {
	case def == nil:
		return nil, status.Error(codes.InvalidArgument, "definition required")
	case res.GetMilliCpuMax() != 0 && res.GetMilliCpuMax() < res.GetMilliCpu(),
		res.GetMemoryMbMax() != 0 && res.GetMemoryMbMax() < res.GetMemoryMb():
		return nil, status.Error(codes.InvalidArgument, "a limit is below its request")
	case def.GetTimeoutSecs() > 24*3600:
		return nil, status.Error(codes.InvalidArgument, "timeout over 24 h")
	case na.GetNetworkAccessType() == clientpb.NetworkAccess_BLOCKED && (len(na.GetAllowedDomains()) > 0 || len(na.GetAllowedCidrs()) > 0):
		return nil, status.Error(codes.InvalidArgument, "BLOCKED with an allowlist")
	case na.GetNetworkAccessType() != clientpb.NetworkAccess_ALLOWLIST || len(na.GetAllowedDomains()) > 0 || len(na.GetAllowedCidrs()) > 0:
		// Modal would open some network; the fake's sandboxes have none.
		return nil, status.Error(codes.FailedPrecondition, "modaltest models only ALLOWLIST with both lists empty")
	}
	timeout := time.Duration(def.GetTimeoutSecs()) * time.Second
	if timeout == 0 {
		timeout = 300 * time.Second
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.appNames[req.GetAppId()] == "" {
		return nil, status.Error(codes.NotFound, "no such app")
	}
	if im := s.images[def.GetImageId()]; im == nil || im.result().GetStatus() != clientpb.GenericResult_GENERIC_STATUS_SUCCESS {
		return nil, status.Error(codes.FailedPrecondition, "image not built")
	}
	env := map[string]string{}
	for _, id := range def.GetSecretIds() {
		sec, ok := s.secrets[id]
		if !ok {
			return nil, status.Error(codes.NotFound, "no such secret")
		}
		for k, v := range sec {
			env[k] = v
		}
	}
	sb := &sandbox{
		s: s, id: newID("sb-"), appID: req.GetAppId(), req: proto.Clone(req).(*clientpb.SandboxCreateRequest), env: env,
		created: s.now(), timeout: timeout, done: make(chan struct{}), scheduled: make(chan struct{}),
	}
	if def.IdleTimeoutSecs != nil {
		sb.idle = time.Duration(def.GetIdleTimeoutSecs()) * time.Second
	}
	s.sandboxes[sb.id] = sb
	go s.schedule(sb)
	return &clientpb.SandboxCreateResponse{SandboxId: sb.id}, nil
}

func (s *Server) sandbox(id string) (*sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandboxes[id]
	if sb == nil {
		return nil, status.Error(codes.NotFound, "no such sandbox")
	}
	return sb, nil
}

func (c *controlPlane) SandboxGetTaskId(ctx context.Context, req *clientpb.SandboxGetTaskIdRequest) (*clientpb.SandboxGetTaskIdResponse, error) {
	sb, err := c.s.sandbox(req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	if req.Timeout != nil {
		// Long-poll until scheduled or the timeout.
		select {
		case <-sb.scheduled:
		case <-time.After(time.Duration(req.GetTimeout() * float32(time.Second))):
		case <-ctx.Done():
		}
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	switch {
	case sb.result != nil:
		return &clientpb.SandboxGetTaskIdResponse{TaskResult: proto.Clone(sb.result).(*clientpb.GenericResult)}, nil
	case sb.taskID != "":
		return &clientpb.SandboxGetTaskIdResponse{TaskId: proto.String(sb.taskID)}, nil
	}
	return &clientpb.SandboxGetTaskIdResponse{}, nil
}

func (c *controlPlane) TaskGetCommandRouterAccess(ctx context.Context, req *clientpb.TaskGetCommandRouterAccessRequest) (*clientpb.TaskGetCommandRouterAccessResponse, error) {
	s := c.s
	s.mu.Lock()
	sb := s.tasks[req.GetTaskId()]
	s.mu.Unlock()
	if sb == nil || sb.finished() {
		return nil, status.Error(codes.NotFound, "no such task")
	}
	return &clientpb.TaskGetCommandRouterAccessResponse{Jwt: s.jwt(req.GetTaskId(), s.cfg.JWTTTL), Url: s.routerURL}, nil
}

func (c *controlPlane) SandboxWait(ctx context.Context, req *clientpb.SandboxWaitRequest) (*clientpb.SandboxWaitResponse, error) {
	sb, err := c.s.sandbox(req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	if t := req.GetTimeout(); t > 0 {
		select {
		case <-sb.done:
		case <-time.After(time.Duration(t * float32(time.Second))):
		case <-ctx.Done():
		}
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return &clientpb.SandboxWaitResponse{Result: proto.Clone(sb.result).(*clientpb.GenericResult)}, nil
}

func (c *controlPlane) SandboxTerminate(ctx context.Context, req *clientpb.SandboxTerminateRequest) (*clientpb.SandboxTerminateResponse, error) {
	sb, err := c.s.sandbox(req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	sb.mu.Lock()
	existing := proto.Clone(sb.result).(*clientpb.GenericResult)
	sb.mu.Unlock()
	if existing != nil {
		return &clientpb.SandboxTerminateResponse{ExistingResult: existing}, nil
	}
	c.s.finish(sb, clientpb.GenericResult_GENERIC_STATUS_TERMINATED)
	return &clientpb.SandboxTerminateResponse{}, nil
}

// SandboxList returns a page of the app's sandboxes that carry all the
// requested tags, newest first, created before before_timestamp.
func (c *controlPlane) SandboxList(ctx context.Context, req *clientpb.SandboxListRequest) (*clientpb.SandboxListResponse, error) {
	s := c.s
	s.mu.Lock()
	var all []*sandbox
	for _, sb := range s.sandboxes {
		all = append(all, sb)
	}
	s.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].created.After(all[j].created) })
	resp := &clientpb.SandboxListResponse{}
	for _, sb := range all {
		created := float64(sb.created.UnixNano()) / 1e9
		switch {
		case req.GetAppId() != "" && sb.appID != req.GetAppId(),
			req.GetBeforeTimestamp() != 0 && created >= req.GetBeforeTimestamp(),
			!req.GetIncludeFinished() && sb.finished(),
			!hasTags(sb.req.GetTags(), req.GetTags()):
			continue
		}
		resp.Sandboxes = append(resp.Sandboxes, &clientpb.SandboxInfo{
			Id: sb.id, CreatedAt: created, AppId: sb.appID, Tags: sb.req.GetTags(),
		})
		if len(resp.Sandboxes) == s.cfg.ListPage {
			break
		}
	}
	return resp, nil
}

func hasTags(have, want []*clientpb.SandboxTag) bool {
	for _, w := range want {
		if !slices.ContainsFunc(have, func(h *clientpb.SandboxTag) bool {
			return h.GetTagName() == w.GetTagName() && h.GetTagValue() == w.GetTagValue()
		}) {
			return false
		}
	}
	return true
}
