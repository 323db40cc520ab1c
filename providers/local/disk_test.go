package local_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

func freeMiB(t *testing.T, dir string) int {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int(int64(st.Bavail) * int64(st.Bsize) >> 20)
}

// TestDiskQuota: /workspace, /root and /tmp share the tier's disk quota,
// and writing past it fails with ENOSPC inside the sandbox; the data
// directory's file system keeps its reserve, and a create that could eat
// into it is refused with ErrNoCapacity.
func TestDiskQuota(t *testing.T) {
	t.Parallel()
	// A file system of its own: the reserve below is measured against its
	// free space, which nothing else on this machine can then eat into.
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1536m,mode=0755"); err != nil {
		t.Fatalf("mount a tmpfs for the data directory: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	const quota = 256
	// A reserve that leaves room for one workspace grown full, not two.
	reserve := freeMiB(t, dir) - 400
	p, err := local.New(t.Context(), local.Config{DataDir: dir, FreeReserveMiB: reserve,
		Tiers: map[string]local.Tier{"small": {DiskMiB: quota}}}, providers.Env{BrokerID: broker})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { closeProvider(p) })
	if got := p.DiskMiB(providertest.Spec(t).Size); got != quota {
		t.Errorf("DiskMiB(small) = %d; want %d", got, quota)
	}
	sb := providertest.Create(t, p, providertest.Spec(t))

	// The one quota spans the three directories.
	res := providertest.Exec(t, p, sb, "sh", "-c", "head -c 100M /dev/zero > /tmp/a && head -c 100M /dev/zero > /root/b && head -c 100M /dev/zero > /workspace/c")
	if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "No space left on device") {
		t.Errorf("300 MiB over /tmp, /root, /workspace in a %d MiB quota: exit %d, %q; want ENOSPC", quota, res.ExitCode, res.Stderr)
	}
	if err := providers.WriteFileBytes(t.Context(), p, sb, "/workspace/more", make([]byte, 64<<20)); err == nil {
		t.Errorf("WriteFile past the quota succeeded")
	}
	if free := freeMiB(t, dir); free < reserve {
		t.Errorf("host free space %d MiB after a workspace filled its quota; want at least the reserve %d MiB", free, reserve)
	}
	// Freed space is usable again.
	if res := providertest.Exec(t, p, sb, "sh", "-c", "rm /tmp/a /root/b /workspace/c && head -c 100M /dev/zero > /workspace/c"); res.ExitCode != 0 {
		t.Errorf("writing after freeing space: exit %d, %s", res.ExitCode, res.Stderr)
	}

	// A second workspace would let the two eat into the reserve.
	_, err = p.Create(t.Context(), providertest.Spec(t))
	if !errors.Is(err, providers.ErrNoCapacity) {
		t.Errorf("Create past the reserve = %v; want ErrNoCapacity", err)
	}
	if err := p.Terminate(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	providertest.Create(t, p, providertest.Spec(t)) // room again
}

// TestImageNotLeftMounted: a workspace's image is mounted only in the
// Provider's own mount namespace, kept between execs, never on the host;
// Terminate unmounts it (its loop device is gone when Terminate returns),
// and Close does so for a workspace left running.
func TestImageNotLeftMounted(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	p := newProvider(t, dataDir, broker)
	sb1 := providertest.Create(t, p, providertest.Spec(t))
	sb2 := providertest.Create(t, p, providertest.Spec(t))
	for _, sb := range []providers.Sandbox{sb1, sb2} {
		if res := providertest.Exec(t, p, sb, "true"); res.ExitCode != 0 {
			t.Fatalf("exec: exit %d: %s", res.ExitCode, res.Stderr)
		}
	}
	if n := loopsUnder(t, dataDir); n != 2 {
		t.Errorf("%d loop devices on the images between execs; want 2 (kept mounted)", n)
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), "sandgate-stage") || strings.Contains(string(b), dataDir) {
		t.Errorf("a workspace's stage or image is mounted in the broker's own mount namespace:\n%s", b)
	}
	if err := p.Terminate(t.Context(), sb1); err != nil {
		t.Fatal(err)
	}
	if n := loopsUnder(t, dataDir); n != 1 {
		t.Errorf("%d loop devices on the images after one Terminate; want 1", n)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if n := loopsUnder(t, dataDir); n != 0 {
		t.Errorf("%d loop devices on the images after Close; want none", n)
	}
}

// loopsUnder counts the loop devices bound to a file below dir.
func loopsUnder(t *testing.T, dir string) int {
	t.Helper()
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	n := 0
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), dir+"/") {
			n++
		}
	}
	return n
}
