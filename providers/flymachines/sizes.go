package flymachines

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sandgate/sandgate"
)

// Memory bounds per vCPU of each CPU kind (sheet §1.9), and the most
// vCPUs of a shared guest (shared-cpu-8x is the largest preset).
const (
	sharedMinMBPerCPU, sharedMaxMBPerCPU = 256, 2048
	perfMinMBPerCPU, perfMaxMBPerCPU     = 2048, 8192
	sharedMaxCPUs                        = 8
)

// vcpusPerCore: Fly counts vCPUs, two per core of a tier (the Formation
// doc's tier table: small 2, standard 4, large 8, xlarge 16 vCPUs).
const vcpusPerCore = 2

// guestFor returns the Fly guest of a tier: its vCPUs, and its memory
// raised, where needed, to the least the CPU kind allows. A shared guest
// is used while the CPU count and the memory per vCPU allow one, a
// performance guest beyond.
func guestFor(s sandgate.Size) (Guest, error) {
	if s.CPUCores < 1 || s.MemoryMiB < 1 {
		return Guest{}, errors.New("flymachines: create: size needs CPU cores and memory")
	}
	cpus := s.CPUCores * vcpusPerCore
	mem := s.MemoryMiB
	if cpus <= sharedMaxCPUs && mem <= cpus*sharedMaxMBPerCPU {
		return Guest{CPUKind: "shared", CPUs: cpus, MemoryMB: max(mem, cpus*sharedMinMBPerCPU)}, nil
	}
	if mem > cpus*perfMaxMBPerCPU {
		return Guest{}, fmt.Errorf("flymachines: create: %d MiB is more than %d vCPUs may have", mem, cpus)
	}
	return Guest{CPUKind: "performance", CPUs: cpus, MemoryMB: max(mem, cpus*perfMinMBPerCPU)}, nil
}

// Sizes are the standard tiers as Fly runs them: each with its vCPUs and
// the memory of its guest.
func Sizes() []sandgate.Size {
	out := make([]sandgate.Size, 0, len(sandgate.StandardSizes))
	for _, s := range sandgate.StandardSizes {
		g, err := guestFor(s)
		if err != nil {
			continue
		}
		out = append(out, sandgate.Size{Name: s.Name, CPUCores: g.CPUs, MemoryMiB: g.MemoryMB})
	}
	return out
}

// tierOf maps a size to its standard tier by name: the broker passes the
// provider's own size (vCPUs), and the guest is computed from the tier.
func tierOf(s sandgate.Size) sandgate.Size {
	if t, ok := sandgate.LookupSize(s.Name); ok {
		return t
	}
	return s
}

// decodeMachines reads a machine list: a bare array (the app list) or
// {machines, next_cursor} (the paginated shape).
func decodeMachines(b []byte) ([]Machine, string, error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, "", nil
	}
	if b[0] == '[' {
		var ms []Machine
		if err := json.Unmarshal(b, &ms); err != nil {
			return nil, "", errors.New("fly: list machines: undecodable answer")
		}
		return ms, "", nil
	}
	var l MachineList
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, "", errors.New("fly: list machines: undecodable answer")
	}
	return l.Machines, l.NextCursor, nil
}

// decodePolicies reads a policy list: a bare array, or an object with the
// array under any key.
func decodePolicies(b []byte) []NetworkPolicy {
	b = bytes.TrimSpace(b)
	var ps []NetworkPolicy
	if len(b) > 0 && b[0] == '[' {
		json.Unmarshal(b, &ps)
		return ps
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(b, &obj) != nil {
		return nil
	}
	for _, v := range obj {
		var more []NetworkPolicy
		if json.Unmarshal(v, &more) == nil {
			ps = append(ps, more...)
		}
	}
	return ps
}
