package local

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The step: every durable command's sandbox is started through a small
// step that is the broker's own binary run again (its path with argv[1] =
// "--"+stepName; argv[0] = stepName is recognised too), recognised in this
// package's init before main runs. (An exec starts bwrap from the broker
// itself, as the first process of a pid namespace: see launchBwrap.)
//
//	sandgate-exec-step --fds N [--rlimit NAME=N]… [--cgroup FILE]… [--uid U --gid G]
//	    [--stage DIR [--bind SRC NAME]…] -- bwrap --args 3 -- ARGV…
//
// N is how many descriptors past stderr the broker handed over (bwrap's
// options and seccomp filter); they go on to bwrap as they are.
//
// The step exists because a durable command outlives the broker (no pid
// namespace of the broker's can hold it) and bwrap's --die-with-parent
// cannot be relied on alone. bwrap's pid 1 (inside the sandbox) calls
// setsid and sets its parent-death signal only after the whole mount
// set-up; if the outer bwrap
// dies in that window (killed with the broker, a timeout or a Terminate),
// pid 1 is orphaned without a parent-death signal and outside the exec's
// process group, and the command runs on with nobody to kill it. The step:
//
//   - joins the workspace's cgroups (each FILE is a cgroup.procs) before it
//     forks anything, so nothing of the sandbox ever runs outside them;
//   - is a child subreaper: whatever bwrap orphans is reparented to it, not
//     to init;
//   - gets SIGTERM as its parent-death signal, from the broker, and SIGTERM
//     is also how the broker kills an exec: it then SIGKILLs every child it
//     has (bwrap, or bwrap's orphaned pid 1, whose death ends the sandbox's
//     pid namespace), until none is left, and exits with 137;
//   - when bwrap exits, kills whatever is left the same way and exits with
//     bwrap's status (128+n for a signal n).
//
// Its children are never reaped by anyone else, so signalling one by pid can
// never hit a reused pid.
const stepName = "sandgate-exec-step"

// Exit codes of the step itself, before bwrap runs.
const (
	stepExitUsage  = 120 // malformed arguments: a bug
	stepExitCgroup = 121 // a cgroup could not be joined: nothing ran
	stepExitStart  = 122 // the command could not be started
)

func init() {
	switch {
	case len(os.Args) > 0 && os.Args[0] == stepName:
		os.Exit(runStep(os.Args[1:]))
	case len(os.Args) > 0 && os.Args[0] == SupervisorName:
		os.Exit(runSupervisor(os.Args[1:]))
	case len(os.Args) > 1 && os.Args[1] == "--"+stepName:
		// From a durable command's runner, a shell that cannot set argv[0].
		os.Exit(runStep(os.Args[2:]))
	case len(os.Args) > 1 && os.Args[1] == "--"+forwardName:
		// Inside a sandbox with egress: see egress.go.
		os.Exit(runForward(os.Args[2:]))
	}
}

