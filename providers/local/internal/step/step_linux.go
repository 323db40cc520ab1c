package step

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func init() {
	switch {
	case len(os.Args) > 0 && os.Args[0] == Name:
		os.Exit(run(os.Args[1:]))
	case len(os.Args) > 1 && os.Args[1] == "--"+Name:
		// From a durable command's runner, a shell that cannot set argv[0].
		os.Exit(run(os.Args[2:]))
	}
}

// options are the step's arguments before "--".
type options struct {
	nfds     int
	cgroups  []string
	uid, gid int // -1: keep the broker's
	stage    Stage
	rlimits  []Rlimit
	// nsFD, when >= 0, is the step's descriptor of the workspace's mount
	// namespace, which it joins in place of staging.
	nsFD int
}

// run is the step's main; it returns the exit code.
func run(args []string) int {
	// Package init runs on the main thread, locked: the child's
	// parent-death signal below follows this thread, which lives until the
	// step exits.
	runtime.LockOSThread()
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGCHLD)
	o, argv, ok := parse(args)
	if !ok {
		fmt.Fprintln(os.Stderr, "sandgate: exec step: bad arguments")
		return ExitUsage
	}
	self := []byte(strconv.Itoa(os.Getpid()))
	for _, f := range o.cgroups {
		if err := os.WriteFile(f, self, 0); err != nil {
			// No path: the message reaches the exec's stderr.
			fmt.Fprintln(os.Stderr, "sandgate: exec step: cannot join the workspace's cgroup:", Scrub(err))
			return ExitCgroup
		}
	}
	if o.nsFD >= 0 {
		// The workspace's namespace, root tree and all (an image
		// workspace's; see Provider.commandNS); the descriptor is not
		// the sandbox's.
		ns := os.NewFile(uintptr(o.nsFD), "ns")
		err := JoinNS(ns)
		ns.Close()
		if err != nil {
			fmt.Fprintln(os.Stderr, "sandgate: exec step: namespace:", err)
			return ExitStart
		}
	}
	if o.stage.Dir != "" {
		if err := o.stage.stage(); err != nil {
			fmt.Fprintln(os.Stderr, "sandgate: exec step: stage:", err)
			return ExitStart
		}
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "sandgate: exec step: subreaper:", err)
		return ExitStart
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
			return ExitUsage
		}
		b, err := io.ReadAll(files[3]) // the broker closes it once written
		if err != nil {
			fmt.Fprintln(os.Stderr, "sandgate: exec step: options:", err)
			return ExitStart
		}
		r, w, err := os.Pipe()
		if err != nil {
			fmt.Fprintln(os.Stderr, "sandgate: exec step: options:", err)
			return ExitStart
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
		fmt.Fprintln(os.Stderr, "sandgate: exec step: start:", Scrub(err))
		return ExitStart
	}
	child := proc.Pid
	for _, f := range files[3:] {
		f.Close()
	}
	if optsW != nil {
		if err := setLimits(child, o.uid, o.gid, o.rlimits, opts, optsW); err != nil {
			fmt.Fprintln(os.Stderr, "sandgate: exec step: rlimit:", err)
			killChildren()
			return ExitStart
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
	return ExitStart // not reached: sigs is never closed
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
func setLimits(pid, uid, gid int, limits []Rlimit, opts []byte, w *os.File) error {
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
func prlimitAs(pid, uid, gid int, limits []Rlimit) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		done <- PrlimitOn(pid, uid, gid, limits)
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
func PrlimitOn(pid, uid, gid int, limits []Rlimit) error {
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
		if err := unix.Prlimit(pid, l.Resource, &unix.Rlimit{Cur: l.Value, Max: l.Value}, nil); err != nil {
			return err
		}
	}
	return nil
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

// parse parses the step's arguments; argv is what follows "--".
func parse(args []string) (o options, argv []string, ok bool) {
	o = options{nfds: -1, uid: -1, gid: -1, nsFD: -1}
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
			o.stage.Dir = args[1]
		case "--ns-fd":
			if o.nsFD = num(args[1]); o.nsFD < 3 {
				return o, nil, false
			}
		case "--disk":
			o.stage.Disk = args[1]
		case "--mount-bin":
			o.stage.MountBin = args[1]
		case "--rlimit":
			name, v, _ := strings.Cut(args[1], "=")
			res, known := rlimitResource(name)
			n, err := strconv.ParseUint(v, 10, 64)
			if !known || err != nil {
				return o, nil, false
			}
			o.rlimits = append(o.rlimits, Rlimit{Resource: res, Value: n})
		case "--bind":
			if len(args) < 3 || strings.Contains(args[2], "/") {
				return o, nil, false
			}
			o.stage.Binds = append(o.stage.Binds, [2]string{args[1], args[2]})
			n = 3
		default:
			return o, nil, false
		}
		args = args[n:]
	}
	if o.nfds < 0 || len(args) < 2 || (o.uid < 0) != (o.gid < 0) || (o.stage.Disk != "" && (o.stage.Dir == "" || o.stage.MountBin == "")) ||
		(o.nsFD >= 0 && (o.stage.Dir != "" || o.nsFD < 3+o.nfds)) {
		return o, nil, false
	}
	if o.stage.Disk != "" {
		o.stage.DiskOwner = max(o.uid, 0)
	}
	return o, args[1:], true
}

// NewNS gives the calling thread (locked, and never given back to the Go
// runtime) a mount namespace of its own, a private copy of its own.
func NewNS() error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make private: %w", err)
	}
	return nil
}

