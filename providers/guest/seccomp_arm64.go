//go:build linux

package guest

import "golang.org/x/sys/unix"

func nativeArch() (filterArch, bool) {
	return filterArch{
		audit:  unix.AUDIT_ARCH_AARCH64,
		denied: append(commonDenied[:len(commonDenied):len(commonDenied)], unix.SYS_NFSSERVCTL),
		clone:  unix.SYS_CLONE, unshare: unix.SYS_UNSHARE, clone3: unix.SYS_CLONE3,
	}, true
}
