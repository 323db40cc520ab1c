package local

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestOwnCgroups: the broker's own cgroup in each hierarchy, found by
// its controller in /proc/self/cgroup's lists, under that hierarchy's
// mount; none at all when one is missing, so that a resident's thread is
// never sent home to only some of them.
func TestOwnCgroups(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"memory/box/a", "pids", "cpu,cpuacct/box"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mem, pids, cpu := filepath.Join(root, "memory"), filepath.Join(root, "pids"), filepath.Join(root, "cpu,cpuacct")
	const self = "12:pids:/\n4:cpu,cpuacct:/box\n3:memory:/box/a\n1:name=systemd:/user.slice\n0::/\n"
	for _, tc := range []struct {
		name        string
		self        string
		ctls, mount []string
		want        []string
	}{
		{"each found", self, []string{"memory", "pids", "cpu", "cpuacct"}, []string{mem, pids, cpu, cpu},
			[]string{filepath.Join(mem, "box/a"), pids, filepath.Join(cpu, "box"), filepath.Join(cpu, "box")}},
		{"a controller in no line", self, []string{"memory", "blkio"}, []string{mem, mem}, nil},
		{"a cgroup that is not there", "3:memory:/gone\n", []string{"memory"}, []string{mem}, nil},
		{"no file", "", []string{"memory"}, []string{mem}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "cgroup")
			if tc.self != "" {
				if err := os.WriteFile(file, []byte(tc.self), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := ownCgroups(file, tc.ctls, tc.mount); !slices.Equal(got, tc.want) {
				t.Errorf("ownCgroups = %q; want %q", got, tc.want)
			}
		})
	}
}