// runStep is the step's main; it returns the exit code.
func runStep(args []string) int {
	// Package init runs on the main thread, locked: the child's
	// parent-death signal below follows this thread, which lives until the
	// step exits.
	runtime.LockOSThread()
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGCHLD)
	o, argv, ok := parseStep(args)
	if !ok {
		fmt.Fprintln(os.Stderr, "sandgate: exec step: bad arguments")
		return stepExitUsage
	}
	self := []byte(strconv.Itoa(os.Getpid()))
	for _, f := range o.cgroups {
		if err := os.WriteFile(f, self, 0); err != nil {
			// No path: the message reaches the exec's stderr.
			fmt.Fprintln(os.Stderr, "sandgate: exec step: cannot join the workspace's cgroup:", unwrapErrno(err))
			return stepExitCgroup
		}
	}
	if o.nsFD >= 0 {
		// The workspace's namespace, root tree and all (an image
		// workspace's; see Provider.commandNS); the descriptor is not
		// the sandbox's.
		ns := os.NewFile(uintptr(o.nsFD), "ns")
		err := joinNS(ns)
		ns.Close()
		if err != nil {
			fmt.Fprintln(os.Stderr, "sandgate: exec step: namespace:", err)
			return stepExitStart
		}
	}
	if o.stage != "" {
		if err := stage(o); err != nil {
			fmt.Fprintln(os.Stderr, "sandgate: exec step: stage:", err)
			return stepExitStart
		}
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "sandgate: exec step: subreaper:", err)
		return stepExitStart
	}
	// Every descriptor the broker handed over (stdio, bwrap's options and
	// seccomp filter) goes to bwrap as is, but for the options when there
	// are limits to set: see setLimits.
	files := []*os.File{os.Stdin, os.Stdout, os.Stderr}
	for fd := 3; fd < 3+o.nfds; fd++ {
		files = append(files, os.NewFile(uintptr(fd), "fd"+strconv.Itoa(fd)))
	}
	var opts []byte
	var optsW *os.File
	if len(o.rlimits) > 0 {
		if len(files) < 4 {
			fmt.Fprintln(os.Stderr, "sandgate: exec step: bad arguments")
			return stepExitUsage
		}
		b, err := io.ReadAll(files[3]) // the broker closes it once written
		if err != nil {
			fmt.Fprintln(os.Stderr, "sandgate: exec step: options:", err)
			return stepExitStart
		}
		r, w, err := os.Pipe()
		if err != nil {
			fmt.Fprintln(os.Stderr, "sandgate: exec step: options:", err)
			return stepExitStart
		}
		files[3].Close()
		files[3], opts, optsW = r, b, w
	}
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if o.uid >= 0 {
		// bwrap runs as the workspace's host uid: the sandbox's uid 0 maps
		// to it, and nothing of the sandbox holds a host privilege.
		attr.Credential = &syscall.Credential{Uid: uint32(o.uid), Gid: uint32(o.gid), Groups: []uint32{}}
	}
	proc, err := os.StartProcess(argv[0], argv, &os.ProcAttr{
		Env:   []string{},
		Files: files,
		Sys:   attr,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandgate: exec step: start:", unwrapErrno(err))
		return stepExitStart
	}
	child := proc.Pid
	for _, f := range files[3:] {
		f.Close()
	}
	if optsW != nil {
		if err := setLimits(child, o.uid, o.gid, o.rlimits, opts, optsW); err != nil {
			fmt.Fprintln(os.Stderr, "sandgate: exec step: rlimit:", err)
			killChildren()
			return stepExitStart
		}
	}
	// The step is the one process that must live to clean up: keep the
	// memory cgroup's OOM killer on the sandbox's processes (bwrap and
	// its children were forked before this, and keep their score).
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0)
	for s := range sigs {
		if s == syscall.SIGTERM {
			killChildren()
			return 128 + int(syscall.SIGKILL)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			if pid == child {
				killChildren()
				if ws.Signaled() {
					return 128 + int(ws.Signal())
				}
				return ws.ExitStatus()
			}
		}
	}
	return stepExitStart // not reached: sigs is never closed
}

// setLimits sets the resource limits on bwrap (pid, running as uid and
// gid, or as the step's own ids when uid < 0), soft and hard, and then
// hands it its options. The step does not set them on itself, where bwrap
// would inherit them: its own Go runtime (threads, the race detector's
// memory in tests) must not be bound by a workspace's RLIMIT_DATA. bwrap
// reads its options before it does anything else, forks nothing before it
// has them, and gets them only once its limits are set: so every process
// of the sandbox inherits them, as under prlimit(1), without running
// prlimit.
func setLimits(pid, uid, gid int, limits []rlimit, opts []byte, w *os.File) error {
	defer w.Close()
	if err := prlimitAs(pid, uid, gid, limits); err != nil {
		return err
	}
	// An error here is bwrap gone before it read them: its status says why.
	_, _ = w.Write(opts)
	return nil
}

