package local_test

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// runBPF interprets the few classic BPF instructions the filter uses over a
// seccomp_data holding nr, arch and the low half of args[0], and returns the
// verdict.
func runBPF(t *testing.T, prog []byte, nr, arch, arg0 uint32) uint32 {
	t.Helper()
	var acc uint32
	for pc := 0; pc*8 < len(prog); pc++ {
		in := prog[pc*8:]
		code := binary.NativeEndian.Uint16(in)
		jt, jf := int(in[2]), int(in[3])
		k := binary.NativeEndian.Uint32(in[4:])
		switch code {
		case 0x20: // ld [k]
			switch k {
			case 0:
				acc = nr
			case 4:
				acc = arch
			case 16:
				acc = arg0
			default:
				t.Fatalf("load of offset %d", k)
			}
		case 0x54: // and #k
			acc &= k
		case 0x15: // jeq #k
			if acc == k {
				pc += jt
			} else {
				pc += jf
			}
		case 0x45: // jset #k
			if acc&k != 0 {
				pc += jt
			} else {
				pc += jf
			}
		case 0x05: // ja k
			pc += int(k)
		case 0x06: // ret #k
			return k
		default:
			t.Fatalf("unexpected instruction %#x at %d", code, pc)
		}
	}
	t.Fatal("program fell off its end")
	return 0
}

func TestSeccompFilter(t *testing.T) {
	const allow, eperm, enosys = 0x7fff0000, 0x00050001, 0x00050026
	const newUser, newNS = 0x10000000, 0x00020000
	tests := map[string][]struct {
		name           string
		nr, arch, arg0 uint32
		want           uint32
	}{
		"amd64": {
			{"sched_setaffinity", 203, 0xc000003e, 0, eperm},
			{"x32 sched_setaffinity", 0x40000000 | 203, 0xc000003e, 0, eperm},
			{"i386 sched_setaffinity", 241, 0x40000003, 0, eperm},
			{"sched_getaffinity", 204, 0xc000003e, 0, allow},
			{"i386 203 (not affinity)", 203, 0x40000003, 0, allow},
			{"read", 0, 0xc000003e, 0, allow},
			{"unshare(CLONE_NEWUSER)", 272, 0xc000003e, newUser | newNS, eperm},
			{"unshare(CLONE_NEWNS)", 272, 0xc000003e, newNS, allow},
			{"clone(CLONE_NEWUSER)", 56, 0xc000003e, newUser, eperm},
			{"clone(thread)", 56, 0xc000003e, 0x3d0f00, allow},
			{"clone3", 435, 0xc000003e, 0, enosys},
			{"x32 unshare(CLONE_NEWUSER)", 0x40000000 | 272, 0xc000003e, newUser, eperm},
			{"i386 unshare(CLONE_NEWUSER)", 310, 0x40000003, newUser, eperm},
			{"i386 clone(CLONE_NEWUSER)", 120, 0x40000003, newUser, eperm},
			{"i386 clone3", 435, 0x40000003, 0, enosys},
			{"add_key", 248, 0xc000003e, 0, eperm},
			{"request_key", 249, 0xc000003e, 0, eperm},
			{"keyctl", 250, 0xc000003e, 0, eperm},
			{"perf_event_open", 298, 0xc000003e, 0, eperm},
			{"io_uring_setup", 425, 0xc000003e, 0, enosys},
			{"io_uring_enter", 426, 0xc000003e, 0, enosys},
			{"io_uring_register", 427, 0xc000003e, 0, enosys},
			{"x32 keyctl", 0x40000000 | 250, 0xc000003e, 0, eperm},
			{"i386 add_key", 286, 0x40000003, 0, eperm},
			{"i386 request_key", 287, 0x40000003, 0, eperm},
			{"i386 keyctl", 288, 0x40000003, 0, eperm},
			{"i386 perf_event_open", 336, 0x40000003, 0, eperm},
			{"i386 io_uring_setup", 425, 0x40000003, 0, enosys},
			{"i386 250 (not keyctl)", 250, 0x40000003, 0, allow},
			{"io_uring 428 (not io_uring)", 428, 0xc000003e, 0, allow},
			{"unknown arch", 272, 0x12345678, newUser, allow},
		},
		"arm64": {
			{"sched_setaffinity", 122, 0xc00000b7, 0, eperm},
			{"arm sched_setaffinity", 241, 0x40000028, 0, eperm},
			{"sched_getaffinity", 123, 0xc00000b7, 0, allow},
			{"unshare(CLONE_NEWUSER)", 97, 0xc00000b7, newUser, eperm},
			{"clone(CLONE_NEWUSER)", 220, 0xc00000b7, newUser, eperm},
			{"clone3", 435, 0xc00000b7, 0, enosys},
			{"keyctl", 219, 0xc00000b7, 0, eperm},
			{"perf_event_open", 241, 0xc00000b7, 0, eperm},
			{"io_uring_setup", 425, 0xc00000b7, 0, enosys},
			{"arm keyctl", 311, 0x40000028, 0, eperm},
			{"arm perf_event_open", 364, 0x40000028, 0, eperm},
		},
	}
	cases, ok := tests[runtime.GOARCH]
	if !ok {
		if local.SeccompFilter() != nil {
			t.Fatalf("filter on %s, which has no test cases", runtime.GOARCH)
		}
		return
	}
	prog := local.SeccompFilter()
	for _, tt := range cases {
		if got := runBPF(t, prog, tt.nr, tt.arch, tt.arg0); got != tt.want {
			t.Errorf("filter(%s) = %#x; want %#x", tt.name, got, tt.want)
		}
	}
}

// TestSeccompInSandbox checks the filter in a real sandbox: the key
// management, perf and io_uring calls fail with the filter's errno, not
// the kernel's answer to their (deliberately bad) arguments.
func TestSeccompInSandbox(t *testing.T) {
	t.Parallel()
	nrs := map[string]map[string]int{
		"amd64": {"add_key": 248, "request_key": 249, "keyctl": 250, "perf_event_open": 298, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427},
		"arm64": {"add_key": 217, "request_key": 218, "keyctl": 219, "perf_event_open": 241, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427},
	}[runtime.GOARCH]
	if nrs == nil {
		t.Fatalf("no syscall numbers for %s", runtime.GOARCH)
	}
	p := newProvider(t, t.TempDir(), broker)
	sb := providertest.Create(t, p, providertest.Spec(t))
	for name, nr := range nrs {
		want := "1" // EPERM
		if strings.HasPrefix(name, "io_uring") {
			want = "38" // ENOSYS
		}
		res := providertest.Exec(t, p, sb, "perl", "-e", fmt.Sprintf("syscall(%d, 0, 0, 0, 0, 0); print $!+0", nr))
		if got := string(res.Stdout); got != want || res.ExitCode != 0 {
			t.Errorf("%s in the sandbox: errno %q, exit %d (stderr %q); want errno %s", name, got, res.ExitCode, res.Stderr, want)
		}
	}
}
