package local

import "slices"

// CPU placement: a workspace is pinned to CPUs chosen once, when it is
// created, where the fewest live workspaces of this Provider are pinned
// already, and recorded with it (record.CPUs), so that every exec and
// command of it, from any broker process, runs on the same ones. A hash of
// the workspace id alone (what pickCPUs does, and still does for a
// workspace recorded before placement) piles several workspaces on one CPU
// while another is free, as often as the hash collides: three on two CPUs
// all share one a quarter of the time, so a neighbour's busy work lands on
// the CPU of an interactive exec that could have had one to itself. Ties
// go to the CPU the hash names, so an empty host spreads as before. The
// counts are this process's: workspaces another broker process created on
// the same data directory since this one started are not counted until
// it restarts, which only makes the placement less even, never wrong.

// placeCPUs chooses n CPUs for the new workspace ref and counts them.
func (p *Provider) placeCPUs(ref string, n int) []int {
	n = min(max(n, 1), len(p.cpus))
	p.placeMu.Lock()
	defer p.placeMu.Unlock()
	load := make(map[int]int, len(p.cpus))
	for _, cpus := range p.placed {
		for _, c := range cpus {
			load[c]++
		}
	}
	first := p.pickCPUs(ref, 1)[0]
	start := slices.Index(p.cpus, first)
	best, bestLoad := start, -1
	for k := range p.cpus {
		i := (start + k) % len(p.cpus)
		sum := 0
		for j := range n {
			sum += load[p.cpus[(i+j)%len(p.cpus)]]
		}
		if bestLoad < 0 || sum < bestLoad {
			best, bestLoad = i, sum
		}
	}
	cpus := make([]int, n)
	for j := range cpus {
		cpus[j] = p.cpus[(best+j)%len(p.cpus)]
	}
	p.placed[ref] = cpus
	return cpus
}

// notePlaced counts the CPUs of a live workspace found at startup.
func (p *Provider) notePlaced(ref string, rec record) {
	p.placeMu.Lock()
	defer p.placeMu.Unlock()
	p.placed[ref] = p.cpusOf(ref, rec)
}

// unplace stops counting ref's CPUs: it is terminated, or its create failed.
func (p *Provider) unplace(ref string) {
	p.placeMu.Lock()
	defer p.placeMu.Unlock()
	delete(p.placed, ref)
}

// cpusOf is the CPUs the workspace ref runs on: those recorded at its
// create while this host still offers them all, else (a workspace from
// before placement, or a host whose CPUs changed) the hash's.
func (p *Provider) cpusOf(ref string, rec record) []int {
	n := min(max(rec.CPUCores, 1), len(p.cpus))
	if len(rec.CPUs) == n && !slices.ContainsFunc(rec.CPUs, func(c int) bool { return !slices.Contains(p.cpus, c) }) {
		return slices.Clone(rec.CPUs)
	}
	return p.pickCPUs(ref, n)
}
