package modal

import (
	"context"
	"path"

	"google.golang.org/grpc/status"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/internal/uuid"
	"github.com/sandgate/sandgate/providers/modal/proto/routerpb"
	"github.com/sandgate/sandgate/providers/runner"
)

// Durable commands run through package runner over Exec: the runner is
// started detached in the sandbox and keeps its state in the sandbox's
// files. Modal ends a sandbox after its idle timeout without a running
// exec, while the broker counts a running command as activity; so each
// launch also starts a watcher exec that lasts as long as the command,
// which the broker never waits for. It outlives every broker process, as
// the command does.

// watchScript gets $1 = the command's runner directory. It waits for the
// runner to record itself (10 s at most), then as long as it runs.
const watchScript = `d=$1 i=0
while [ ! -e "$d/` + runner.FilePID + `" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
while [ ! -e "$d/` + runner.FileExit + `" ] && p=$(cat "$d/` + runner.FilePID + `" 2>/dev/null) && kill -0 "$p" 2>/dev/null; do sleep 1; done
exit 0
`

// StartCommand implements [providers.Commander] with package runner, and
// starts the command's watcher exec.
func (p *Provider) StartCommand(ctx context.Context, sb providers.Sandbox, id string, spec providers.ExecSpec) error {
	if err := runner.New(p, "").StartCommand(ctx, sb, id, spec); err != nil {
		return err
	}
	r, err := p.router(ctx, sb.Ref)
	if err != nil {
		return nil // the command runs; only its keepalive is missing
	}
	dir := runner.CommandDir(runner.DefaultDir, sb, id)
	secs := uint32(max(runner.TimeoutSeconds(spec.Timeout), 0) + 60)
	req := &routerpb.TaskExecStartRequest{
		TaskId:      r.taskID,
		ExecId:      uuid.New(),
		CommandArgs: []string{"sh", "-c", watchScript, "sh", path.Clean(dir)},
		TimeoutSecs: &secs,
	}
	if spec.Timeout <= 0 {
		req.TimeoutSecs = nil
	}
	if err := p.call(ctx, r, nil, func(ctx context.Context) error {
		_, err := r.rc.TaskExecStart(ctx, req)
		return err
	}); err != nil {
		p.log.Warn("durable command watcher not started", "code", status.Code(err).String(), "timeout_secs", secs)
	}
	return nil
}

// ReadCommand implements [providers.Commander] with package runner.
func (p *Provider) ReadCommand(ctx context.Context, sb providers.Sandbox, id string, maxOut int64) (providers.CommandStatus, error) {
	return runner.New(p, "").ReadCommand(ctx, sb, id, maxOut)
}

// CancelCommand implements [providers.Commander] with package runner; the
// watcher ends with the command.
func (p *Provider) CancelCommand(ctx context.Context, sb providers.Sandbox, id string) error {
	return runner.New(p, "").CancelCommand(ctx, sb, id)
}

// Interface guards
var _ providers.Commander = (*Provider)(nil)
