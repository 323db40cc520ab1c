package local

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// supported reports whether this build can run sandboxes at all.
const supported = true

// cpuMask is the kernel's cpu_set_t: one bit per CPU, 1024 CPUs.
type cpuMask [16]uint64

func (m *cpuMask) set(cpu int)        { m[cpu/64] |= 1 << (cpu % 64) }
func (m *cpuMask) has(cpu int) bool   { return m[cpu/64]&(1<<(cpu%64)) != 0 }
func (m *cpuMask) ptr() uintptr       { return uintptr(unsafe.Pointer(m)) }
func (m *cpuMask) size() uintptr      { return unsafe.Sizeof(*m) }
func (m *cpuMask) get() syscall.Errno { return affinity(syscall.SYS_SCHED_GETAFFINITY, m) }
func (m *cpuMask) apply() syscall.Errno {
	return affinity(syscall.SYS_SCHED_SETAFFINITY, m)
}

// affinity gets or sets the CPU mask of the calling thread (pid 0).
func affinity(trap uintptr, m *cpuMask) syscall.Errno {
	_, _, e := syscall.RawSyscall(trap, 0, m.size(), m.ptr())
	return e
}

// hostCPUs returns the CPUs the broker itself may run on, which bounds the
// CPUs a sandbox may be pinned to.
func hostCPUs() ([]int, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var m cpuMask
	if e := m.get(); e != 0 {
		return nil, e
	}
	var cpus []int
	for c := range len(m) * 64 {
		if m.has(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) == 0 {
		return nil, errors.New("empty CPU affinity mask")
	}
	return cpus, nil
}

// startPinned starts cmd with its CPU affinity set to cpus. The child
// inherits the mask of the thread that forks it, so the mask is set on a
// locked thread around Start: the sandbox is pinned from its first
// instruction, with no window in which it could fork unpinned children.
func startPinned(cmd *exec.Cmd, cpus []int) error {
	runtime.LockOSThread()
	var old, m cpuMask
	if e := old.get(); e != 0 {
		runtime.UnlockOSThread()
		return e
	}
	for _, c := range cpus {
		m.set(c)
	}
	if e := m.apply(); e != 0 {
		runtime.UnlockOSThread()
		return e
	}
	err := cmd.Start()
	// If the old mask cannot be restored, the thread stays locked to this
	// goroutine and is retired when it exits, rather than running other
	// goroutines on the sandbox's CPUs. Unlocking only on success also
	// keeps the thread alive while the child may need it: the child's
	// parent-death signal follows the forking thread, not the process.
	if old.apply() == 0 {
		runtime.UnlockOSThread()
	}
	return err
}

// pinHere sets the calling thread's CPU mask to cpus when it runs on one of
// them already, so that nothing has to move, and returns a func restoring
// its old mask; nil when it runs elsewhere (or a mask cannot be read or
// set). A child it starts meanwhile is born with the mask. The thread must
// be locked.
func pinHere(cpus []int) (restore func()) {
	var cpu uint32
	if _, _, e := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), 0, 0); e != 0 || !slices.Contains(cpus, int(cpu)) {
		return nil
	}
	var old, m cpuMask
	if e := old.get(); e != 0 {
		return nil
	}
	for _, c := range cpus {
		m.set(c)
	}
	if e := m.apply(); e != 0 {
		return nil
	}
	return func() { old.apply() }
}

// onMainThread reports whether the calling thread is the process's main
// one (its thread id is the process id).
func onMainThread() bool { return syscall.Gettid() == syscall.Getpid() }

// setAffinity sets the CPU mask of process pid to cpus.
func setAffinity(pid int, cpus []int) error {
	var m cpuMask
	for _, c := range cpus {
		m.set(c)
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, uintptr(pid), m.size(), m.ptr()); e != 0 {
		return e
	}
	return nil
}

// closeOnExec marks every descriptor of the broker above stderr
// close-on-exec. Go opens its own descriptors that way, but not the ones the
// broker inherited from whoever started it, and exec.Cmd does not close
// those in the child: without this they would reach every sandbox.
func closeOnExec() error {
	// One call on Linux 5.11 and later; else one per descriptor.
	if unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC) == nil {
		return nil
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
	return nil
}

// sandboxProcAttr starts an exec's bwrap in a process group of its own,
// as uid (and gid) when uid > 0, as the first process of a new pid
// namespace, and with SIGKILL as its parent-death signal. The kernel kills
// every process of a pid namespace when its first one dies, bwrap's own
// namespaces' included, so nothing of the sandbox outlives bwrap, and
// bwrap does not outlive the broker. The parent-death signal follows the
// thread that forks (launchBwrap keeps it until bwrap has exited); Go sets it
// after the uid change, which would clear it.
func sandboxProcAttr(uid int) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Cloneflags: syscall.CLONE_NEWPID}
	if uid > 0 {
		// The sandbox's uid 0 maps to it: nothing of it holds a host
		// privilege.
		a.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), Groups: []uint32{}}
	}
	return a
}

