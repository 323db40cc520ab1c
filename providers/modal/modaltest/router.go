package modaltest

import (
	"context"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/modal/proto/routerpb"
)

// taskRouter implements modal.task_command_router.TaskCommandRouter.
type taskRouter struct {
	routerpb.UnimplementedTaskCommandRouterServer
	s *Server
}

// snapshotSliding is a directory snapshot's lifetime without ttl_seconds:
// 30 days after its last creation or use.
const snapshotSliding = 30 * 24 * time.Hour

func localRef(imageID string) providers.SnapshotRef {
	return providers.SnapshotRef{ID: imageID, Ref: imageID}
}

// maxCommandArgBytes is the most command_args Modal's SDKs send (the
// sheet: under 64 KiB, counting a NUL after each argument).
const maxCommandArgBytes = 65536

func (t *taskRouter) TaskExecStart(ctx context.Context, req *routerpb.TaskExecStartRequest) (*routerpb.TaskExecStartResponse, error) {
	sb, err := t.s.authorizedTask(ctx, req.GetTaskId())
	if err != nil {
		return nil, err
	}
	if len(req.GetCommandArgs()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "empty command")
	}
	n := 0
	for _, a := range req.GetCommandArgs() {
		n += len(a) + 1
	}
	if n > maxCommandArgBytes {
		return nil, status.Error(codes.InvalidArgument, "command_args too long")
	}
	if err := sb.startExec(req); err != nil {
		return nil, status.Error(codes.Internal, "exec start failed")
	}
	t.s.mu.Lock()
	t.s.execReqs = append(t.s.execReqs, proto.Clone(req).(*routerpb.TaskExecStartRequest))
	t.s.mu.Unlock()
	return &routerpb.TaskExecStartResponse{}, nil
}

// taskDir returns the authorized task's sandbox and the directory p it
// names, which must be absolute and not /.
func (t *taskRouter) taskDir(ctx context.Context, taskID string, p []byte) (*sandbox, string, error) {
	sb, err := t.s.authorizedTask(ctx, taskID)
	if err != nil {
		return nil, "", err
	}
	dir := string(p)
	if !path.IsAbs(dir) || path.Clean(dir) == "/" {
		return nil, "", status.Error(codes.InvalidArgument, "the path must be absolute and not /")
	}
	return sb, dir, nil
}

func (t *taskRouter) execOf(ctx context.Context, taskID, execID string) (*sandbox, *execState, error) {
	sb, err := t.s.authorizedTask(ctx, taskID)
	if err != nil {
		return nil, nil, err
	}
	e := sb.exec(execID)
	if e == nil {
		return nil, nil, status.Error(codes.NotFound, "no such exec")
	}
	return sb, e, nil
}

func (t *taskRouter) TaskExecStdinWrite(ctx context.Context, req *routerpb.TaskExecStdinWriteRequest) (*routerpb.TaskExecStdinWriteResponse, error) {
	sb, e, err := t.execOf(ctx, req.GetTaskId(), req.GetExecId())
	if err != nil {
		return nil, err
	}
	sb.touch()
	if err := e.writeStdin(req.GetOffset(), req.GetData(), req.GetEof()); err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	return &routerpb.TaskExecStdinWriteResponse{}, nil
}

