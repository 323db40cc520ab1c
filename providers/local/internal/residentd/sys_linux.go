package residentd

import (
	"syscall"
	"unsafe"
)

// The system calls package syscall lacks: the resident does without
// golang.org/x/sys/unix, whose initialisation comes late (see the package
// doc).

const (
	pPID = 1 // waitid's idtype P_PID
	xOK  = 1 // access's X_OK
)

func prctl(option, arg2 uintptr) error {
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, option, arg2, 0, 0, 0, 0); e != 0 {
		return e
	}
	return nil
}

// prlimit sets pid's limit of resource to lim (prlimit(2)).
func prlimit(pid, resource int, lim *syscall.Rlimit) error {
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), uintptr(resource), uintptr(unsafe.Pointer(lim)), 0, 0, 0); e != 0 {
		return e
	}
	return nil
}