// prlimitAs sets limits on pid from a thread whose real uid and gid are
// the target's (uid, gid; unchanged when uid < 0): prlimitOn, on a thread
// of its own that is never given back to the Go runtime and ends with its
// goroutine.
func prlimitAs(pid, uid, gid int, limits []rlimit) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		done <- prlimitOn(pid, uid, gid, limits)
	}()
	return <-done
}

// prlimitOn sets limits on pid from the calling thread, which must be
// locked and never run another goroutine after this: it first sets the
// thread's real uid and gid to the target's (uid, gid; unchanged when
// uid < 0). The kernel lets a process lower the limits of another whose
// uids and gids all equal its real ones without CAP_SYS_RESOURCE, which a
// root broker in a container may lack. The thread keeps effective uid 0,
// and so its capabilities.
func prlimitOn(pid, uid, gid int, limits []rlimit) error {
	if uid >= 0 {
		// Raw: per thread, where syscall.Setresuid would change every thread.
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), ^uintptr(0), ^uintptr(0)); e != 0 {
			return e
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), ^uintptr(0), ^uintptr(0)); e != 0 {
			return e
		}
	}
	for _, l := range limits {
		if err := unix.Prlimit(pid, l.resource, &unix.Rlimit{Cur: l.value, Max: l.value}, nil); err != nil {
			return err
		}
	}
	return nil
}

// jobLimits are j's resource limits (rlimitArgs, for the step of a
// durable command, says the same); see README.md for why RLIMIT_DATA and
// not RLIMIT_AS.
func jobLimits(j job) []rlimit {
	l := []rlimit{
		{unix.RLIMIT_CORE, 0}, // no core files written where a host helper might read them
	}
	data := j.memory
	if j.perCommandData {
		data = max(data, residentData)
	}
	l = append(l, rlimit{unix.RLIMIT_DATA, uint64(data)})
	if j.fsize > 0 {
		l = append(l, rlimit{unix.RLIMIT_FSIZE, uint64(j.fsize)})
	}
	return l
}

// rlimitResource is the resource --rlimit names name.
func rlimitResource(name string) (int, bool) {
	switch name {
	case "data":
		return unix.RLIMIT_DATA, true
	case "core":
		return unix.RLIMIT_CORE, true
	case "fsize":
		return unix.RLIMIT_FSIZE, true
	}
	return 0, false
}

// parseStep parses the step's arguments; argv is what follows "--".
func parseStep(args []string) (o stepOptions, argv []string, ok bool) {
	o = stepOptions{nfds: -1, uid: -1, gid: -1, nsFD: -1}
	num := func(s string) int {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return -1
		}
		return n
	}
	for len(args) > 0 && args[0] != "--" {
		if len(args) < 2 {
			return o, nil, false
		}
		n := 2
		switch args[0] {
		case "--cgroup":
			o.cgroups = append(o.cgroups, args[1])
		case "--fds":
			o.nfds = num(args[1])
		case "--uid":
			o.uid = num(args[1])
		case "--gid":
			o.gid = num(args[1])
		case "--stage":
			o.stage = args[1]
		case "--ns-fd":
			if o.nsFD = num(args[1]); o.nsFD < 3 {
				return o, nil, false
			}
		case "--disk":
			o.disk = args[1]
		case "--mount-bin":
			o.mountBin = args[1]
		case "--rlimit":
			name, v, _ := strings.Cut(args[1], "=")
			res, known := rlimitResource(name)
			n, err := strconv.ParseUint(v, 10, 64)
			if !known || err != nil {
				return o, nil, false
			}
			o.rlimits = append(o.rlimits, rlimit{res, n})
		case "--bind":
			if len(args) < 3 || strings.Contains(args[2], "/") {
				return o, nil, false
			}
			o.binds = append(o.binds, [2]string{args[1], args[2]})
			n = 3
		default:
			return o, nil, false
		}
		args = args[n:]
	}
	if o.nfds < 0 || len(args) < 2 || (o.uid < 0) != (o.gid < 0) || (o.disk != "" && (o.stage == "" || o.mountBin == "")) ||
		(o.nsFD >= 0 && (o.stage != "" || o.nsFD < 3+o.nfds)) {
		return o, nil, false
	}
	if o.disk != "" {
		o.diskOwner = max(o.uid, 0)
	}
	return o, args[1:], true
}

