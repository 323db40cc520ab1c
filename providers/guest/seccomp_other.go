//go:build linux && !amd64 && !arm64

package guest

// nativeArch knows no filter here: the jail refuses to start without one.
func nativeArch() (filterArch, bool) { return filterArch{}, false }
