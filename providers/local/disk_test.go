package local_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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
	t.Cleanup(func() { providertest.Discard(p) })
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
// Terminate unmounts it, and Close does so for a workspace left running.
// The kernel then clears the loop device on its own time (a device
// prober such as udev may hold it open a moment longer), so the test
// waits for that rather than expecting it the instant the call returns.
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
	if n := settledLoops(t, dataDir, 1); n != 1 {
		t.Errorf("%d loop devices on the images after one Terminate; want 1", n)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if n := settledLoops(t, dataDir, 0); n != 0 {
		t.Errorf("%d loop devices on the images after Close; want none", n)
	}
}

// settledLoops waits, a bounded time, for the loop devices bound below
// dir to fall to want, and returns how many there are then.
func settledLoops(t *testing.T, dir string, want int) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := loopsUnder(t, dir)
		if n <= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(20 * time.Millisecond)
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

// TestCreateWaitsForRelease: a create short of room while a terminated
// workspace's image is still bound to a loop device (in the trash, its
// space not yet given back) waits for the release instead of refusing,
// and refuses once the wait's bound passes with the image still bound.
func TestCreateWaitsForRelease(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Fatalf("losetup not found (util-linux): %v", err)
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1024m,mode=0755"); err != nil {
		t.Fatalf("mount a tmpfs for the data directory: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	const quota, held = 64, 200
	// Room for a workspace only once the held image's space is back.
	reserve := freeMiB(t, dir) - quota - held/2
	p, err := local.New(t.Context(), local.Config{DataDir: dir, FreeReserveMiB: reserve,
		Tiers: map[string]local.Tier{"small": {DiskMiB: quota}}}, providers.Env{BrokerID: broker})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(p) })

	// hold binds a loop device to a filled image in the trash, as a
	// terminated workspace's is until the kernel releases it, and removes
	// the file: its space stays taken until detach is called.
	hold := func(name string) (detach func()) {
		t.Helper()
		img := filepath.Join(dir, "trash", name, "disk.img")
		if err := os.MkdirAll(filepath.Dir(img), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(img, make([]byte, held<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
		if err != nil {
			t.Fatalf("losetup: %v: %s", err, out)
		}
		dev := strings.TrimSpace(string(out))
		if err := os.RemoveAll(filepath.Dir(img)); err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		detach = func() {
			once.Do(func() {
				if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
					t.Errorf("losetup --detach %s: %v: %s", dev, err, out)
				}
			})
		}
		t.Cleanup(detach)
		return detach
	}

	detach := hold("ws_released")
	time.AfterFunc(200*time.Millisecond, detach)
	sb, err := p.Create(t.Context(), providertest.Spec(t))
	if err != nil {
		t.Fatalf("Create while a released image's space comes back = %v; want it to wait and succeed", err)
	}
	if err := p.Terminate(t.Context(), sb); err != nil {
		t.Fatal(err)
	}

	// An image that stays bound is waited for once, for the release
	// wait (shortened here), then given up on: creates are refused.
	local.SetReleaseWait(p, 300*time.Millisecond)
	hold("ws_stuck")
	for i := range 2 {
		if _, err := p.Create(t.Context(), providertest.Spec(t)); !errors.Is(err, providers.ErrNoCapacity) {
			t.Errorf("Create %d while an image stays bound = %v; want ErrNoCapacity once the wait ends", i, err)
		}
	}
}

// TestDiskImagesFromTemplate: every workspace's disk image is a copy of
// the data directory's one template of its size, made once, sparse like
// it; the sandbox's root owns /workspace, /root and /tmp, with their
// modes, in each, and what one workspace writes is in its image alone.
func TestDiskImagesFromTemplate(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	p := newProvider(t, dataDir, broker)
	a := providertest.Create(t, p, providertest.Spec(t))
	// New's probe made the template of its own 16 MiB image.
	tmpl := filepath.Join(dataDir, "templates", "ext4-"+strconv.Itoa(p.DiskMiB(providertest.Spec(t).Size))+"m.img")
	before, err := os.Stat(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	b := providertest.Create(t, p, providertest.Spec(t))
	after, err := os.Stat(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("the template was made again or written by the second create")
	}
	tmplBlocks := after.Sys().(*syscall.Stat_t).Blocks
	for _, sb := range []providers.Sandbox{a, b} {
		res := providertest.Exec(t, p, sb, "sh", "-c", "stat -c '%n %u %g %a' /workspace /root /tmp && echo "+sb.Ref+" > /root/mine && cat /root/mine")
		want := "/workspace 0 0 755\n/root 0 0 700\n/tmp 0 0 1777\n" + sb.Ref + "\n"
		if res.ExitCode != 0 || string(res.Stdout) != want {
			t.Errorf("in %s: exit %d, %q (stderr %q); want %q", sb.Ref, res.ExitCode, res.Stdout, res.Stderr, want)
		}
	}
	for _, sb := range []providers.Sandbox{a, b} {
		fi, err := os.Stat(filepath.Join(dataDir, "workspaces", sb.Ref, "disk.img"))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() != after.Size() {
			t.Errorf("image of %s: %d bytes; want the template's %d", sb.Ref, fi.Size(), after.Size())
		}
		// Its own blocks: the template's, the uid's inode updates, the
		// journal's first writes and the file above, never the whole disk.
		if blocks := fi.Sys().(*syscall.Stat_t).Blocks; blocks > tmplBlocks+(32<<20)/512 {
			t.Errorf("image of %s allocates %d KiB; want a sparse copy near the template's %d KiB", sb.Ref, blocks/2, tmplBlocks/2)
		}
	}
}

// A mounted image names the loop device it is bound to, so that a later
// mount finds it without looking at every loop device of the host.
func TestLoopHint(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	p := newProvider(t, dataDir, broker)
	spec := providertest.Spec(t)
	spec.Env = nil
	sb, err := p.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dataDir, "workspaces", sb.Ref, "disk.img")
	if res := providertest.Exec(t, p, sb, "true"); res.ExitCode != 0 {
		t.Fatalf("exec: exit %d", res.ExitCode)
	}
	buf := make([]byte, 16)
	n, err := unix.Getxattr(img, "user.sandgate.loop", buf)
	if err != nil {
		t.Fatalf("the image's loop hint: %v", err)
	}
	dev := "/sys/block/loop" + string(buf[:n]) + "/loop/backing_file"
	backing, err := os.ReadFile(dev)
	if err != nil {
		t.Fatalf("the loop device the hint names (%q): %v", buf[:n], err)
	}
	if got := strings.TrimSpace(string(backing)); got != img {
		t.Errorf("the hinted loop device is bound to %q; want the image %q", got, img)
	}
}
