package modaltest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/modal/proto/clientpb"
	"github.com/sandgate/sandgate/providers/modal/proto/routerpb"
)

// The container: one process per sandbox, started as a durable command of
// the local provider (so it outlives the exec that started it, and the
// local runner's watchdog ends it at the sandbox timeout), reads "start ID"
// and "kill ID" lines from a FIFO and runs each exec in a session of its
// own, reporting "exit ID STATUS" on a second FIFO. Each exec's files live
// in the sandbox's /tmp/.modal-fake/x/ID/: cmd (the argv, quoted), in (a
// FIFO for stdin), out and err.
const agentDir = "/tmp/.modal-fake"

const agentScript = `b=` + agentDir + `
exec 3<>"$b/ctl" 4<>"$b/events"
while IFS=' ' read -r op id <&3; do
	d=$b/x/$id
	case $op in
	start)
		{
			setsid sh -c 'echo $$ >"$1/pid"; exec sh "$1/cmd"' sh "$d" <"$d/in" >"$d/out" 2>"$d/err" 4>&- &
			wait "$!"
			echo "exit $id $?" >&4
		} 3<&- &
		;;
	kill)
		read -r p <"$d/pid" 2>/dev/null && kill -9 "-$p" 2>/dev/null
		;;
	esac
done
`

const containerID = "modal-fake-container"

// sandbox is one fake sandbox.
type sandbox struct {
	s       *Server
	id      string
	appID   string
	req     *clientpb.SandboxCreateRequest
	env     map[string]string
	created time.Time
	timeout time.Duration
	idle    time.Duration // 0: none

	lsb     providers.Sandbox // the local workspace
	hostTmp string            // the host directory mounted at /tmp

	mu         sync.Mutex
	taskID     string
	result     *clientpb.GenericResult
	done       chan struct{}
	scheduled  chan struct{}
	watching   sync.WaitGroup // the watch goroutine, which uses the local provider
	ctl        *os.File
	events     *os.File
	execs      map[string]*execState
	running    int
	lastActive time.Time
}

// execState is one exec of the router.
type execState struct {
	id       string
	dir      string // host directory
	exited   chan struct{}
	status   int // sh's status: 128+n for signal n
	stdinMu  sync.Mutex
	stdinOff uint64
	stdin    chan []byte // nil data = eof
	eofSent  bool
	devnull  [2]bool
}

func (sb *sandbox) info() Sandbox {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return Sandbox{ID: sb.id, AppID: sb.appID, Request: proto.Clone(sb.req).(*clientpb.SandboxCreateRequest),
		Env: sb.env, Result: proto.Clone(sb.result).(*clientpb.GenericResult)}
}

func (sb *sandbox) finished() bool {
	select {
	case <-sb.done:
		return true
	default:
		return false
	}
}

func (sb *sandbox) touch() {
	sb.mu.Lock()
	sb.lastActive = time.Now()
	sb.mu.Unlock()
}

// schedule starts the sandbox's container and assigns its task: what
// Modal does between SandboxCreate and a task id.
func (s *Server) schedule(sb *sandbox) {
	defer close(sb.scheduled)
	ctx := s.ctx
	cores := max(1, int((sb.req.GetDefinition().GetResources().GetMilliCpu()+999)/1000))
	mem := max(128, int(sb.req.GetDefinition().GetResources().GetMemoryMb()))
	lsb, err := s.local.Create(ctx, providers.CreateSpec{
		WorkspaceID: sb.id, InstanceID: "modal-fake",
		Size: sandgate.Size{Name: "fake", CPUCores: cores, MemoryMiB: mem},
		Env:  sb.env,
		// No network: the only policy SandboxCreate lets through.
		Egress:    sandgate.EgressPolicy{AllowedDomains: []string{}},
		ExpiresAt: sb.created.Add(sb.timeout),
	})
	if err != nil {
		s.log.Error("modaltest: local create", "error", err)
		s.finish(sb, clientpb.GenericResult_GENERIC_STATUS_INIT_FAILURE)
		return
	}
	sb.lsb = lsb
	// The local provider's documented layout: <DataDir>/workspaces/<ref>/tmp is /tmp.
	sb.hostTmp = filepath.Join(s.cfg.DataDir, "local", "workspaces", sb.id, "tmp")
	base := filepath.Join(sb.hostTmp, strings.TrimPrefix(agentDir, "/tmp/"))
	if err := os.MkdirAll(filepath.Join(base, "x"), 0o700); err != nil {
		s.finish(sb, clientpb.GenericResult_GENERIC_STATUS_INIT_FAILURE)
		return
	}
	for _, f := range []string{"ctl", "events"} {
		if err := syscall.Mkfifo(filepath.Join(base, f), 0o600); err != nil {
			s.finish(sb, clientpb.GenericResult_GENERIC_STATUS_INIT_FAILURE)
			return
		}
	}
	ctl, err1 := os.OpenFile(filepath.Join(base, "ctl"), os.O_RDWR, 0)
	events, err2 := os.OpenFile(filepath.Join(base, "events"), os.O_RDWR, 0)
	if err1 != nil || err2 != nil {
		s.finish(sb, clientpb.GenericResult_GENERIC_STATUS_INIT_FAILURE)
		return
	}
	sb.mu.Lock()
	sb.ctl, sb.events = ctl, events
	sb.mu.Unlock()
	if err := s.local.StartCommand(ctx, lsb, containerID, providers.ExecSpec{
		Argv: []string{"sh", "-c", agentScript}, Timeout: sb.timeout, MaxOutputBytes: 4096,
	}); err != nil {
		s.log.Error("modaltest: start container", "error", err)
		s.finish(sb, clientpb.GenericResult_GENERIC_STATUS_INIT_FAILURE)
		return
	}
	go sb.readEvents()
	sb.mu.Lock()
	if sb.result == nil {
		sb.taskID = newID("ta-")
		sb.lastActive = time.Now()
	}
	task := sb.taskID
	sb.mu.Unlock()
	if task != "" {
		s.mu.Lock()
		s.tasks[task] = sb
		s.mu.Unlock()
	}
	sb.watching.Go(sb.watch) // before scheduled closes: Close waits for it
}

