package main

import (
	"fmt"
	"io"
	"os/exec"
	"slices"
	"syscall"
	"time"
)

// hostCost is what the host charges for the kernel work that the
// absolute figures (10 ms a pooled cycle, µs of CPU a pair) are made of.
// Hosts of one kind differ by a factor of two in it from one day to the
// next (a paravirtualised guest pays for every page-table change), so a
// sitting states it beside its figures: two sittings' figures compare only
// as far as their hosts do.
type hostCost struct {
	fault   time.Duration // one first touch of an anonymous page
	syscall time.Duration // one getppid(2)
	spawn   time.Duration // start and reap /bin/true, median
	// wake is a byte's round trip through cat(1) over two pipes, median:
	// two wake-ups of a sleeping process, as each Redis call and each
	// request costs the broker and redis-server.
	wake time.Duration
}

// Sizes of the probe: small enough to take well under a second.
const (
	probeBytes  = 32 << 20
	probeCalls  = 20000
	probeSpawns = 21
	probeWakes  = 2001
	probeRounds = 3
)

// probeHost measures h: the page fault and the system call each the best
// of a few rounds (the host's cost, not a neighbour's burst), the process
// start and the wake-up each the median of many.
func probeHost() (hostCost, error) {
	var h hostCost
	page := syscall.Getpagesize()
	for r := range probeRounds {
		b, err := syscall.Mmap(-1, 0, probeBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
		if err != nil {
			return h, fmt.Errorf("host probe: mmap: %w", err)
		}
		// One fault a page, not one a huge page.
		if err := syscall.Madvise(b, syscall.MADV_NOHUGEPAGE); err != nil {
			syscall.Munmap(b)
			return h, fmt.Errorf("host probe: madvise: %w", err)
		}
		t := time.Now()
		for i := 0; i < len(b); i += page {
			b[i] = 1
		}
		f := time.Since(t) / time.Duration(len(b)/page)
		syscall.Munmap(b)

		t = time.Now()
		for range probeCalls {
			syscall.Getppid()
		}
		s := time.Since(t) / probeCalls
		if r == 0 || f < h.fault {
			h.fault = f
		}
		if r == 0 || s < h.syscall {
			h.syscall = s
		}
	}
	spawns := make([]time.Duration, 0, probeSpawns)
	for range probeSpawns {
		t := time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			return h, fmt.Errorf("host probe: /bin/true: %w", err)
		}
		spawns = append(spawns, time.Since(t))
	}
	slices.Sort(spawns)
	h.spawn = spawns[len(spawns)/2]
	w, err := probeWake()
	if err != nil {
		return h, err
	}
	h.wake = w
	return h, nil
}

// probeWake is the median round trip of one byte through cat(1).
func probeWake() (time.Duration, error) {
	cat := exec.Command("cat")
	in, err := cat.StdinPipe()
	if err != nil {
		return 0, fmt.Errorf("host probe: %w", err)
	}
	out, err := cat.StdoutPipe()
	if err != nil {
		return 0, fmt.Errorf("host probe: %w", err)
	}
	if err := cat.Start(); err != nil {
		return 0, fmt.Errorf("host probe: cat: %w", err)
	}
	defer cat.Wait()
	defer in.Close()
	ds := make([]time.Duration, 0, probeWakes)
	b := []byte{1}
	for range probeWakes {
		t := time.Now()
		if _, err := in.Write(b); err != nil {
			return 0, fmt.Errorf("host probe: cat: %w", err)
		}
		if _, err := io.ReadFull(out, b); err != nil {
			return 0, fmt.Errorf("host probe: cat: %w", err)
		}
		ds = append(ds, time.Since(t))
	}
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}

// String is the line a sitting prints.
func (h hostCost) String() string {
	return fmt.Sprintf("host: a page fault %.1f µs, a system call %.2f µs, a byte to cat and back %.1f µs (p50), /bin/true started and reaped %s ms (p50)",
		float64(h.fault)/1e3, float64(h.syscall)/1e3, float64(h.wake)/1e3, ms(h.spawn))
}
