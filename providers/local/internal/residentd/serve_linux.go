package residentd

import (
	"os"
	"runtime"
	"sync"
	"syscall"
	"unsafe"
)

func init() {
	if len(os.Args) > 1 && os.Args[1] == "--"+Name {
		os.Exit(serve(os.Args[2:]))
	}
}

// serve is the resident's main; it returns the exit code. Its control
// socket is its one descriptor past stderr; args is, for a workspace with
// egress, the proxy socket to forward 127.0.0.1:3128 to ("" for none). It
// serves requests until the broker closes the socket, then exits, and the
// sandbox's pid namespace (everything its execs started) dies with it.
func serve(args []string) int {
	// Small and steady: it is the broker's memory, once per workspace.
	// (Its GOGC is set by its environment: runtime/debug, among the last
	// packages initialised, would hold up its start; see sys_linux.go.)
	runtime.GOMAXPROCS(1)
	// Not dumpable: no process of the sandbox (same uid, no capability)
	// can ptrace it or open its descriptors through /proc, the control
	// socket included. Commands it starts are dumpable again after execve.
	if err := prctl(syscall.PR_SET_DUMPABLE, 0); err != nil {
		return exitStart
	}
	if len(args) != 1 {
		return exitUsage
	}
	ctl := controlSocket()
	if ctl < 0 {
		return exitUsage
	}
	if args[0] != "" {
		if err := forward(args[0]); err != nil {
			return exitStart
		}
	}
	// The first forker's thread is made now, while the workspace waits
	// for its first exec (a pooled one, in its pool), not during it.
	idle := make(chan forker, maxIdleForkers)
	idle <- newForker(idle)
	buf := make([]byte, 64<<10)
	oob := make([]byte, syscall.CmsgSpace(MaxFDs*4))
	for {
		// The request's size first (an env may be large), then the
		// request with its descriptors.
		n, _, _, _, err := syscall.Recvmsg(ctl, nil, nil, syscall.MSG_PEEK|syscall.MSG_TRUNC)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return 0 // the broker is gone
		}
		if n > len(buf) {
			buf = make([]byte, n)
		}
		n, oobn, _, _, err := syscall.Recvmsg(ctl, buf, oob, syscall.MSG_CMSG_CLOEXEC)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return 0
		}
		fds := rightsOf(oob[:oobn])
		req, err := ParseRequest(buf[:n])
		if err != nil || len(req.Argv) == 0 || len(fds) != 3+req.Join+req.Leave+btoi(req.Stdin) {
			closeFDs(fds)
			continue
		}
		if !req.Stdin {
			fds = append(fds[:1], append([]int{-1}, fds[1:]...)...)
		}
		go serveExec(req, fds, idle)
		if len(buf) > 64<<10 {
			buf = make([]byte, 64<<10) // a large env's buffer goes with its request
		}
	}
}

// controlSocket finds the resident's control socket, a SOCK_SEQPACKET
// socket among its first descriptors past stderr, and makes it
// close-on-exec; -1 when there is none.
func controlSocket() int {
	for fd := 3; fd < 64; fd++ {
		if t, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_TYPE); err == nil && t == syscall.SOCK_SEQPACKET {
			syscall.CloseOnExec(fd)
			return fd
		}
	}
	return -1
}

// rightsOf returns the descriptors of SCM_RIGHTS messages in oob.
func rightsOf(oob []byte) []int {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if r, err := syscall.ParseUnixRights(&m); err == nil {
			fds = append(fds, r...)
		}
	}
	return fds
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			syscall.Close(fd)
		}
	}
}

// serveExec runs one request: fds are the exec's connection, stdin (-1
// none), stdout, stderr and req.Join cgroup files. It answers on the
// connection once the command has exited, and kills the command's process
// group when the broker's side of the connection goes away first.
func serveExec(req Request, fds []int, idle chan forker) {
	conn := fds[0]
	defer syscall.Close(conn)
	pid, rep := forkInto(req, fds[1:4], fds[4:4+req.Join], fds[4+req.Join:], idle)
	closeFDs(fds[1:]) // -1 is skipped
	if pid <= 0 {
		// Not started, or killed before it ran (rep.Status).
		sendReply(conn, rep)
		return
	}
	var mu sync.Mutex
	reaped := false
	kill := func() {
		mu.Lock()
		defer mu.Unlock()
		if !reaped { // the zombie still holds its pid: no other process has it
			syscall.Kill(-pid, syscall.SIGKILL)
		}
	}
	go func() {
		var b [1]byte
		syscall.Read(conn, b[:]) // EOF: the broker's side is gone, or shut for writing (a kill)
		kill()
	}()
	waitNoReap(pid)
	// What the command left in its process group dies with it, as it did
	// with an exec's own pid namespace (the broker kills the rest of its
	// cgroup).
	kill()
	var ws syscall.WaitStatus
	mu.Lock()
	for {
		if _, err := syscall.Wait4(pid, &ws, 0, nil); err != syscall.EINTR {
			break
		}
	}
	reaped = true
	mu.Unlock()
	sendReply(conn, Reply{Status: int(ws)})
}

