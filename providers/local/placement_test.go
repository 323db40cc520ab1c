package local

import (
	"fmt"
	"slices"
	"testing"
)

func TestPlaceCPUs(t *testing.T) {
	p := &Provider{cpus: []int{0, 1, 2, 3}, placed: make(map[string][]int)}
	load := func() map[int]int {
		m := map[int]int{}
		for _, cpus := range p.placed {
			for _, c := range cpus {
				m[c]++
			}
		}
		return m
	}
	// Eight one-core workspaces on four CPUs: two each, whatever their
	// ids hash to.
	for i := range 8 {
		p.placeCPUs(fmt.Sprintf("ws_%d", i), 1)
	}
	for c, n := range load() {
		if n != 2 {
			t.Errorf("CPU %d holds %d workspaces of 8 on 4 CPUs; want 2 each (%v)", c, n, p.placed)
		}
	}
	// Freeing two of CPU 2's: the next two land there.
	var on2 []string
	for ref, cpus := range p.placed {
		if cpus[0] == 2 {
			on2 = append(on2, ref)
		}
	}
	for _, ref := range on2 {
		p.unplace(ref)
	}
	for i := range 2 {
		if got := p.placeCPUs(fmt.Sprintf("ws_new%d", i), 1); !slices.Equal(got, []int{2}) {
			t.Errorf("after CPU 2 was freed, a new workspace got %v; want [2]", got)
		}
	}
	// A two-core workspace gets the least loaded pair of neighbours.
	p.unplace(on2[0])
	for ref, cpus := range p.placed {
		if cpus[0] == 3 {
			p.unplace(ref)
			break
		}
	}
	if got := p.placeCPUs("ws_two", 2); !slices.Equal(got, []int{2, 3}) {
		t.Errorf("two cores with CPUs 2 and 3 the least loaded: got %v; want [2 3]", got)
	}
	// More cores than the host has: all of them.
	if got := p.placeCPUs("ws_big", 8); len(got) != 4 {
		t.Errorf("eight cores on four CPUs: got %v; want all four", got)
	}
}

func TestCPUsOf(t *testing.T) {
	p := &Provider{cpus: []int{0, 1, 4, 5}, placed: make(map[string][]int)}
	for _, c := range []struct {
		name string
		rec  record
		want []int
	}{
		{"recorded", record{CPUCores: 2, CPUs: []int{4, 5}}, []int{4, 5}},
		{"from before placement", record{CPUCores: 1}, p.pickCPUs("ws_x", 1)},
		{"a CPU the host no longer offers", record{CPUCores: 1, CPUs: []int{3}}, p.pickCPUs("ws_x", 1)},
		{"cores changed", record{CPUCores: 2, CPUs: []int{4}}, p.pickCPUs("ws_x", 2)},
	} {
		if got := p.cpusOf("ws_x", c.rec); !slices.Equal(got, c.want) {
			t.Errorf("%s: cpusOf = %v; want %v", c.name, got, c.want)
		}
	}
}
