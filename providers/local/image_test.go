package local_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// fakeImages hands out images made of directories the test built, and
// counts the pins it holds.
type fakeImages struct {
	mu     sync.Mutex
	images map[string]local.RootImage
	pinned map[string]int // digest → pins held
}

func (f *fakeImages) Acquire(ctx context.Context, ref string) (local.RootImage, func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	img, ok := f.images[ref]
	if !ok {
		return local.RootImage{}, nil, errors.New("no such image")
	}
	f.pinned[img.Digest]++
	var once sync.Once
	return img, func() {
		once.Do(func() {
			f.mu.Lock()
			f.pinned[img.Digest]--
			f.mu.Unlock()
		})
	}, nil
}

func (f *fakeImages) pins(digest string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pinned[digest]
}

// buildLayers makes two unpacked layers as the image store leaves them: a
// busybox base with an os-release and a file the top layer deletes (an
// overlay whiteout, a 0/0 character device) beside a marker of its own.
func buildLayers(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	base, top := filepath.Join(dir, "base"), filepath.Join(dir, "top")
	for _, d := range []string{"bin", "etc", "usr/bin", "root", "tmp", "workspace", "proc", "dev"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("busybox-static is needed (apt-get install busybox-static): %v", err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(base, "bin/busybox"), bb, 0o755))
	for _, name := range []string{"sh", "cat", "ls", "echo", "stat", "id", "rm", "mkdir", "env", "pwd", "true"} {
		must(os.Symlink("busybox", filepath.Join(base, "bin", name)))
	}
	must(os.WriteFile(filepath.Join(base, "etc/os-release"), []byte("ID=sandgate-test-image\n"), 0o644))
	must(os.WriteFile(filepath.Join(base, "etc/gone"), []byte("deleted above\n"), 0o644))
	must(os.WriteFile(filepath.Join(base, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nimageuser:x:0:0::/:/bin/sh\n"), 0o644))
	must(os.MkdirAll(filepath.Join(top, "etc"), 0o755))
	must(os.WriteFile(filepath.Join(top, "marker"), []byte("top layer\n"), 0o644))
	must(syscall.Mknod(filepath.Join(top, "etc/gone"), syscall.S_IFCHR, 0))
	return []string{base, top}
}

func newImageProvider(t *testing.T) (*local.Provider, *fakeImages, []string) {
	t.Helper()
	layers := buildLayers(t)
	img := local.RootImage{
		Digest: "sha256:" + strings.Repeat("ab", 32),
		Layers: layers,
		Env:    []string{"PATH=/bin:/usr/bin", "IMAGE_VAR=from-image", "SHARED=image"},
	}
	imgs := &fakeImages{
		images: map[string]local.RootImage{
			"registry.test/busybox:1":             img,
			"registry.test/busybox@" + img.Digest: img,
			"registry.test/nonroot:1":             {Digest: "sha256:" + strings.Repeat("cd", 32), Layers: layers, User: "1000"},
		},
		pinned: map[string]int{},
	}
	p, err := local.New(t.Context(), local.Config{DataDir: t.TempDir(), Images: imgs}, providers.Env{BrokerID: broker})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(p) })
	return p, imgs, layers
}

// sh runs script in sb and returns its stdout, failing on a non-zero exit.
func sh(t *testing.T, p *local.Provider, sb providers.Sandbox, script string) string {
	t.Helper()
	res, err := p.Exec(t.Context(), sb, providers.ExecSpec{Argv: []string{"sh", "-c", script}, MaxOutputBytes: 1 << 16})
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exec %q: exit %d, stderr %q", script, res.ExitCode, res.Stderr)
	}
	return string(res.Stdout)
}