// readEvents reads the container's exit reports until the sandbox ends.
func (sb *sandbox) readEvents() {
	r := bufio.NewReader(sb.events)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "exit" {
			continue
		}
		code, _ := strconv.Atoi(f[2])
		sb.mu.Lock()
		e := sb.execs[f[1]]
		if e != nil {
			select {
			case <-e.exited:
			default:
				e.status = code
				close(e.exited)
				sb.running--
				sb.lastActive = time.Now()
			}
		}
		sb.mu.Unlock()
	}
}

// watch ends the sandbox at its timeout, after its idle timeout without a
// running exec or stdin write, or when its container died.
func (sb *sandbox) watch() {
	deadline := time.NewTimer(time.Until(sb.created.Add(sb.timeout)))
	defer deadline.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-sb.done:
			return
		case <-sb.s.ctx.Done():
			return
		case <-deadline.C:
			sb.s.finish(sb, clientpb.GenericResult_GENERIC_STATUS_TIMEOUT)
			return
		case <-tick.C:
		}
		sb.mu.Lock()
		idle := sb.idle > 0 && sb.running == 0 && time.Since(sb.lastActive) >= sb.idle
		sb.mu.Unlock()
		if idle {
			sb.s.finish(sb, clientpb.GenericResult_GENERIC_STATUS_IDLE_TIMEOUT)
			return
		}
		st, err := sb.s.local.ReadCommand(context.Background(), sb.lsb, containerID, 0)
		if err == nil && (st.State == providers.CommandCompleted || st.State == providers.CommandCanceled) {
			sb.s.finish(sb, clientpb.GenericResult_GENERIC_STATUS_TERMINATED)
			return
		}
	}
}

// finish ends the sandbox with st (once): the local workspace, with every
// process in it, is terminated.
func (s *Server) finish(sb *sandbox, st clientpb.GenericResult_GenericStatus) {
	sb.mu.Lock()
	if sb.result != nil {
		sb.mu.Unlock()
		return
	}
	sb.result = &clientpb.GenericResult{Status: st}
	if st == clientpb.GenericResult_GENERIC_STATUS_TIMEOUT {
		sb.result.Exitcode = 124
	}
	close(sb.done)
	ctl, events := sb.ctl, sb.events
	sb.mu.Unlock()
	<-sb.scheduled
	if sb.lsb.Ref != "" {
		if err := s.local.Terminate(context.Background(), sb.lsb); err != nil {
			s.log.Error("modaltest: terminate", "error", err)
		}
	}
	if ctl != nil {
		ctl.Close()
	}
	if events != nil {
		events.Close()
	}
	s.log.Info("modaltest: sandbox finished", "sandbox", sb.id, "status", st.String())
}