// selfExe is the broker's own binary, run again as the supervisor.
const selfExe = "/proc/self/exe"

// killExec kills the exec whose bwrap is pid. bwrap is the first process
// of the exec's pid namespace, so the kernel kills all of the sandbox with
// it. (Only SIGKILL reaches it: the first process of a pid namespace gets
// no signal it does not handle, even from outside.)
func killExec(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }

// killGroup sends SIGKILL to the process group pgid.
func killGroup(pgid int) error { return syscall.Kill(-pgid, syscall.SIGKILL) }

// waitExited blocks until the process pid has exited, without reaping it:
// until exec.Cmd.Wait reaps it, the pid and its process group id cannot be
// reused, so killing the group stays safe until then.
func waitExited(pid int) error {
	const (
		pPID    = 1          // P_PID
		wNoWait = 0x01000000 // WNOWAIT
	)
	var info [128]byte // siginfo_t
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info)), syscall.WEXITED|wNoWait, 0, 0)
		if e != syscall.EINTR {
			if e != 0 {
				return e
			}
			return nil
		}
	}
}

// seccompFilter returns a seccomp program for bwrap's --seccomp, or nil on
// an architecture it does not know. It allows everything but:
//
//   - sched_setaffinity fails with EPERM: without it, a sandboxed process
//     could widen its own CPU affinity, which needs no privilege;
//   - unshare and clone with CLONE_NEWUSER fail with EPERM, and clone3
//     (whose flags a filter cannot read) with ENOSYS, so that the C
//     library falls back to clone: no nested user namespace, the kernel
//     surface bwrap's --disable-userns removes, without the nested
//     namespace --disable-userns needs (which would hide the real uid map
//     from /proc/self/uid_map);
//   - add_key, request_key, keyctl and perf_event_open fail with EPERM, and
//     io_uring_setup, io_uring_enter and io_uring_register with ENOSYS (as
//     on a kernel without io_uring, so that libraries fall back to plain
//     system calls): kernel surfaces a workspace never needs, with a
//     history of privilege escalations, which the sandbox's namespaces do
//     not confine (the keyrings are per uid, not per namespace).
//
// The program checks the audit architecture first, so a 32-bit compat
// syscall (int 0x80 on amd64, AArch32 on arm64) cannot dodge it with a
// different number, and masks the x32 bit on amd64 for the same reason.
func seccompFilter() []byte {
	type nrs struct {
		affinity, unshare, clone, clone3 uint32
		addKey, requestKey, keyctl, perf uint32
	}
	var arch, nrMask, compatArch uint32
	var native, compat nrs
	switch runtime.GOARCH {
	case "amd64":
		arch, nrMask = 0xc000003e, 0xbfffffff // AUDIT_ARCH_X86_64; clears the x32 bit
		native = nrs{203, 272, 56, 435, 248, 249, 250, 298}
		compatArch = 0x40000003 // AUDIT_ARCH_I386
		compat = nrs{241, 310, 120, 435, 286, 287, 288, 336}
	case "arm64":
		arch, nrMask = 0xc00000b7, 0xffffffff // AUDIT_ARCH_AARCH64
		native = nrs{122, 97, 220, 435, 217, 218, 219, 241}
		compatArch = 0x40000028 // AUDIT_ARCH_ARM
		compat = nrs{241, 337, 120, 435, 309, 310, 311, 364}
	default:
		return nil
	}
	const (
		ldAbs     = 0x20 // BPF_LD|BPF_W|BPF_ABS
		andK      = 0x54 // BPF_ALU|BPF_AND|BPF_K
		jeqK      = 0x15 // BPF_JMP|BPF_JEQ|BPF_K
		jsetK     = 0x45 // BPF_JMP|BPF_JSET|BPF_K
		ja        = 0x05 // BPF_JMP|BPF_JA
		retK      = 0x06 // BPF_RET|BPF_K
		offNr     = 0    // offsetof(struct seccomp_data, nr)
		offArch   = 4    // offsetof(struct seccomp_data, arch)
		offArg0   = 16   // offsetof(struct seccomp_data, args[0]), low half on little endian
		retAllow  = 0x7fff0000
		retEPERM  = 0x00050000 | uint32(syscall.EPERM)  // SECCOMP_RET_ERRNO
		retENOSYS = 0x00050000 | uint32(syscall.ENOSYS) // SECCOMP_RET_ERRNO
		newUser   = syscall.CLONE_NEWUSER
		// io_uring_setup, _enter and _register: the same numbers on every
		// architecture, native and compat.
		ioURingSetup, ioURingRegister = 425, 427
	)
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		return nil // big endian: args[0]'s low half is elsewhere
	}
	type insn struct {
		code   uint16
		jt, jf string // labels; "" is the next instruction
		k      uint32
		label  string // this instruction's label
	}
	nrChecks := func(n nrs) []insn {
		return []insn{
			{code: jeqK, k: n.affinity, jt: "eperm"},
			{code: jeqK, k: n.addKey, jt: "eperm"},
			{code: jeqK, k: n.requestKey, jt: "eperm"},
			{code: jeqK, k: n.keyctl, jt: "eperm"},
			{code: jeqK, k: n.perf, jt: "eperm"},
			{code: jeqK, k: n.clone3, jt: "enosys"},
			{code: jeqK, k: ioURingSetup, jt: "enosys"},
			{code: jeqK, k: ioURingSetup + 1, jt: "enosys"},
			{code: jeqK, k: ioURingRegister, jt: "enosys"},
			{code: jeqK, k: n.unshare, jt: "flags"},
			{code: jeqK, k: n.clone, jt: "flags"},
			{code: ja, jt: "allow"},
		}
	}
	prog := []insn{
		{code: ldAbs, k: offArch},
		{code: jeqK, k: arch, jt: "native"},
		{code: jeqK, k: compatArch, jt: "compat", jf: "allow"},
		{code: ldAbs, k: offNr, label: "native"},
		{code: andK, k: nrMask},
	}
	prog = append(prog, nrChecks(native)...)
	prog = append(prog, insn{code: ldAbs, k: offNr, label: "compat"})
	prog = append(prog, nrChecks(compat)...)
	prog = append(prog,
		insn{code: ldAbs, k: offArg0, label: "flags"},
		insn{code: jsetK, k: newUser, jt: "eperm", jf: "allow"},
		insn{code: retK, k: retAllow, label: "allow"},
		insn{code: retK, k: retEPERM, label: "eperm"},
		insn{code: retK, k: retENOSYS, label: "enosys"},
	)
	at := map[string]int{}
	for i, in := range prog {
		if in.label != "" {
			at[in.label] = i
		}
	}
	// Jump offsets count instructions skipped after the jump.
	off := func(pc int, label string) uint32 {
		if label == "" {
			return 0
		}
		return uint32(at[label] - pc - 1)
	}
	b := make([]byte, 0, 8*len(prog))
	for pc, in := range prog {
		k := in.k
		var jt, jf uint8
		if in.code == ja {
			k = off(pc, in.jt)
		} else if in.code != retK && in.code != ldAbs && in.code != andK {
			jt, jf = uint8(off(pc, in.jt)), uint8(off(pc, in.jf))
		}
		b = binary.NativeEndian.AppendUint16(b, in.code)
		b = append(b, jt, jf)
		b = binary.NativeEndian.AppendUint32(b, k)
	}
	return b
}

