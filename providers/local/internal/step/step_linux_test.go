package step

import (
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestParse: the step refuses what the broker never sends (it exits with
// ExitUsage before anything runs) and reads what it does.
func TestParse(t *testing.T) {
	argv := []string{"--", "bwrap", "--args", "3", "--", "true"}
	tests := []struct {
		name string
		args string // before argv
		want *options
	}{
		{"minimal", "--fds 2", &options{nfds: 2, uid: -1, gid: -1, nsFD: -1}},
		{"everything", "--fds 2 --rlimit data=1048576 --rlimit core=0 --rlimit fsize=7 --cgroup /c/a --cgroup /c/b --uid 1001 --gid 1001 " +
			"--stage /s --bind /w w --bind /e e --disk /d.img --mount-bin /usr/bin/mount", &options{
			nfds: 2, cgroups: []string{"/c/a", "/c/b"}, uid: 1001, gid: 1001, nsFD: -1,
			rlimits: []Rlimit{{unix.RLIMIT_DATA, 1 << 20}, {unix.RLIMIT_CORE, 0}, {unix.RLIMIT_FSIZE, 7}},
			stage:   Stage{Dir: "/s", Binds: [][2]string{{"/w", "w"}, {"/e", "e"}}, Disk: "/d.img", MountBin: "/usr/bin/mount", DiskOwner: 1001},
		}},
		{"namespace", "--fds 2 --ns-fd 5 --uid 7 --gid 7", &options{nfds: 2, uid: 7, gid: 7, nsFD: 5}},
		{"no fds", "--uid 7 --gid 7", nil},
		{"uid without gid", "--fds 0 --uid 7", nil},
		{"negative fds", "--fds -1", nil},
		{"unknown option", "--fds 0 --privileged yes", nil},
		{"unknown rlimit", "--fds 0 --rlimit nproc=10", nil},
		{"bad rlimit", "--fds 0 --rlimit data=lots", nil},
		{"bind name with a slash", "--fds 0 --stage /s --bind /w ../w", nil},
		{"disk without mount", "--fds 0 --stage /s --disk /d.img", nil},
		{"disk without stage", "--fds 0 --disk /d.img --mount-bin /usr/bin/mount", nil},
		{"namespace and stage", "--fds 0 --ns-fd 5 --stage /s", nil},
		{"namespace among bwrap's descriptors", "--fds 3 --ns-fd 5", nil},
		{"namespace on stdio", "--fds 0 --ns-fd 2", nil},
		{"option without value", "--fds", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, got, ok := parse(append(strings.Fields(tt.args), argv...))
			if tt.want == nil {
				if ok {
					t.Fatalf("parse accepted it: %+v", o)
				}
				return
			}
			if !ok {
				t.Fatal("parse refused it")
			}
			if !reflect.DeepEqual(o, *tt.want) {
				t.Errorf("options = %+v; want %+v", o, *tt.want)
			}
			if !reflect.DeepEqual(got, argv[1:]) {
				t.Errorf("argv = %q; want %q", got, argv[1:])
			}
		})
	}
	if _, _, ok := parse([]string{"--fds", "0", "--"}); ok {
		t.Error("parse accepted an empty command")
	}
}