// stage gives the calling thread (the locked main thread; bwrap is forked
// from it) a mount namespace of its own in which o.binds are bound below
// o.stage, a fresh tmpfs. bwrap, running as the workspace's unprivileged
// uid, then reaches the workspace's directories there: their host paths
// below the broker's data directory need not be searchable by that uid.
// The namespace dies with the step.
func stage(o stepOptions) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make private: %w", err)
	}
	if o.root != nil {
		if err := trimMounts(o.root.keepPaths, o.root.keepTrees); err != nil {
			return err
		}
	}
	if err := unix.Mount("sandgate-stage", o.stage, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("tmpfs: %w", err)
	}
	if o.disk != "" {
		if err := mountDisk(o); err != nil {
			return err
		}
	}
	for _, b := range o.binds {
		dst := o.stage + "/" + b[1]
		if err := mkMountPoint(b[0], dst); err != nil {
			return err
		}
		if err := unix.Mount(b[0], dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind: %w", err)
		}
	}
	if o.root != nil {
		if err := stageRoot(o.stage+"/"+rootName, o.root); err != nil {
			return err
		}
		if o.disk != "" {
			// Bound into the root tree, which keeps the file system (and
			// its loop device) mounted: one mount fewer for every exec.
			if err := unix.Unmount(o.stage+"/d", unix.MNT_DETACH); err != nil {
				return fmt.Errorf("unmount: %w", err)
			}
		}
	}
	return nil
}

// trimMounts detaches, in the calling thread's mount namespace (a private
// copy of the host's, made for a workspace), every mount that is neither on
// the way to one of paths nor on the way to or below one of trees: /sys
// and whatever else of the host bwrap and the sandbox's root tree never
// use. Every mount a namespace holds costs each exec that clones it, and
// bwrap reads them all each time it binds something. Mounts are detached
// top-most first; a detached mount takes those below it along.
func trimMounts(paths, trees []string) error {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return fmt.Errorf("mountinfo: %w", scrub(err))
	}
	// within reports whether p is dir or below it.
	within := func(p, dir string) bool {
		return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
	}
	var drop []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		keep := mp == "/"
		for _, p := range paths {
			keep = keep || within(p, mp)
		}
		for _, t := range trees {
			keep = keep || within(t, mp) || within(mp, t)
		}
		if !keep && !slices.Contains(drop, mp) {
			drop = append(drop, mp)
		}
	}
	slices.SortFunc(drop, func(a, b string) int { return len(a) - len(b) })
	for _, mp := range drop {
		// Until it is no mount point any more: mounts may be stacked. It
		// may already be gone with one above it.
		for range 64 {
			if unix.Unmount(mp, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW) != nil {
				break
			}
		}
	}
	return nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space …).