// flock applies how (syscall.LOCK_SH, LOCK_EX or LOCK_UN, with LOCK_NB) to
// the open file fd.
func flock(fd int, how int) error { return syscall.Flock(fd, how) }

// Lock kinds of flock, named for the callers.
const (
	lockShared    = syscall.LOCK_SH
	lockExclusive = syscall.LOCK_EX
	lockNonBlock  = syscall.LOCK_NB
	lockUnlock    = syscall.LOCK_UN
)

// errWouldBlock is what a non-blocking flock returns while another holds the lock.
var errWouldBlock error = syscall.EWOULDBLOCK

// procStart returns the start time of process pid, in clock ticks after
// boot (field 22 of /proc/PID/stat). With the pid it names one process for
// good: a pid reused later has a later start time.
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); field 22 is f[19].
	if len(f) < 20 {
		return 0, errors.New("malformed /proc stat")
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, os.ErrProcessDone // exited, not yet reaped
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// memfd returns an anonymous in-memory file holding b, positioned at its
// start: a descriptor to hand a child that never touches a disk.
func memfd(name string, b []byte) (*os.File, error) {
	// Close-on-exec: exec.Cmd dups it to the child's descriptor 3 or 4.
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(0, 0); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// durableProcAttr starts a durable command's runner as the leader of a new
// session: it outlives the broker (no parent-death signal), and killing its
// process group reaches the runner, its readers and bwrap.
func durableProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

// killPid sends SIGKILL to pid.
func killPid(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