func TestImageRoot(t *testing.T) {
	t.Parallel()
	p, imgs, layers := newImageProvider(t)
	digest := "sha256:" + strings.Repeat("ab", 32)

	specA := providertest.Spec(t)
	specA.Image = "registry.test/busybox:1" // by tag
	specA.Env = map[string]string{"SHARED": "workspace"}
	a := providertest.Create(t, p, specA)
	specB := providertest.Spec(t)
	specB.Image = "registry.test/busybox@" + digest // by digest
	b := providertest.Create(t, p, specB)

	// The image's content, not the host's.
	if got := sh(t, p, a, "cat /etc/os-release /marker"); got != "ID=sandgate-test-image\ntop layer\n" {
		t.Errorf("os-release and marker = %q; want the image's", got)
	}
	if got := sh(t, p, a, "ls /etc/gone 2>&1 || echo absent"); !strings.HasSuffix(got, "absent\n") {
		t.Errorf("a file the top layer whited out: %q; want it absent", got)
	}
	// The image's files belong to the sandbox's root; the image's passwd
	// is kept, the generated hosts is bound over it.
	if got := sh(t, p, a, "stat -c %u:%g /bin/busybox /etc; id -u"); got != "0:0\n0:0\n0\n" {
		t.Errorf("owners in the image = %q; want root's", got)
	}
	if got := sh(t, p, a, "cat /etc/passwd; cat /etc/hosts"); !strings.Contains(got, "imageuser") || !strings.Contains(got, "sandbox") {
		t.Errorf("/etc = %q; want the image's passwd and the generated hosts", got)
	}
	// The image's Env under the workspace's; no dir: /workspace.
	if got := sh(t, p, a, `echo "$IMAGE_VAR $SHARED $PATH"; pwd`); got != "from-image workspace /bin:/usr/bin\n/workspace\n" {
		t.Errorf("env and dir = %q", got)
	}

	// Root writes under /usr: into the workspace's own layer only.
	sh(t, p, a, "mkdir -p /usr/local/lib && echo installed > /usr/local/lib/pkg && echo x > /etc/os-release")
	if got := sh(t, p, a, "cat /usr/local/lib/pkg /etc/os-release"); got != "installed\nx\n" {
		t.Errorf("written files = %q", got)
	}
	if got := sh(t, p, b, "cat /etc/os-release; test -e /usr/local/lib/pkg && echo present || echo absent"); got != "ID=sandgate-test-image\nabsent\n" {
		t.Errorf("the other workspace on the image sees %q; want the image's files", got)
	}
	if raw, err := os.ReadFile(filepath.Join(layers[0], "etc/os-release")); err != nil || string(raw) != "ID=sandgate-test-image\n" {
		t.Errorf("the cached layer's os-release = %q, %v; want it unchanged", raw, err)
	}
	if _, err := os.Stat(filepath.Join(layers[0], "usr/local")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a write in the sandbox reached the cached layer: %v", err)
	}
	// The write survives the workspace's namespace: it is on its disk.
	p.Close()
	p2, err := local.New(t.Context(), local.Config{DataDir: p.DataDir(), Images: imgs}, providers.Env{BrokerID: broker})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { providertest.Discard(p2) })
	if got := sh(t, p2, a, "cat /usr/local/lib/pkg"); got != "installed\n" {
		t.Errorf("after a restart /usr/local/lib/pkg = %q", got)
	}

	// Both run on one unpacked copy, and the record keeps the digest.
	for _, sb := range []providers.Sandbox{a, b} {
		var rec struct {
			Image struct {
				Digest string   `json:"digest"`
				Layers []string `json:"layers"`
			} `json:"image"`
		}
		raw, err := os.ReadFile(filepath.Join(p.DataDir(), "workspaces", sb.Ref, "sandbox.json"))
		if err == nil {
			err = json.Unmarshal(raw, &rec)
		}
		if err != nil || rec.Image.Digest != digest || !slices.Equal(rec.Image.Layers, layers) {
			t.Errorf("%s's record: image %+v, %v; want digest %s on the shared layers", sb.Ref, rec.Image, err, digest)
		}
	}
	if n := imgs.pins(digest); n < 2 {
		t.Errorf("pins on the image with two live workspaces = %d; want at least 2", n)
	}
	for _, sb := range []providers.Sandbox{a, b} {
		if err := p2.Terminate(t.Context(), sb); err != nil {
			t.Fatal(err)
		}
		p.Terminate(t.Context(), sb)
	}
	if n := imgs.pins(digest); n != 0 {
		t.Errorf("pins on the image once its workspaces are gone = %d; want 0", n)
	}
}