func unescapeMount(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// rootTreesWork reports whether this kernel has mount_setattr(2) (Linux
// 5.12), which stageRoot needs.
func rootTreesWork() bool {
	err := unix.MountSetattr(-1, "", 0, &unix.MountAttr{})
	return !errors.Is(err, unix.ENOSYS)
}

// stageRoot builds the sandbox's root tree t on dir, below the stage: a
// small tmpfs owned by the sandbox's root, holding /usr and the top-level
// links into it, /etc and the workspace's directories bound as an exec's
// bwrap would bind them (read-only, or read-write; never set-user-ID or a
// device), and empty mount points for /proc, /dev and the egress binds;
// then the tmpfs itself is made read-only. An exec's bwrap binds it as its
// / with one bind instead of one for each (every one of which reads the
// whole mount table again) and mounts a fresh /proc, /dev and /dev/shm of
// its own on it. The flags are set with mount_setattr(2), on every mount
// below a bind too, as bwrap does; the mounts are made in the workspace's
// namespace, owned by the host's user namespace, so no sandbox can undo
// them.
func stageRoot(dir string, t *rootTree) error {
	if t.image != nil {
		return stageImageRoot(dir, t)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("mkdir: %w", scrub(err))
	}
	owner := strconv.Itoa(t.owner)
	if err := unix.Mount("sandgate-root", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=64k,nr_inodes=64,uid="+owner+",gid="+owner); err != nil {
		return fmt.Errorf("root tmpfs: %w", err)
	}
	mk := func(name string, file bool) error {
		p := dir + name
		var err error
		if file {
			var f *os.File
			if f, err = os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644); err == nil {
				err = f.Close()
			}
		} else {
			err = os.Mkdir(p, 0o755)
		}
		if err == nil {
			err = os.Lchown(p, t.owner, t.owner)
		}
		if err != nil {
			return fmt.Errorf("root: %w", scrub(err))
		}
		return nil
	}
	for _, l := range t.usrLinks {
		if l.target == "" {
			continue // a directory of its own, bound below
		}
		if err := os.Symlink(l.target, dir+l.name); err != nil {
			return fmt.Errorf("root: %w", scrub(err))
		}
		if err := os.Lchown(dir+l.name, t.owner, t.owner); err != nil {
			return fmt.Errorf("root: %w", scrub(err))
		}
	}
	for _, name := range []string{"/proc", "/dev"} {
		if err := mk(name, false); err != nil {
			return err
		}
	}
	if t.egress {
		// /run/sandgate/forward (a file) and /run/sandgate/egress, with
		// their parents.
		for _, name := range []string{forwardBin, egressMount} {
			var parts []string
			for d := path.Dir(name); d != "/"; d = path.Dir(d) {
				parts = append(parts, d)
			}
			slices.Reverse(parts)
			for _, d := range parts {
				if _, err := os.Lstat(dir + d); err == nil {
					continue
				}
				if err := mk(d, false); err != nil {
					return err
				}
			}
			if err := mk(name, name == forwardBin); err != nil {
				return err
			}
		}
	}
	if err := bindAll(dir, t.binds, false, mk); err != nil {
		return err
	}
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("root: read-only: %w", err)
	}
	return nil
}

// bindAll binds each of binds (directories; files when file is set) on its
// mount point below dir, which mk makes.
func bindAll(dir string, binds []rootBind, file bool, mk func(name string, file bool) error) error {
	for _, b := range binds {
		if err := mk(b.dst, file); err != nil {
			return err
		}
		if err := bindRoot(dir+b.dst, b, file); err != nil {
			return err
		}
	}
	return nil
}

// bindRoot binds b.src (a directory; a file when file is set) on dst, a
// mount point of a root tree, never set-user-ID or a device.
func bindRoot(dst string, b rootBind, file bool) error {
	// A read-write source is one of the workspace's own directories:
	// its last component is never followed, so that a symlink there
	// could not bind a host directory into the sandbox. (The
	// read-only ones are the host's and the broker's.)
	flags := unix.O_PATH | unix.O_CLOEXEC
	if !file {
		flags |= unix.O_DIRECTORY
	}
	if !b.ro {
		flags |= unix.O_NOFOLLOW
	}
	src, err := unix.Open(b.src, flags, 0)
	if err != nil {
		return fmt.Errorf("root: bind source: %w", err)
	}
	err = unix.Mount("/proc/thread-self/fd/"+strconv.Itoa(src), dst, "", unix.MS_BIND|unix.MS_REC, "")
	unix.Close(src)
	if err != nil {
		return fmt.Errorf("root: bind: %w", err)
	}
	attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if b.ro {
		attr |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(-1, dst, unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: attr}); err != nil {
		return fmt.Errorf("root: mount_setattr: %w", err)
	}
	return nil
}

