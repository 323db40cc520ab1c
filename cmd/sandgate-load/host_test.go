package main

import (
	"strings"
	"testing"
)

// TestProbeHost checks that the host line measures each cost: a zero
// would mean a loop the compiler or the kernel skipped, and a process
// start is many system calls.
func TestProbeHost(t *testing.T) {
	h, err := probeHost()
	if err != nil {
		t.Fatal(err)
	}
	if h.fault <= 0 || h.syscall <= 0 || h.spawn <= 0 || h.wake <= 0 {
		t.Fatalf("probe: %+v, want every cost above zero", h)
	}
	if h.spawn <= 10*h.syscall || h.wake <= 2*h.syscall {
		t.Errorf("probe: /bin/true in %v, a round trip through cat %v, a system call %v: a process start is more than ten calls, a round trip more than two",
			h.spawn, h.wake, h.syscall)
	}
	if line := h.String(); !strings.HasPrefix(line, "host: a page fault ") || !strings.Contains(line, ms(h.spawn)+" ms") {
		t.Errorf("line %q", line)
	}
}
