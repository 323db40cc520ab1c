package local

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The host ceiling bounds all of a data directory's workspaces together,
// on their parent cgroups: pids.max, and memory.max (v2) or
// memory.limit_in_bytes (v1). Each workspace's own limits hold below it;
// the ceiling keeps room on the host for the broker, Redis and the rest
// when many workspaces use their limits at once (a fork bomb in each,
// say). Creates are not refused against it: an idle workspace holds a few
// of its tier's processes, so refusing by the tiers' sum would cap a host
// at a few dozen workspaces; the kernel enforces the ceiling instead.

// hostCeiling returns the defaults of Config.HostPidsMax and
// Config.HostMemoryMaxMiB, derived from this host: three quarters of the
// processes the kernel allows (kernel.pid_max, kernel.threads-max), and
// the memory less a quarter of it (at least 1 GiB) kept for the rest.
// A value it cannot read is 0 (no ceiling of that kind).
func hostCeiling() (pids, memoryMiB int) {
	limit := 0
	for _, f := range []string{"/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"} {
		if b, err := os.ReadFile(f); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 && (limit == 0 || n < limit) {
				limit = n
			}
		}
	}
	pids = limit / 4 * 3
	if total := memTotalMiB(); total > 0 {
		memoryMiB = total - max(total/4, 1024)
		if memoryMiB < total/4 { // a small host: keep the workspaces a share all the same
			memoryMiB = total / 4
		}
	}
	return pids, memoryMiB
}

// memTotalMiB returns the host's memory (MemTotal), 0 when unknown.
func memTotalMiB() int {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			return kb >> 10
		}
	}
	return 0
}

// setCeiling sets the ceiling on the parent cgroups (0: none of that
// kind). It runs before each workspace's cgroups are made: on v1 a Close
// removes the parents, and a later create makes them anew.
func (h *cgroupHost) setCeiling(pids int, memoryMiB int) error {
	write := func(dir, file, value string) error {
		if !h.v2 {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
		}
		if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
			return fmt.Errorf("host ceiling: cannot set %s: %w", file, scrub(err))
		}
		return nil
	}
	var errs []error
	if h.pids != "" && pids > 0 {
		errs = append(errs, write(h.pids, "pids.max", strconv.Itoa(pids)))
	}
	if h.mem != "" && memoryMiB > 0 {
		file := "memory.limit_in_bytes"
		if h.v2 {
			file = "memory.max"
		}
		errs = append(errs, write(h.mem, file, strconv.FormatInt(int64(memoryMiB)<<20, 10)))
	}
	return errors.Join(errs...)
}