// joinNS moves the calling thread, which must be locked and is never
// given back, into the mount namespace ns (a thread that shares its file
// system attributes with others cannot).
func joinNS(ns *os.File) error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("setns: %w", err)
	}
	return nil
}

// leaveNS moves the calling thread, which joinNS moved into a workspace's
// mount namespace, back into the broker's, host (Provider.hostNS).
func leaveNS(host *os.File) {
	if host == nil {
		return // the thread's end leaves it
	}
	_ = unix.Setns(int(host.Fd()), unix.CLONE_NEWNS)
}

// mkMountPoint makes dst, a directory or (src is a file, such as the
// egress forwarder's binary) an empty file, to bind src on.
func mkMountPoint(src, dst string) error {
	if fi, err := os.Stat(src); err == nil && !fi.IsDir() {
		f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return fmt.Errorf("mount point: %w", scrub(err))
		}
		return f.Close()
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		return fmt.Errorf("mkdir: %w", scrub(err))
	}
	return nil
}

// mountDisk mounts the workspace's image on stage/d, in the step's own
// mount namespace, with mount(2) itself rather than mount(8): one process
// less per exec. Concurrent execs of a workspace must share one file
// system (two ext4 mounts of one image through two loop devices would
// corrupt it), so a loop device already bound to the image (another exec
// runs) is reused, as util-linux's mount does: the kernel then hands out
// the same super block. The flock on the image keeps two steps from each
// binding one at the same time. A new loop device clears itself once its
// last mount is gone (LO_FLAGS_AUTOCLEAR), so nothing outlives the execs.
func mountDisk(o stepOptions) error {
	dst := o.stage + "/d"
	if err := os.Mkdir(dst, 0o755); err != nil {
		return fmt.Errorf("mkdir: %w", scrub(err))
	}
	f, err := os.OpenFile(o.disk, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("disk: %w", scrub(err))
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("disk lock: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOATIME
	var last error
	for range 3 {
		dev, err := loopOf(o.disk, f, &st)
		if err != nil {
			return fmt.Errorf("loop device: %w", err)
		}
		// Held open until mounted, so that it cannot clear itself in
		// between; should it have begun to (the last exec's mount just
		// went), the mount fails: bind one again and retry.
		last = unix.Mount(dev.Name(), dst, "ext4", flags, "noinit_itable")
		dev.Close()
		if last == nil {
			return ownDirs(dst, o.diskOwner)
		}
	}
	return fmt.Errorf("mount: %w", last)
}

// ownDirs gives the directories the sandbox binds from the image mounted
// on dir to uid (and gid uid), unless uid is 0 or they are its already: an
// image copied from its template holds them as root's (disk.go). Without
// following a symlink, and only at the image's top, so that nothing a
// tenant made there can point the chown at a file of the host.
func ownDirs(dir string, uid int) error {
	if uid <= 0 {
		return nil
	}
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	defer unix.Close(root)
	for _, name := range diskDirs {
		var st unix.Stat_t
		if err := unix.Fstatat(root, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // a tenant removed it: theirs to make again
		}
		if int(st.Uid) == uid && int(st.Gid) == uid {
			continue
		}
		if err := unix.Fchownat(root, name, uid, uid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("disk: chown: %w", err)
		}
	}
	return nil
}

// loopOf returns the loop device bound to the image (whose stat is st),
// open, binding a free one when there is none. The device is bound to a
// descriptor of its own, not the one that holds the flock: the loop
// device keeps what it is bound to open for as long as it exists, and with
// it the lock.
func loopOf(image string, locked *os.File, st *unix.Stat_t) (*os.File, error) {
	bound := func(l *os.File) bool {
		info, err := unix.IoctlLoopGetStatus64(int(l.Fd()))
		return err == nil && info.Device == uint64(st.Dev) && info.Inode == st.Ino && info.Offset == 0 && info.Sizelimit == 0
	}
	// The hint names the device the image was last bound to, or that it
	// never was; only a binder holding the lock writes it, so a device it
	// names that is not bound to the image means none is. Without a hint
	// (an image of an older broker), every loop device is looked at.
	switch n, ok := loopHint(locked); {
	case ok && n >= 0:
		if l, err := openLoop(n); err == nil {
			if bound(l) {
				return l, nil
			}
			l.Close()
		}
	case !ok:
		devs, _ := filepath.Glob("/dev/loop[0-9]*")
		for _, d := range devs {
			l, err := os.Open(d)
			if err != nil {
				continue
			}
			if bound(l) {
				return l, nil
			}
			l.Close()
		}
	}
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, scrub(err)
	}
	defer ctl.Close()
	for range 10 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, err
		}
		l, err := openLoop(n)
		if err != nil {
			return nil, scrub(err)
		}
		f, err := os.OpenFile(image, os.O_RDWR, 0)
		if err != nil {
			l.Close()
			return nil, scrub(err)
		}
		err = unix.IoctlLoopConfigure(int(l.Fd()), &unix.LoopConfig{
			Fd:   uint32(f.Fd()),
			Info: unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR},
		})
		f.Close() // the loop device holds its own reference
		if err == nil {
			setLoopHint(locked, n)
			return l, nil
		}
		l.Close()
		if err != unix.EBUSY {
			return nil, err
		}
		// Taken by someone else between GET_FREE and CONFIGURE: the next.
	}
	return nil, errors.New("no free loop device")
}

