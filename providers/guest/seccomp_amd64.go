//go:build linux

package guest

import "golang.org/x/sys/unix"

func nativeArch() (filterArch, bool) {
	return filterArch{
		audit:  unix.AUDIT_ARCH_X86_64,
		x32bit: 0x40000000, // __X32_SYSCALL_BIT
		denied: append(commonDenied[:len(commonDenied):len(commonDenied)],
			unix.SYS_IOPL, unix.SYS_IOPERM, unix.SYS_CREATE_MODULE, unix.SYS_GET_KERNEL_SYMS,
			unix.SYS_QUERY_MODULE, unix.SYS_NFSSERVCTL, unix.SYS__SYSCTL, unix.SYS_SYSFS,
			unix.SYS_USTAT, unix.SYS_USELIB),
		clone: unix.SYS_CLONE, unshare: unix.SYS_UNSHARE, clone3: unix.SYS_CLONE3,
	}, true
}
