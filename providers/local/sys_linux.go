package local

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"runtime"
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

// closeOnExec marks every descriptor of the broker above stderr
// close-on-exec. Go opens its own descriptors that way, but not the ones the
// broker inherited from whoever started it, and exec.Cmd does not close
// those in the child: without this they would reach every sandbox.
func closeOnExec() error {
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

// sysProcAttr puts an exec's step in its own process group and sends it
// SIGTERM when the broker dies, upon which the step kills the sandbox (see
// step_linux.go). The parent-death signal follows the thread that forks:
// startPinned forks on a locked thread, which Go never retires while it is
// unlocked in its pool.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

// selfExe is the broker's own binary, run again as an exec's step.
const selfExe = "/proc/self/exe"

// killStep asks the exec step pid to kill its sandbox and exit.
func killStep(pid int) error { return syscall.Kill(pid, syscall.SIGTERM) }

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

// seccompFilter returns a seccomp program for bwrap's --seccomp that makes
// sched_setaffinity fail with EPERM and allows everything else, or nil on
// an architecture it does not know. Without it, a sandboxed process could
// widen its own CPU affinity, which needs no privilege.
//
// The program checks the audit architecture first, so a 32-bit compat
// syscall (int 0x80 on amd64, AArch32 on arm64) cannot dodge it with a
// different number, and masks the x32 bit on amd64 for the same reason.
func seccompFilter() []byte {
	var arch, nr, nrMask, compatArch, compatNr uint32
	switch runtime.GOARCH {
	case "amd64":
		arch, nr, nrMask = 0xc000003e, 203, 0xbfffffff // AUDIT_ARCH_X86_64; clears the x32 bit
		compatArch, compatNr = 0x40000003, 241         // AUDIT_ARCH_I386
	case "arm64":
		arch, nr, nrMask = 0xc00000b7, 122, 0xffffffff // AUDIT_ARCH_AARCH64
		compatArch, compatNr = 0x40000028, 241         // AUDIT_ARCH_ARM
	default:
		return nil
	}
	const (
		ldAbs    = 0x20 // BPF_LD|BPF_W|BPF_ABS
		andK     = 0x54 // BPF_ALU|BPF_AND|BPF_K
		jeqK     = 0x15 // BPF_JMP|BPF_JEQ|BPF_K
		retK     = 0x06 // BPF_RET|BPF_K
		offNr    = 0    // offsetof(struct seccomp_data, nr)
		offArch  = 4    // offsetof(struct seccomp_data, arch)
		retAllow = 0x7fff0000
		retEPERM = 0x00050000 | uint32(syscall.EPERM) // SECCOMP_RET_ERRNO
	)
	type insn struct {
		code   uint16
		jt, jf uint8
		k      uint32
	}
	// Jump offsets count instructions skipped after the jump.
	prog := []insn{
		/* 0 */ {ldAbs, 0, 0, offArch},
		/* 1 */ {jeqK, 0, 3, arch}, // native: 2, else 5
		/* 2 */ {ldAbs, 0, 0, offNr},
		/* 3 */ {andK, 0, 0, nrMask},
		/* 4 */ {jeqK, 4, 3, nr}, // 9: deny, 8: allow
		/* 5 */ {jeqK, 0, 2, compatArch}, // compat: 6, else 8
		/* 6 */ {ldAbs, 0, 0, offNr},
		/* 7 */ {jeqK, 1, 0, compatNr}, // 9: deny, 8: allow
		/* 8 */ {retK, 0, 0, retAllow},
		/* 9 */ {retK, 0, 0, retEPERM},
	}
	b := make([]byte, 0, 8*len(prog))
	for _, in := range prog {
		b = binary.NativeEndian.AppendUint16(b, in.code)
		b = append(b, in.jt, in.jf)
		b = binary.NativeEndian.AppendUint32(b, in.k)
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