// Mount stages s in the calling thread's mount namespace (NewNS's): a
// fresh tmpfs on s.Dir, the disk image mounted on Dir/d, and s.Binds bound
// below Dir. bwrap, running as the workspace's unprivileged uid, then
// reaches the workspace's directories there: their host paths below the
// broker's data directory need not be searchable by that uid.
func (s Stage) Mount() error {
	if err := unix.Mount("sandgate-stage", s.Dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("tmpfs: %w", err)
	}
	if s.Disk != "" {
		if err := s.mountDisk(); err != nil {
			return err
		}
	}
	for _, b := range s.Binds {
		dst := s.Dir + "/" + b[1]
		if err := mkMountPoint(b[0], dst); err != nil {
			return err
		}
		if err := unix.Mount(b[0], dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind: %w", err)
		}
	}
	return nil
}

// stage is the step's own staging, in a namespace that dies with it.
func (s Stage) stage() error {
	if err := NewNS(); err != nil {
		return err
	}
	return s.Mount()
}

// JoinNS moves the calling thread, which must be locked and is never
// given back, into the mount namespace ns (a thread that shares its file
// system attributes with others cannot).
func JoinNS(ns *os.File) error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("setns: %w", err)
	}
	return nil
}

// LeaveNS moves the calling thread, which JoinNS moved into a workspace's
// mount namespace, back into the broker's, host.
func LeaveNS(host *os.File) {
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
			return fmt.Errorf("mount point: %w", Scrub(err))
		}
		return f.Close()
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		return fmt.Errorf("mkdir: %w", Scrub(err))
	}
	return nil
}

// mountDisk mounts the workspace's image on Dir/d, in the step's own
// mount namespace, with mount(2) itself rather than mount(8): one process
// less per exec. Concurrent execs of a workspace must share one file
// system (two ext4 mounts of one image through two loop devices would
// corrupt it), so a loop device already bound to the image (another exec
// runs) is reused, as util-linux's mount does: the kernel then hands out
// the same super block. The flock on the image keeps two steps from each
// binding one at the same time. A new loop device clears itself once its
// last mount is gone (LO_FLAGS_AUTOCLEAR), so nothing outlives the execs.
func (s Stage) mountDisk() error {
	dst := s.Dir + "/d"
	if err := os.Mkdir(dst, 0o755); err != nil {
		return fmt.Errorf("mkdir: %w", Scrub(err))
	}
	f, err := os.OpenFile(s.Disk, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("disk: %w", Scrub(err))
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
		dev, err := loopOf(s.Disk, f, &st)
		if err != nil {
			return fmt.Errorf("loop device: %w", err)
		}
		// Held open until mounted, so that it cannot clear itself in
		// between; should it have begun to (the last exec's mount just
		// went), the mount fails: bind one again and retry.
		last = unix.Mount(dev.Name(), dst, "ext4", flags, "noinit_itable")
		dev.Close()
		if last == nil {
			return ownDirs(dst, s.DiskOwner)
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
	for _, name := range DiskDirs {
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
		return nil, Scrub(err)
	}
	defer ctl.Close()
	for range 10 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, err
		}
		l, err := openLoop(n)
		if err != nil {
			return nil, Scrub(err)
		}
		f, err := os.OpenFile(image, os.O_RDWR, 0)
		if err != nil {
			l.Close()
			return nil, Scrub(err)
		}
		err = unix.IoctlLoopConfigure(int(l.Fd()), &unix.LoopConfig{
			Fd:   uint32(f.Fd()),
			Info: unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR},
		})
		f.Close() // the loop device holds its own reference
		if err == nil {
			SetLoopHint(locked, n)
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

// SetLoopHint records n as f's loop device (-1: none yet). Best effort: a
// file system without user attributes has the scan.
func SetLoopHint(f *os.File, n int) {
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