func TestImageRefusals(t *testing.T) {
	t.Parallel()
	p, imgs, _ := newImageProvider(t)
	spec := providertest.Spec(t)
	spec.Image = "registry.test/nonroot:1"
	if sb, err := p.Create(t.Context(), spec); !errors.Is(err, local.ErrImageUser) {
		p.Terminate(context.Background(), sb)
		t.Errorf("Create on an image with a non-root user = %v; want ErrImageUser", err)
	}
	spec.Image = "registry.test/missing:1"
	if sb, err := p.Create(t.Context(), spec); err == nil {
		p.Terminate(context.Background(), sb)
		t.Errorf("Create on a missing image = nil error")
	}
	if n := imgs.pins("sha256:" + strings.Repeat("cd", 32)); n != 0 {
		t.Errorf("pins left by refused creates = %d; want 0", n)
	}
	// The host image stays as it was.
	sb := providertest.Create(t, p, providertest.Spec(t))
	if got := sh(t, p, sb, "test -e /usr/bin/env && echo host"); got != "host\n" {
		t.Errorf("a host workspace's /usr = %q", got)
	}
}

// TestImageDurableCommand checks that a durable command on an image
// workspace runs on the image's root, in the workspace's own layer, as an
// exec does: not on the host's /usr.
func TestImageDurableCommand(t *testing.T) {
	t.Parallel()
	p, _, _ := newImageProvider(t)
	spec := providertest.Spec(t)
	spec.Image = "registry.test/busybox:1"
	sb := providertest.Create(t, p, spec)
	sh(t, p, sb, "mkdir -p /usr/local/lib && echo installed > /usr/local/lib/pkg")
	err := p.StartCommand(t.Context(), sb, "on-image", providers.ExecSpec{
		Argv:    []string{"sh", "-c", `cat /etc/os-release /marker /usr/local/lib/pkg; echo "$IMAGE_VAR"; pwd; echo durable > /usr/local/lib/from-command`},
		Timeout: time.Minute, MaxOutputBytes: 1 << 10,
	})
	if err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
	st := providertest.WaitCommand(t, p, sb, "on-image", 1<<10)
	want := "ID=sandgate-test-image\ntop layer\ninstalled\nfrom-image\n/workspace\n"
	if st.State != providers.CommandCompleted || st.ExitCode != 0 || string(st.Stdout) != want {
		t.Errorf("durable command on the image = %q exit %d stdout %q stderr %q; want completed 0 %q", st.State, st.ExitCode, st.Stdout, st.Stderr, want)
	}
	if got := sh(t, p, sb, "cat /usr/local/lib/from-command"); got != "durable\n" {
		t.Errorf("what the command wrote under /usr, seen by an exec = %q", got)
	}
}