// TaskExecStdioRead streams an output file from offset; it ends with a
// clean EOF once the exec has exited and the file is read to its end.
func (t *taskRouter) TaskExecStdioRead(req *routerpb.TaskExecStdioReadRequest, stream grpc.ServerStreamingServer[routerpb.TaskExecStdioReadResponse]) error {
	sb, e, err := t.execOf(stream.Context(), req.GetTaskId(), req.GetExecId())
	if err != nil {
		return err
	}
	name, fd := "out", 0
	if req.GetFileDescriptor() == routerpb.TaskExecStdioFileDescriptor_TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDERR {
		name, fd = "err", 1
	}
	if e.devnull[fd] {
		return nil
	}
	f, err := os.Open(filepath.Join(e.dir, name))
	if err != nil {
		return status.Error(codes.NotFound, "the task has finished")
	}
	defer f.Close()
	if _, err := f.Seek(int64(req.GetOffset()), io.SeekStart); err != nil {
		return status.Error(codes.OutOfRange, "bad offset")
	}
	buf := make([]byte, 1<<20)
	for {
		exited := false
		select {
		case <-e.exited:
			exited = true
		default:
		}
		n, err := f.Read(buf)
		if n > 0 {
			if err := stream.Send(&routerpb.TaskExecStdioReadResponse{Data: append([]byte{}, buf[:n]...)}); err != nil {
				return err
			}
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return status.Error(codes.Internal, "read failed")
		}
		if exited {
			return nil
		}
		select {
		case <-stream.Context().Done():
			return stream.Context().Err()
		case <-sb.done:
			return status.Error(codes.NotFound, "the task has finished")
		case <-e.exited:
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// exitStatus reports sh's status as Modal does: a signal apart.
func exitStatus(st int) (code, signal int32, isSignal bool) {
	if st > 128 && st < 128+65 {
		return 0, int32(st - 128), true
	}
	return int32(st), 0, false
}

func (t *taskRouter) TaskExecWait(ctx context.Context, req *routerpb.TaskExecWaitRequest) (*routerpb.TaskExecWaitResponse, error) {
	sb, e, err := t.execOf(ctx, req.GetTaskId(), req.GetExecId())
	if err != nil {
		return nil, err
	}
	select {
	case <-e.exited:
	case <-sb.done:
		return nil, status.Error(codes.NotFound, "the task has finished")
	case <-ctx.Done():
		return nil, status.Error(codes.DeadlineExceeded, "still running")
	}
	code, sig, isSig := exitStatus(e.status)
	if isSig {
		return &routerpb.TaskExecWaitResponse{ExitStatus: &routerpb.TaskExecWaitResponse_Signal{Signal: sig}}, nil
	}
	return &routerpb.TaskExecWaitResponse{ExitStatus: &routerpb.TaskExecWaitResponse_Code{Code: code}}, nil
}

func (t *taskRouter) TaskExecPoll(ctx context.Context, req *routerpb.TaskExecPollRequest) (*routerpb.TaskExecPollResponse, error) {
	_, e, err := t.execOf(ctx, req.GetTaskId(), req.GetExecId())
	if err != nil {
		return nil, err
	}
	select {
	case <-e.exited:
	default:
		return &routerpb.TaskExecPollResponse{}, nil
	}
	code, sig, isSig := exitStatus(e.status)
	if isSig {
		return &routerpb.TaskExecPollResponse{ExitStatus: &routerpb.TaskExecPollResponse_Signal{Signal: sig}}, nil
	}
	return &routerpb.TaskExecPollResponse{ExitStatus: &routerpb.TaskExecPollResponse_Code{Code: code}}, nil
}

// TaskSnapshotDirectory stores the directory as an image through the local
// provider. A set ttl_seconds is a hard expiry from creation (-1: never);
// unset is 30 days after the last use; 0 and other negatives are refused.
// The same snapshot_id answers the same image.
func (t *taskRouter) TaskSnapshotDirectory(ctx context.Context, req *routerpb.TaskSnapshotDirectoryRequest) (*routerpb.TaskSnapshotDirectoryResponse, error) {
	s := t.s
	sb, dir, err := t.taskDir(ctx, req.GetTaskId(), req.GetPath())
	if err != nil {
		return nil, err
	}
	im := &image{id: newID("im-"), snapshot: true, built: true}
	switch ttl := req.TtlSeconds; {
	case ttl == nil:
		im.sliding, im.expires = true, time.Now().Add(snapshotSliding)
	case *ttl == -1:
		im.expires = time.Now().Add(100 * 365 * 24 * time.Hour)
	case *ttl <= 0:
		return nil, status.Error(codes.InvalidArgument, "ttl_seconds must be positive or -1")
	default:
		im.expires = time.Now().Add(time.Duration(*ttl) * time.Second)
	}
	if id := req.GetSnapshotId(); id != "" {
		s.mu.Lock()
		prev, ok := s.snapIDs[id]
		s.mu.Unlock()
		if ok {
			return &routerpb.TaskSnapshotDirectoryResponse{ImageId: prev}, nil
		}
	}
	_, err = s.local.Snapshot(ctx, sb.lsb, providers.SnapshotSpec{ID: im.id, InstanceID: "modal-fake", Dir: dir})
	switch {
	case errors.Is(err, providers.ErrFileNotFound):
		return nil, status.Error(codes.NotFound, "no such directory")
	case errors.Is(err, providers.ErrNotAFile):
		return nil, status.Error(codes.InvalidArgument, "not a directory")
	case err != nil:
		return nil, status.Error(codes.Internal, "snapshot failed")
	}
	s.mu.Lock()
	s.images[im.id] = im
	if id := req.GetSnapshotId(); id != "" {
		s.snapIDs[id] = im.id
	}
	s.mu.Unlock()
	return &routerpb.TaskSnapshotDirectoryResponse{ImageId: im.id}, nil
}

// TaskMountDirectory replaces the directory with the image's contents (an
// empty image id mounts an empty directory), creating it when missing.
func (t *taskRouter) TaskMountDirectory(ctx context.Context, req *routerpb.TaskMountDirectoryRequest) (*emptypb.Empty, error) {
	s := t.s
	sb, dir, err := t.taskDir(ctx, req.GetTaskId(), req.GetPath())
	if err != nil {
		return nil, err
	}
	if req.GetImageId() != "" {
		s.mu.Lock()
		im := s.images[req.GetImageId()]
		if im != nil && im.sliding {
			im.expires = time.Now().Add(snapshotSliding)
		}
		s.mu.Unlock()
		if im == nil || !im.snapshot {
			return nil, status.Error(codes.NotFound, "no such image")
		}
	}
	res, err := s.local.Exec(ctx, sb.lsb, providers.ExecSpec{
		Argv: []string{"sh", "-c", `chmod -R u+rwX -- "$1" 2>/dev/null; rm -rf -- "$1" && mkdir -p -- "$1"`, "sh", dir}, Timeout: time.Minute,
	})
	if err != nil || res.ExitCode != 0 {
		return nil, status.Error(codes.Internal, "mount failed")
	}
	if req.GetImageId() != "" {
		if err := s.local.Restore(ctx, sb.lsb, localRef(req.GetImageId()), dir); err != nil {
			if errors.Is(err, providers.ErrSnapshotGone) {
				return nil, status.Error(codes.NotFound, "no such image")
			}
			return nil, status.Error(codes.Internal, "mount failed")
		}
	}
	return &emptypb.Empty{}, nil
}
