package local_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// TestUnprivileged: the sandbox's uid 0 is an unprivileged host uid, its
// own per workspace, and the workspace's files belong to it on the host.
func TestUnprivileged(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	p := newProvider(t, dataDir, broker)
	uids := map[int]bool{}
	for range 2 {
		sb := providertest.Create(t, p, providertest.Spec(t))
		res := providertest.Exec(t, p, sb, "sh", "-c", "cat /proc/self/uid_map; id -u; echo x > /workspace/made; mkdir /root/d")
		lines := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
		if res.ExitCode != 0 || len(lines) != 2 {
			t.Fatalf("uid_map and id -u: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
		}
		f := strings.Fields(lines[0])
		if len(f) != 3 || f[0] != "0" || f[2] != "1" {
			t.Fatalf("/proc/self/uid_map = %q; want one line mapping 0", lines[0])
		}
		host, _ := strconv.Atoi(f[1])
		if host == 0 || host < 65536 {
			t.Errorf("the sandbox's uid 0 is host uid %d; want an unprivileged uid (>= 65536)", host)
		}
		if lines[1] != "0" {
			t.Errorf("id -u in the sandbox = %q; want 0", lines[1])
		}
		uids[host] = true
		// The files are on the workspace's disk image: look at it from the
		// host, read-only, once the Provider no longer keeps it mounted.
		local.CloseMountNamespaces(p)
		mnt := t.TempDir()
		if out, err := exec.Command("mount", "-o", "loop,ro", filepath.Join(dataDir, "workspaces", sb.Ref, "disk.img"), mnt).CombinedOutput(); err != nil {
			t.Fatalf("mount the disk image: %v: %s", err, out)
		}
		t.Cleanup(func() { exec.Command("umount", mnt).Run() })
		for _, name := range []string{"workspace", "workspace/made", "home", "home/d", "tmp"} {
			fi, err := os.Stat(filepath.Join(mnt, name))
			if err != nil {
				t.Fatalf("stat %s: %v", name, err)
			}
			if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != host || int(st.Gid) != host {
				t.Errorf("%s on the host belongs to %d:%d; want %d:%d", name, st.Uid, st.Gid, host, host)
			}
		}
	}
	// No nested user namespace (the seccomp filter), not even by clone.
	sb := providertest.Create(t, p, providertest.Spec(t))
	for _, argv := range [][]string{{"unshare", "--user", "true"}, {"unshare", "--user", "--fork", "true"}} {
		if res := providertest.Exec(t, p, sb, argv...); res.ExitCode == 0 {
			t.Errorf("%v in the sandbox succeeded; want it refused", argv)
		}
	}
	if len(uids) != 2 {
		t.Errorf("two workspaces got host uids %v; want two different ones", uids)
	}
}

// TestFileHelpersIgnoreClientPath: the file helpers run with the broker's
// PATH, whatever PATH the workspace's env sets.
func TestFileHelpersIgnoreClientPath(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	spec := providertest.Spec(t)
	spec.Env = map[string]string{"PATH": "/workspace/evil:/usr/bin:/bin"}
	sb := providertest.Create(t, p, spec)
	// Fake tools that the helpers would run through the client's PATH.
	res := providertest.Exec(t, p, sb, "sh", "-c", `mkdir -p /workspace/evil && for t in cat wc mv mkdir rm chmod dd head; do printf '#!/bin/sh\ntouch /tmp/pwned\nexit 0\n' > /workspace/evil/$t; chmod +x /workspace/evil/$t; done`)
	if res.ExitCode != 0 {
		t.Fatalf("setting up the fake tools: exit %d: %s", res.ExitCode, res.Stderr)
	}
	if err := providers.WriteFileBytes(t.Context(), p, sb, "/workspace/f.txt", []byte("hello\n")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	got, err := providers.ReadFileBytes(t.Context(), p, sb, "/workspace/f.txt", 100)
	if err != nil || string(got) != "hello\n" {
		t.Errorf("ReadFile = %q, %v; want %q", got, err, "hello\n")
	}
	if res := providertest.Exec(t, p, sb, "/usr/bin/test", "-e", "/tmp/pwned"); res.ExitCode == 0 {
		t.Errorf("a file helper ran a tool from the client's PATH")
	}
}