// shellOnlyLayer makes one unpacked layer that holds the host's dash
// and the C library it needs, and no other program: no tar, no gzip.
func shellOnlyLayer(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "sh")
	for _, d := range []string{"bin", "lib/x86_64-linux-gnu", "lib64", "etc", "root", "tmp", "workspace", "proc", "dev"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for src, dst := range map[string]string{
		"/bin/dash":                       "bin/sh",
		"/lib/x86_64-linux-gnu/libc.so.6": "lib/x86_64-linux-gnu/libc.so.6",
		"/lib64/ld-linux-x86-64.so.2":     "lib64/ld-linux-x86-64.so.2",
	} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Skipf("no %s to build a shell-only image from: %v", src, err)
		}
		if err := os.WriteFile(filepath.Join(dir, dst), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "etc/os-release"), []byte("ID=shell-only\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestImageSnapshot checks that a snapshot of an image workspace's
// directory, and its restore into another, work on an image that has a
// shell and nothing else: the snapshot helpers run on the broker's tools.
func TestImageSnapshot(t *testing.T) {
	t.Parallel()
	p, imgs, _ := newImageProvider(t)
	imgs.mu.Lock()
	imgs.images["registry.test/shonly:1"] = local.RootImage{Digest: "sha256:" + strings.Repeat("ef", 32), Layers: []string{shellOnlyLayer(t)}}
	imgs.mu.Unlock()
	spec := providertest.Spec(t)
	spec.Image = "registry.test/shonly:1"
	a := providertest.Create(t, p, spec)
	if got := sh(t, p, a, "command -v tar gzip mkdir || echo none"); got != "none\n" {
		t.Fatalf("the test image has tools of its own: %q", got)
	}
	sh(t, p, a, "cd /workspace && echo kept > file")
	ref, err := p.Snapshot(t.Context(), a, providers.SnapshotSpec{ID: "snapimg" + a.Ref, Dir: "/workspace"})
	if err != nil {
		t.Fatalf("Snapshot of an image workspace: %v", err)
	}
	t.Cleanup(func() { p.DeleteSnapshot(context.Background(), ref) })

	b := warmStart(t, p, spec.Image, ref)
	if got := sh(t, p, b, "read l < /workspace/file; read o < /etc/os-release; echo $l $o"); got != "kept ID=shell-only\n" {
		t.Errorf("restored workspace = %q; want the file back, on the image", got)
	}
}

// warmStart creates a workspace on image and restores ref's /workspace
// into it, as an acquire with a snapshot_id does.
func warmStart(t *testing.T, p *local.Provider, image string, ref providers.SnapshotRef) providers.Sandbox {
	t.Helper()
	spec := providertest.Spec(t)
	spec.Image = image
	sb := providertest.Create(t, p, spec)
	if err := p.Restore(t.Context(), sb, ref, "/workspace"); err != nil {
		t.Fatalf("Restore into a workspace on %s: %v", image, err)
	}
	return sb
}

// TestImageWarmStartSameDigest checks that a restore into a workspace on
// the image's tag runs on the digest the snapshot was taken on, after the
// tag moved to another digest; and fails when that digest is gone.
func TestImageWarmStartSameDigest(t *testing.T) {
	t.Parallel()
	p, imgs, _ := newImageProvider(t)
	digest := "sha256:" + strings.Repeat("ab", 32)
	spec := providertest.Spec(t)
	spec.Image = "registry.test/busybox:1"
	a := providertest.Create(t, p, spec)
	sh(t, p, a, "echo kept > /workspace/file")
	ref, err := p.Snapshot(t.Context(), a, providers.SnapshotSpec{ID: "snapdg" + a.Ref, Dir: "/workspace"})
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	t.Cleanup(func() { p.DeleteSnapshot(context.Background(), ref) })

	// The tag moves on to another image.
	moved := local.RootImage{Digest: "sha256:" + strings.Repeat("ef", 32), Layers: []string{shellOnlyLayer(t)}}
	imgs.mu.Lock()
	imgs.images["registry.test/busybox:1"] = moved
	imgs.mu.Unlock()

	b := warmStart(t, p, spec.Image, ref)
	if got := sh(t, p, b, "cat /workspace/file /etc/os-release"); got != "kept\nID=sandgate-test-image\n" {
		t.Errorf("warm start after the tag moved = %q; want the snapshot's files on the snapshot's image", got)
	}
	var rec struct {
		Image struct {
			Ref    string `json:"ref"`
			Digest string `json:"digest"`
		} `json:"image"`
	}
	readJSONFile(t, filepath.Join(p.DataDir(), "workspaces", b.Ref, "sandbox.json"), &rec)
	if rec.Image.Digest != digest || rec.Image.Ref != spec.Image {
		t.Errorf("restored workspace's record = %+v; want %s on digest %s", rec.Image, spec.Image, digest)
	}
	if n := imgs.pins(moved.Digest); n != 0 {
		t.Errorf("pins left on the tag's new digest = %d; want 0", n)
	}

	// The snapshot's digest can no longer be had: the restore fails.
	imgs.mu.Lock()
	delete(imgs.images, "registry.test/busybox@"+digest)
	imgs.mu.Unlock()
	specC := providertest.Spec(t)
	specC.Image = spec.Image
	c := providertest.Create(t, p, specC)
	if err := p.Restore(t.Context(), c, ref, "/workspace"); err == nil {
		t.Errorf("Restore onto an image digest that is gone = nil error")
	}
}