// loopHintAttr is the image's extended attribute that names the loop
// device it was last bound to ("-1": never bound). It spares each mount a
// look at every loop device of the host, which a busy host has by the
// hundred (they stay once made): a millisecond or more a mount.
const loopHintAttr = "user.sandgate.loop"

// loopHint reads f's hint; ok is false when it has none.
func loopHint(f *os.File) (n int, ok bool) {
	var buf [16]byte
	sz, err := unix.Fgetxattr(int(f.Fd()), loopHintAttr, buf[:])
	if err != nil {
		return 0, false
	}
	n, err = strconv.Atoi(string(buf[:sz]))
	return n, err == nil
}

// setLoopHint records n as f's loop device (-1: none yet). Best effort: a
// file system without user attributes has the scan.
func setLoopHint(f *os.File, n int) {
	_ = unix.Fsetxattr(int(f.Fd()), loopHintAttr, []byte(strconv.Itoa(n)), 0)
}

// openLoop opens /dev/loopN, making the node first when /dev lacks it: a
// container's /dev (Docker's, a tmpfs) holds only the devices it was
// given, while loop-control hands out numbers the host's kernel chose.
func openLoop(n int) (*os.File, error) {
	name := "/dev/loop" + strconv.Itoa(n)
	l, err := os.OpenFile(name, os.O_RDWR, 0)
	if !errors.Is(err, fs.ErrNotExist) {
		return l, err
	}
	const loopMajor = 7
	if err := unix.Mknod(name, unix.S_IFBLK|0o660, int(unix.Mkdev(loopMajor, uint32(n)))); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("make %s: %w", name, err)
	}
	return os.OpenFile(name, os.O_RDWR, 0)
}

// killChildren SIGKILLs every child of the step, orphans reparented to it
// included, and reaps them, until it has none.
func killChildren() {
	for {
		for _, pid := range children() {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if err == syscall.ECHILD {
				return
			}
			if pid <= 0 || err != nil {
				break
			}
		}
		time.Sleep(time.Millisecond)
	}
}

// children lists the step's children from /proc/self/task/*/children
// (each thread has its own).
func children() []int {
	tasks, _ := os.ReadDir("/proc/self/task")
	var out []int
	for _, t := range tasks {
		b, _ := os.ReadFile("/proc/self/task/" + t.Name() + "/children")
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}

// unwrapErrno keeps only the cause of a file error: never a path.
func unwrapErrno(err error) error { return scrub(err) }
