package guest

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// The seccomp filter of the jail. It allows everything but:
//
//   - the syscalls of denied (per architecture: a Docker-like list of the
//     kernel's administrative and debugging surface: mounts, namespaces,
//     modules, kexec, keyrings, bpf, perf, io_uring, ptrace, clocks,
//     swap, reboot), which fail with EPERM;
//   - clone and unshare with a namespace flag, which fail with EPERM;
//   - clone3, whose flags a filter cannot read, which fails with ENOSYS
//     so that the C library falls back to clone;
//   - every syscall of another ABI (32-bit compat, x32), which fails with
//     ENOSYS: the list names native numbers only, and a compat number
//     must not dodge it.
//
// Most of these already fail for want of a capability; the filter is the
// second layer, and the only one for the few that need none (unshare of a
// user namespace, io_uring, userfaultfd, perf_event_open at a permissive
// paranoia level).

// nsFlags are clone's and unshare's namespace flags. CLONE_NEWTIME
// (0x80) is unshare's only: in clone's first argument that bit is part of
// the exit signal.
const (
	nsFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
		unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET
	unshareFlags = nsFlags | unix.CLONE_NEWTIME
)

// filterArch is what the filter needs to know of an architecture.
type filterArch struct {
	audit                  uint32 // AUDIT_ARCH_* of the native ABI
	x32bit                 uint32 // syscall number bit of an ABI sharing audit (x32); 0 if none
	denied                 []uint32
	clone, unshare, clone3 uint32
}

// BPF opcodes and seccomp return values.
const (
	bpfLdAbs  = 0x20 // BPF_LD|BPF_W|BPF_ABS
	bpfJeqK   = 0x15 // BPF_JMP|BPF_JEQ|BPF_K
	bpfJsetK  = 0x45 // BPF_JMP|BPF_JSET|BPF_K
	bpfRetK   = 0x06 // BPF_RET|BPF_K
	offNr     = 0    // offsetof(struct seccomp_data, nr)
	offArch   = 4    // offsetof(struct seccomp_data, arch)
	offArg0   = 16   // offsetof(struct seccomp_data, args[0]), low half (little endian)
	retAllow  = 0x7fff0000
	retErrno  = 0x00050000
	retEPERM  = retErrno | uint32(syscall.EPERM)
	retENOSYS = retErrno | uint32(syscall.ENOSYS)
)

// label names a place in a program being built; next is the following
// instruction.
type label int

const (
	next label = iota
	lAllow
	lEPERM
	lENOSYS
	lUnshare
)

// progBuilder assembles a classic BPF program whose jumps name labels.
type progBuilder struct {
	ins    []unix.SockFilter
	jumps  map[int][2]label // instruction index: its true and false targets
	labels map[label]int
}

func (b *progBuilder) stmt(code uint16, k uint32) {
	b.ins = append(b.ins, unix.SockFilter{Code: code, K: k})
}

func (b *progBuilder) jump(code uint16, k uint32, t, f label) {
	b.jumps[len(b.ins)] = [2]label{t, f}
	b.stmt(code, k)
}

func (b *progBuilder) mark(l label) { b.labels[l] = len(b.ins) }

// resolve fills in the jump offsets; ok is false when one does not fit.
func (b *progBuilder) resolve() ([]unix.SockFilter, bool) {
	for i, tf := range b.jumps {
		var off [2]uint8
		for j, l := range tf {
			if l == next {
				continue
			}
			d := b.labels[l] - i - 1
			if d < 0 || d > 255 {
				return nil, false
			}
			off[j] = uint8(d)
		}
		b.ins[i].Jt, b.ins[i].Jf = off[0], off[1]
	}
	return b.ins, true
}

// build returns a's filter program.
func (a filterArch) build() []unix.SockFilter {
	b := &progBuilder{jumps: map[int][2]label{}, labels: map[label]int{}}
	b.stmt(bpfLdAbs, offArch)
	b.jump(bpfJeqK, a.audit, next, lENOSYS)
	b.stmt(bpfLdAbs, offNr)
	if a.x32bit != 0 {
		b.jump(bpfJsetK, a.x32bit, lENOSYS, next)
	}
	for _, nr := range a.denied {
		b.jump(bpfJeqK, nr, lEPERM, next)
	}
	b.jump(bpfJeqK, a.clone3, lENOSYS, next)
	// clone: the namespace flags of its first argument.
	b.jump(bpfJeqK, a.clone, next, lUnshare)
	b.stmt(bpfLdAbs, offArg0)
	b.jump(bpfJsetK, nsFlags, lEPERM, lAllow)
	b.mark(lUnshare)
	b.jump(bpfJeqK, a.unshare, next, lAllow)
	b.stmt(bpfLdAbs, offArg0)
	b.jump(bpfJsetK, unshareFlags, lEPERM, lAllow)
	b.mark(lAllow)
	b.stmt(bpfRetK, retAllow)
	b.mark(lEPERM)
	b.stmt(bpfRetK, retEPERM)
	b.mark(lENOSYS)
	b.stmt(bpfRetK, retENOSYS)
	prog, ok := b.resolve()
	if !ok {
		return nil
	}
	return prog
}

// seccompFilter is the jail's filter for this architecture, or nil when
// it knows none.
func seccompFilter() []unix.SockFilter {
	a, ok := nativeArch()
	if !ok {
		return nil
	}
	return a.build()
}