func sendReply(conn int, rep Reply) {
	b := rep.Append(nil)
	syscall.Write(conn, b)
}

// waitNoReap blocks until pid has exited, leaving it a zombie.
func waitNoReap(pid int) {
	var info [128]byte // siginfo_t
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info)), syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		if e != syscall.EINTR {
			return
		}
	}
}

// forkInto starts req's command with stdio as its descriptors 0, 1 and 2
// (stdio[0] -1: /dev/null), in a session of its own, from a locked thread
// (a forker, taken from idle or new) that first joins the exec's cgroups
// by writing "0" to each of join (v1 tasks files): the command is born in
// them. The thread then writes "0" to each of leave before the command is
// reported. When those are the resident's own cgroups (req.Home) the
// thread is back beside the resident's other threads and waits in idle
// for the next exec; otherwise, or when a write fails, it ends with its
// goroutine, so the resident's other threads stay where they are.
func forkInto(req Request, stdio, join, leave []int, idle chan forker) (int, Reply) {
	path, why := lookPath(req.Argv[0], req.Env)
	if why != "" {
		return 0, Reply{Err: why}
	}
	if fi, err := os.Stat(req.Dir); err != nil || !fi.IsDir() {
		if err == nil {
			err = syscall.ENOTDIR
		}
		return 0, Reply{Err: errText(err), Chdir: true}
	}
	type result struct {
		pid int
		rep Reply
	}
	done := make(chan result, 1)
	takeForker(idle) <- func() bool {
		pid, rep := forkJoined(req, path, stdio, join)
		// Out of the leaves before anyone hears of the command: the
		// broker kills whatever is left in them when the exec ends, and
		// this thread, until it has exited or gone home, is the resident.
		home := req.Home
		for _, fd := range leave {
			if _, err := syscall.Write(fd, []byte("0")); err != nil {
				home = false
			}
		}
		done <- result{pid, rep}
		return home
	}
	r := <-done
	return r.pid, r.rep
}

// maxIdleForkers bounds the forkers that wait for an exec: one serves a
// workspace's execs one after another; a few more start, and end, when
// they overlap.
const maxIdleForkers = 2

// A forker is a goroutine locked to its own OS thread, which joins an
// exec's cgroups to fork its command (forkInto). Each function sent to it
// runs on that thread and reports whether the thread is back in the
// resident's own cgroups, and so may fork again.
type forker chan func() bool

// takeForker returns an idle forker, or starts one.
func takeForker(idle chan forker) forker {
	select {
	case f := <-idle:
		return f
	default:
	}
	return newForker(idle)
}

// newForker starts a forker, which returns to idle after each exec.
func newForker(idle chan forker) forker {
	f := make(forker)
	go f.run(idle)
	return f
}

// run serves f's functions until one leaves the thread outside the
// resident's cgroups or idle is full; the thread, never unlocked, then
// ends with the goroutine. (A thread made and ended per exec held up the
// report of a pooled workspace's first fork by about a millisecond on a
// paravirtualised host.)
func (f forker) run(idle chan forker) {
	runtime.LockOSThread()
	for fn := range f {
		if !fn() {
			return
		}
		select {
		case idle <- f:
		default:
			return
		}
	}
}