// quote quotes s for sh.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// startExec prepares and starts one exec (idempotent per exec id).
func (sb *sandbox) startExec(req *routerpb.TaskExecStartRequest) error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.execs == nil {
		sb.execs = map[string]*execState{}
	}
	if _, ok := sb.execs[req.GetExecId()]; ok {
		return nil
	}
	if strings.ContainsAny(req.GetExecId(), "/ \n") || req.GetExecId() == "" {
		return fmt.Errorf("bad exec id")
	}
	d := filepath.Join(sb.hostTmp, strings.TrimPrefix(agentDir, "/tmp/"), "x", req.GetExecId())
	if err := os.Mkdir(d, 0o700); err != nil {
		return err
	}
	var cmd strings.Builder
	if req.GetStdoutConfig() == routerpb.TaskExecStdoutConfig_TASK_EXEC_STDOUT_CONFIG_DEVNULL {
		cmd.WriteString("exec >/dev/null\n")
	}
	switch req.GetStderrConfig() {
	case routerpb.TaskExecStderrConfig_TASK_EXEC_STDERR_CONFIG_DEVNULL:
		cmd.WriteString("exec 2>/dev/null\n")
	case routerpb.TaskExecStderrConfig_TASK_EXEC_STDERR_CONFIG_STDOUT:
		cmd.WriteString("exec 2>&1\n")
	}
	if req.Workdir != nil {
		cmd.WriteString("cd -- " + quote(req.GetWorkdir()) + " || exit 1\n")
	}
	cmd.WriteString("exec")
	for _, a := range req.GetCommandArgs() {
		cmd.WriteString(" " + quote(a))
	}
	cmd.WriteString("\n")
	if err := os.WriteFile(filepath.Join(d, "cmd"), []byte(cmd.String()), 0o600); err != nil {
		return err
	}
	for _, f := range []string{"out", "err"} {
		if err := os.WriteFile(filepath.Join(d, f), nil, 0o600); err != nil {
			return err
		}
	}
	if err := syscall.Mkfifo(filepath.Join(d, "in"), 0o600); err != nil {
		return err
	}
	e := &execState{id: req.GetExecId(), dir: d, exited: make(chan struct{}), stdin: make(chan []byte, 64)}
	e.devnull[0] = req.GetStdoutConfig() == routerpb.TaskExecStdoutConfig_TASK_EXEC_STDOUT_CONFIG_DEVNULL
	e.devnull[1] = req.GetStderrConfig() != routerpb.TaskExecStderrConfig_TASK_EXEC_STDERR_CONFIG_PIPE
	sb.execs[e.id] = e
	sb.running++
	sb.lastActive = time.Now()
	go e.feed(sb.done)
	if _, err := fmt.Fprintf(sb.ctl, "start %s\n", e.id); err != nil {
		return err
	}
	if req.TimeoutSecs != nil && req.GetTimeoutSecs() > 0 {
		t := time.Duration(req.GetTimeoutSecs()) * time.Second
		go func() {
			select {
			case <-time.After(t):
				sb.mu.Lock()
				if sb.ctl != nil && !sb.finished() {
					fmt.Fprintf(sb.ctl, "kill %s\n", e.id)
				}
				sb.mu.Unlock()
			case <-e.exited:
			case <-sb.done:
			}
		}()
	}
	return nil
}

// feed writes stdin to the exec's FIFO, in order, until eof. The open
// blocks until the exec opens its end.
func (e *execState) feed(done <-chan struct{}) {
	opened := make(chan *os.File, 1)
	go func() {
		f, err := os.OpenFile(filepath.Join(e.dir, "in"), os.O_WRONLY, 0)
		if err != nil {
			opened <- nil
			return
		}
		opened <- f
	}()
	var f *os.File
	select {
	case f = <-opened:
	case <-done:
		// Unblock the open, then drop it.
		if r, err := os.OpenFile(filepath.Join(e.dir, "in"), os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
			if f = <-opened; f != nil {
				f.Close()
			}
			r.Close()
		}
		return
	}
	if f == nil {
		return
	}
	defer f.Close()
	for {
		select {
		case b := <-e.stdin:
			if b == nil {
				return
			}
			if _, err := f.Write(b); err != nil {
				// The command closed its stdin: drop the rest.
				for b := range e.stdin {
					if b == nil {
						return
					}
				}
				return
			}
		case <-done:
			return
		case <-e.exited:
			return
		}
	}
}

// writeStdin queues a chunk at its offset; a resent chunk is skipped.
func (e *execState) writeStdin(off uint64, data []byte, eof bool) error {
	e.stdinMu.Lock()
	defer e.stdinMu.Unlock()
	if e.eofSent {
		if eof && off+uint64(len(data)) == e.stdinOff {
			return nil
		}
		return fmt.Errorf("stdin closed")
	}
	if off > e.stdinOff {
		return fmt.Errorf("stdin offset %d is past %d", off, e.stdinOff)
	}
	skip := e.stdinOff - off
	if skip < uint64(len(data)) {
		b := append([]byte{}, data[skip:]...)
		e.stdinOff += uint64(len(b))
		select {
		case e.stdin <- b:
		case <-e.exited:
		}
	}
	if eof {
		e.eofSent = true
		select {
		case e.stdin <- nil:
		case <-e.exited:
		}
	}
	return nil
}

// exec returns the exec id of the sandbox.
func (sb *sandbox) exec(id string) *execState {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.execs[id]
}