// forkJoined is forkInto's work on its locked thread.
func forkJoined(req Request, path string, stdio, join []int) (int, Reply) {
	for _, fd := range join {
		if _, err := syscall.Write(fd, []byte("0")); err != nil {
			return 0, Reply{Cgroup: true}
		}
	}
	files := []uintptr{uintptr(stdio[0]), uintptr(stdio[1]), uintptr(stdio[2])}
	if stdio[0] < 0 {
		null, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return 0, Reply{Err: errText(err)}
		}
		defer syscall.Close(null)
		files[0] = uintptr(null)
	}
	pid, err := syscall.ForkExec(path, req.Argv, &syscall.ProcAttr{
		Dir:   req.Dir,
		Env:   req.Env,
		Files: files,
		// Traced, the command stops at its execve before its first
		// instruction, which is where its RLIMIT_DATA is set.
		Sys: &syscall.SysProcAttr{Setsid: true, Ptrace: req.Data > 0},
	})
	if err != nil {
		return 0, Reply{Err: errText(err)}
	}
	if req.Data > 0 {
		if rep, ok := limitTraced(pid, req.Data); !ok {
			return 0, rep
		}
	}
	return pid, Reply{}
}

// limitTraced sets pid's RLIMIT_DATA, soft and hard, while it is stopped
// at its execve (it was started traced by this thread), and lets it run.
// Killed meanwhile, pid is reaped and rep holds its status; a limit that
// cannot be set kills it. ok reports that it runs.
func limitTraced(pid int, data uint64) (rep Reply, ok bool) {
	var ws syscall.WaitStatus
	for {
		if _, err := syscall.Wait4(pid, &ws, syscall.WALL, nil); err != syscall.EINTR {
			break
		}
	}
	if !ws.Stopped() {
		return Reply{Status: int(ws)}, false
	}
	// The tracee's RLIMIT_DATA, not the resident's: the limit is the
	// one the exec's bwrap had (README.md, "Memory").
	lerr := prlimit(pid, syscall.RLIMIT_DATA, &syscall.Rlimit{Cur: data, Max: data})
	if lerr != nil {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	// The stop is the SIGTRAP of the execve; another signal that
	// stopped it first goes on to it.
	sig := ws.StopSignal()
	if sig == syscall.SIGTRAP {
		sig = 0
	}
	syscall.Syscall6(syscall.SYS_PTRACE, syscall.PTRACE_DETACH, uintptr(pid), 0, uintptr(sig), 0, 0)
	if lerr != nil {
		for {
			if _, err := syscall.Wait4(pid, &ws, syscall.WALL, nil); err != syscall.EINTR {
				break
			}
		}
		return Reply{Err: "setrlimit: " + errText(lerr)}, false
	}
	return Reply{}, true
}

// lookPath finds argv0 as execvp does, in the command's PATH: the first
// candidate that exists; one that exists but cannot be executed only when
// no later one can. why is strerror's text when none is found.
func lookPath(argv0 string, env []string) (path, why string) {
	if hasSlash(argv0) {
		return argv0, ""
	}
	dirs := DefaultPath
	for _, kv := range env {
		if len(kv) >= 5 && kv[:5] == "PATH=" {
			dirs = kv[5:]
		}
	}
	denied := ""
	for d := range pathList(dirs) {
		p := cmpOr(d, ".") + "/" + argv0
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() {
			continue
		}
		if syscall.Access(p, xOK) != nil {
			denied = errText(syscall.EACCES)
			continue
		}
		return p, ""
	}
	if denied != "" {
		return "", denied
	}
	return "", errText(syscall.ENOENT)
}

// hasSlash and pathList stand in for package strings and filepath,
// which would hold up the resident's start (sys_linux.go).
func hasSlash(s string) bool {
	for i := range len(s) {
		if s[i] == '/' {
			return true
		}
	}
	return false
}

// pathList yields the directories of the PATH list dirs (none when it is
// empty), as filepath.SplitList does.
func pathList(dirs string) func(yield func(string) bool) {
	return func(yield func(string) bool) {
		if dirs == "" {
			return
		}
		start := 0
		for i := 0; i <= len(dirs); i++ {
			if i == len(dirs) || dirs[i] == ':' {
				if !yield(dirs[start:i]) {
					return
				}
				start = i + 1
			}
		}
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// errText is strerror's text for err's errno, as the C library (and so
// bwrap) prints it.
func errText(err error) string {
	var en syscall.Errno
	if pe, ok := err.(*os.PathError); ok {
		err = pe.Err
	}
	if e, ok := err.(syscall.Errno); ok {
		en = e
	} else {
		return err.Error()
	}
	s := en.Error()
	if s != "" && 'a' <= s[0] && s[0] <= 'z' {
		s = string(s[0]-'a'+'A') + s[1:]
	}
	return s
}
