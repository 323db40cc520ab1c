package images_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/images"
	"github.com/sandgate/sandgate/images/imagestest"
)

// open opens a store reaching host over plain HTTP, logging into log when
// not nil.
func open(t *testing.T, dir, host string, edit func(*images.Config)) *images.Store {
	t.Helper()
	cfg := images.Config{Dir: dir, Insecure: []string{host}}
	if edit != nil {
		edit(&cfg)
	}
	s, err := images.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// counter counts the registry's manifest and blob requests by path.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && (strings.Contains(r.URL.Path, "/manifests/") || strings.Contains(r.URL.Path, "/blobs/")) {
			c.mu.Lock()
			if c.n == nil {
				c.n = make(map[string]int)
			}
			c.n[r.URL.Path]++
			c.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})
}

func (c *counter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

func (c *counter) reset() {
	c.mu.Lock()
	c.n = nil
	c.mu.Unlock()
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestPullByTagAndByDigest(t *testing.T) {
	var c counter
	host := imagestest.Registry(t, c.wrap)
	img := imagestest.Image(t, v1.Config{Env: []string{"PATH=/bin", "GREETING=hi"}, WorkingDir: "/work", User: "1000:1000", Cmd: []string{"sh"}},
		imagestest.BusyboxLayer(t, "sandgate-test"))
	digest := imagestest.Push(t, host+"/test/busybox:1", img)
	s := open(t, t.TempDir(), host, nil)
	ctx := context.Background()

	var lines []string
	got, err := s.Pull(ctx, host+"/test/busybox:1", func(l string) { lines = append(lines, l) })
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != digest {
		t.Errorf("Pull digest = %s, want %s", got.Digest, digest)
	}
	if len(got.Layers) != 1 {
		t.Fatalf("Layers = %v, want 1", got.Layers)
	}
	if os := readFile(t, filepath.Join(got.Layers[0], "etc/os-release")); os != "ID=sandgate-test\n" {
		t.Errorf("os-release = %q", os)
	}
	if fi, err := os.Stat(filepath.Join(got.Layers[0], "bin/busybox")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("bin/busybox: %v, %v", fi, err)
	}
	if l, err := os.Readlink(filepath.Join(got.Layers[0], "bin/sh")); err != nil || l != "busybox" {
		t.Errorf("bin/sh -> %q, %v", l, err)
	}
	if got.Config.WorkingDir != "/work" || got.Config.User != "1000:1000" || len(got.Config.Env) != 2 || got.Config.Cmd[0] != "sh" {
		t.Errorf("Config = %+v", got.Config)
	}
	if got.Size < 100_000 {
		t.Errorf("Size = %d, want busybox's bytes at least", got.Size)
	}
	if len(lines) == 0 {
		t.Error("no progress lines")
	}

	// By digest: the same unpacked image, with no registry call.
	c.reset()
	byDigest, err := s.Pull(ctx, host+"/test/busybox@"+digest, nil)
	if err != nil {
		t.Fatal(err)
	}
	if byDigest.Digest != digest || byDigest.Layers[0] != got.Layers[0] {
		t.Errorf("by digest = %+v, want the tag's image", byDigest)
	}
	if n := c.snapshot(); len(n) != 0 {
		t.Errorf("cached pull fetched %v", n)
	}
	if d, err := s.Resolve(ctx, host+"/test/busybox:1"); err != nil || d != digest {
		t.Errorf("Resolve = %s, %v", d, err)
	}

	// By digest into a fresh store: fetched by digest.
	s2 := open(t, t.TempDir(), host, nil)
	if got, err := s2.Pull(ctx, host+"/test/busybox@"+digest, nil); err != nil || got.Digest != digest {
		t.Fatalf("fresh pull by digest = %+v, %v", got, err)
	}
	if _, err := s2.Pull(ctx, host+"/test/missing:1", nil); !errors.Is(err, images.ErrNotFound) {
		t.Errorf("missing image: err = %v, want ErrNotFound", err)
	}
}

// overlay mounts layers (bottom first) read-only at a new dir.
func overlay(t *testing.T, layers []string) string {
	t.Helper()
	mnt := t.TempDir()
	lower := make([]string, len(layers))
	for i, l := range layers {
		lower[len(layers)-1-i] = l
	}
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(lower, ":")); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	return mnt
}

func TestWhiteoutsBecomeOverlayForm(t *testing.T) {
	host := imagestest.Registry(t, nil)
	base := imagestest.Layer(t,
		imagestest.File{Name: "etc/keep", Body: "keep"},
		imagestest.File{Name: "etc/gone", Body: "gone"},
		imagestest.File{Name: "opt/d/", Typeflag: tar.TypeDir},
		imagestest.File{Name: "opt/d/old", Body: "old"},
	)
	upper := imagestest.Layer(t,
		imagestest.File{Name: "etc/.wh.gone"},
		imagestest.File{Name: "opt/d/", Typeflag: tar.TypeDir},
		imagestest.File{Name: "opt/d/.wh..wh..opq"},
		imagestest.File{Name: "opt/d/new", Body: "new"},
	)
	imagestest.Push(t, host+"/test/wh:1", imagestest.Image(t, v1.Config{}, base, upper))
	s := open(t, t.TempDir(), host, nil)
	img, err := s.Pull(context.Background(), host+"/test/wh:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(img.Layers[1], "etc/gone"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 || st.Uid != 0 || st.Gid != 0 {
		t.Errorf("whiteout: mode %o rdev %d owner %d:%d, want a 0/0 char device owned by root", st.Mode, st.Rdev, st.Uid, st.Gid)
	}
	if _, err := os.Lstat(filepath.Join(img.Layers[1], "etc/.wh.gone")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf(".wh.gone kept: %v", err)
	}
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(filepath.Join(img.Layers[1], "opt/d"), "trusted.overlay.opaque", buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Errorf("opaque xattr = %q, %v", buf[:n], err)
	}

	root := overlay(t, img.Layers)
	if got := readFile(t, filepath.Join(root, "etc/keep")); got != "keep" {
		t.Errorf("etc/keep = %q", got)
	}
	if _, err := os.Lstat(filepath.Join(root, "etc/gone")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("whited-out etc/gone is visible: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(root, "opt/d/old")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("opt/d/old under an opaque dir is visible: %v", err)
	}
	if got := readFile(t, filepath.Join(root, "opt/d/new")); got != "new" {
		t.Errorf("opt/d/new = %q", got)
	}
}

func TestSpecialFilesAndOwnership(t *testing.T) {
	host := imagestest.Registry(t, nil)
	l := imagestest.Layer(t,
		imagestest.File{Name: "usr/bin/tool", Body: "#!/bin/sh\n", Mode: 0o4755, Uid: 1234, Gid: 5678},
		imagestest.File{Name: "usr/bin/tool2", Typeflag: tar.TypeLink, Linkname: "usr/bin/tool"},
		imagestest.File{Name: "usr/bin/ping", Body: "elf", Mode: 0o755, Uid: 3, Xattrs: map[string]string{
			"security.capability":      string(netBindCap),
			"trusted.overlay.opaque":   "y",
			"trusted.overlay.redirect": "/etc",
		}},
		imagestest.File{Name: "etc/abs", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd", Uid: 7},
		imagestest.File{Name: "dev/null", Typeflag: tar.TypeChar, Mode: 0o666},
		imagestest.File{Name: "run/fifo", Typeflag: tar.TypeFifo, Mode: 0o600, Uid: 9, Gid: 9},
		imagestest.File{Name: "home/u/", Typeflag: tar.TypeDir, Mode: 0o700, Uid: 1000, Gid: 1000},
	)
	imagestest.Push(t, host+"/test/special:1", imagestest.Image(t, v1.Config{}, l))
	s := open(t, t.TempDir(), host, nil)
	img, err := s.Pull(context.Background(), host+"/test/special:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := img.Layers[0]
	stat := func(p string) unix.Stat_t {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, p), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	tool, tool2 := stat("usr/bin/tool"), stat("usr/bin/tool2")
	if tool.Ino != tool2.Ino || tool.Nlink != 2 {
		t.Errorf("hard link: inodes %d/%d nlink %d, want one inode linked twice", tool.Ino, tool2.Ino, tool.Nlink)
	}
	if tool.Uid != 1234 || tool.Gid != 5678 || tool.Mode&0o7777 != 0o4755 {
		t.Errorf("tool: owner %d:%d mode %o, want 1234:5678 4755", tool.Uid, tool.Gid, tool.Mode&0o7777)
	}
	if tool.Mtim.Sec != 1704164645 {
		t.Errorf("tool mtime = %d, want the tar's", tool.Mtim.Sec)
	}
	buf := make([]byte, 64)
	if n, err := unix.Lgetxattr(filepath.Join(dir, "usr/bin/ping"), "security.capability", buf); err != nil || string(buf[:n]) != string(netBindCap) {
		t.Errorf("ping's file capability = %x, %v, want %x", buf[:n], err, netBindCap)
	}
	if n, _ := unix.Llistxattr(filepath.Join(dir, "usr/bin/ping"), buf); strings.Contains(string(buf[:n]), "trusted.") {
		t.Errorf("ping has the image's trusted.* xattrs: %q", buf[:n])
	}
	if l, err := os.Readlink(filepath.Join(dir, "etc/abs")); err != nil || l != "/etc/passwd" {
		t.Errorf("etc/abs -> %q, %v", l, err)
	}
	if st := stat("etc/abs"); st.Uid != 7 {
		t.Errorf("symlink owner = %d, want 7", st.Uid)
	}
	if st := stat("dev/null"); st.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Errorf("dev/null mode = %o, want a char device", st.Mode)
	}
	if st := stat("run/fifo"); st.Mode&unix.S_IFMT != unix.S_IFIFO || st.Uid != 9 {
		t.Errorf("run/fifo mode = %o uid %d", st.Mode, st.Uid)
	}
	if st := stat("home/u"); st.Mode&0o7777 != 0o700 || st.Uid != 1000 {
		t.Errorf("home/u mode %o uid %d", st.Mode&0o7777, st.Uid)
	}
}

// netBindCap is a VFS_CAP_REVISION_2 file capability with
// CAP_NET_BIND_SERVICE permitted and effective.
var netBindCap = []byte{1, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

func TestLayerCannotEscape(t *testing.T) {
	outside := t.TempDir()
	for _, tc := range []struct {
		name  string
		files []imagestest.File
	}{
		{"dotdot", []imagestest.File{{Name: "a/../../../" + strings.TrimPrefix(outside, "/") + "/evil", Body: "x"}}},
		{"through symlink", []imagestest.File{
			{Name: "link", Typeflag: tar.TypeSymlink, Linkname: outside},
			{Name: "link/evil", Body: "x"},
		}},
		{"hard link out", []imagestest.File{{Name: "h", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := imagestest.Registry(t, nil)
			imagestest.Push(t, host+"/test/evil:1", imagestest.Image(t, v1.Config{}, imagestest.Layer(t, tc.files...)))
			dir := t.TempDir()
			s := open(t, dir, host, nil)
			if _, err := s.Pull(context.Background(), host+"/test/evil:1", nil); err == nil {
				t.Fatal("Pull succeeded")
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Errorf("wrote outside the layer: %v", ents)
			}
			if ents, _ := os.ReadDir(filepath.Join(dir, "layers")); len(ents) != 0 {
				t.Errorf("a failed layer was kept: %v", ents)
			}
			if l := s.List(); len(l) != 0 {
				t.Errorf("List = %v after a failed pull", l)
			}
		})
	}
}

func TestConcurrentPullsFetchOnce(t *testing.T) {
	var c counter
	host := imagestest.Registry(t, c.wrap)
	img := imagestest.Image(t, v1.Config{}, imagestest.BusyboxLayer(t, "x"), imagestest.Layer(t, imagestest.File{Name: "extra", Body: "e"}))
	imagestest.Push(t, host+"/test/once:1", img)
	c.reset()
	s := open(t, t.TempDir(), host, nil)

	const n = 10
	var wg sync.WaitGroup
	errs := make([]error, n)
	digests := make([]string, n)
	for i := range n {
		wg.Go(func() {
			var got images.Image
			if i%2 == 0 {
				got, errs[i] = s.Pull(context.Background(), host+"/test/once:1", nil)
			} else {
				var release func()
				got, release, errs[i] = s.Acquire(context.Background(), host+"/test/once:1")
				defer release()
			}
			digests[i] = got.Digest
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || digests[i] == "" {
			t.Fatalf("pull %d: %q, %v", i, digests[i], errs[i])
		}
	}
	got := c.snapshot()
	// One manifest (by tag), one config blob, two layer blobs.
	if len(got) != 4 {
		t.Errorf("fetched %v, want the manifest, config and two layers", got)
	}
	for p, k := range got {
		if k != 1 {
			t.Errorf("%s fetched %d times, want once", p, k)
		}
	}
}

func TestCredentialsAreUsedAndNeverLogged(t *testing.T) {
	const user, password = "robot", "s3cret-Passw0rd"
	auth := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != user || p != password {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	host := imagestest.Registry(t, auth)
	digest := imagestest.Push(t, host+"/private/img:1", imagestest.Image(t, v1.Config{}, imagestest.BusyboxLayer(t, "private")),
		remoteAuth(user, password)...)

	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	dockerConfig := writeConfig(t, host, user+":"+password)
	encoded := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	ctx := context.Background()

	cases := map[string]func(*images.Config){
		"docker config.json": func(c *images.Config) { c.DockerConfig = dockerConfig },
		"per registry": func(c *images.Config) {
			c.Registries = map[string]images.Credential{host: {Username: user, Password: password}}
		},
		"per registry over a wrong config.json": func(c *images.Config) {
			c.DockerConfig = writeConfig(t, host, "robot:wrong")
			c.Registries = map[string]images.Credential{host: {Username: user, Password: password}}
		},
	}
	for name, edit := range cases {
		t.Run(name, func(t *testing.T) {
			s := open(t, t.TempDir(), host, func(c *images.Config) { edit(c); c.Log = log })
			var progress []string
			img, err := s.Pull(ctx, host+"/private/img:1", func(l string) { progress = append(progress, l) })
			if err != nil {
				t.Fatal(err)
			}
			if img.Digest != digest {
				t.Errorf("digest = %s, want %s", img.Digest, digest)
			}
			if p := strings.Join(progress, "\n"); strings.Contains(p, password) || strings.Contains(p, encoded) {
				t.Errorf("progress shows the credentials: %s", p)
			}
		})
	}

	s := open(t, t.TempDir(), host, func(c *images.Config) {
		c.Log = log
		c.Registries = map[string]images.Credential{host: {Username: user, Password: "wrong-" + password}}
	})
	_, err := s.Pull(ctx, host+"/private/img:1", nil)
	if !errors.Is(err, images.ErrUnauthorized) {
		t.Fatalf("wrong password: err = %v, want ErrUnauthorized", err)
	}
	if !strings.Contains(err.Error(), host) || strings.Contains(err.Error(), password) {
		t.Errorf("error %q should name the host and not the password", err)
	}
	anon := open(t, t.TempDir(), host, nil)
	if _, err := anon.Pull(ctx, host+"/private/img:1", nil); !errors.Is(err, images.ErrUnauthorized) {
		t.Errorf("no credentials: err = %v, want ErrUnauthorized", err)
	}
	if !strings.Contains(logs.String(), "images: pulled") {
		t.Errorf("logs have no pull line:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), password) || strings.Contains(logs.String(), encoded) {
		t.Errorf("logs show the credentials:\n%s", logs.String())
	}
}

func writeConfig(t *testing.T, host, userPass string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.json")
	encoded := base64.StdEncoding.EncodeToString([]byte(userPass))
	if err := os.WriteFile(p, fmt.Appendf(nil, `{"auths":{%q:{"auth":%q}}}`, host, encoded), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCorruptBlobFails(t *testing.T) {
	layer := imagestest.Layer(t, imagestest.File{Name: "data", Body: strings.Repeat("sandgate ", 1000)})
	ld, err := layer.Digest()
	if err != nil {
		t.Fatal(err)
	}
	var corrupt sync.Map
	host := imagestest.Registry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, on := corrupt.Load(true); !on || r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+ld.String()) {
				h.ServeHTTP(w, r)
				return
			}
			rec := &recorder{header: http.Header{}}
			h.ServeHTTP(rec, r)
			b := rec.body.Bytes()
			// The gzip header's mtime: the stream still inflates to the
			// same tar, so only the digest check can catch it.
			b[4] ^= 0xff
			for k, v := range rec.header {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.code)
			w.Write(b)
		})
	})
	imagestest.Push(t, host+"/test/corrupt:1", imagestest.Image(t, v1.Config{}, layer))
	corrupt.Store(true, true)
	dir := t.TempDir()
	s := open(t, dir, host, nil)
	_, err = s.Pull(context.Background(), host+"/test/corrupt:1", nil)
	if err == nil {
		t.Fatal("Pull of a corrupt blob succeeded")
	}
	if !strings.Contains(err.Error(), "checksum") {
		t.Errorf("err = %v, want a digest mismatch", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "layers")); len(ents) != 0 {
		t.Errorf("corrupt layer kept: %v", ents)
	}
	if l := s.List(); len(l) != 0 {
		t.Errorf("List = %v", l)
	}
}

type recorder struct {
	header http.Header
	body   bytes.Buffer
	code   int
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *recorder) WriteHeader(code int)        { r.code = code }

func TestMaxImageBytesRefuses(t *testing.T) {
	var c counter
	host := imagestest.Registry(t, c.wrap)
	imagestest.Push(t, host+"/test/big:1", imagestest.Image(t, v1.Config{}, imagestest.RandomLayer(t, 64<<10)))
	c.reset()
	s := open(t, t.TempDir(), host, func(c *images.Config) { c.MaxImageBytes = 32 << 10 })
	_, err := s.Pull(context.Background(), host+"/test/big:1", nil)
	if !errors.Is(err, images.ErrTooLarge) {
		t.Fatalf("err = %v, want ErrTooLarge", err)
	}
	for p := range c.snapshot() {
		if strings.Contains(p, "/blobs/") {
			t.Errorf("fetched %s of an image over the bound", p)
		}
	}
}

// pushSized pushes an image of the given layers and returns its ref.
func pushSized(t *testing.T, host, repo string, layers ...v1.Layer) string {
	ref := host + "/test/" + repo + ":1"
	imagestest.Push(t, ref, imagestest.Image(t, v1.Config{}, layers...))
	return ref
}

func TestBoundEvictsUnusedImages(t *testing.T) {
	host := imagestest.Registry(t, nil)
	file := func(name string, n int) v1.Layer {
		return imagestest.Layer(t, imagestest.File{Name: name, Body: strings.Repeat("x", n)})
	}
	base := file("base", 500)
	a := pushSized(t, host, "a", base, file("a", 1000))
	b := pushSized(t, host, "b", base, file("b", 1000))
	c := pushSized(t, host, "c", file("c", 1000))
	s := open(t, t.TempDir(), host, func(c *images.Config) { c.MaxBytes = 2800 })
	ctx := context.Background()

	imgA, release, err := s.Acquire(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	imgB, err := s.Pull(ctx, b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if imgA.Layers[0] != imgB.Layers[0] {
		t.Errorf("shared base layer unpacked twice: %s, %s", imgA.Layers[0], imgB.Layers[0])
	}
	if _, err := s.Pull(ctx, c, nil); err != nil {
		t.Fatal(err)
	}
	// 500 + 1000 (a) + 1000 (b) + 1000 (c) > 2800: b, the unused one, goes.
	var refs []string
	for _, e := range s.List() {
		refs = append(refs, e.Ref)
	}
	if len(refs) != 2 || !slices.Contains(refs, a) || !slices.Contains(refs, c) {
		t.Errorf("List = %v, want %s (acquired) and %s (newest)", refs, a, c)
	}
	if _, err := os.Stat(imgB.Layers[1]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("evicted image's own layer kept: %v", err)
	}
	for _, l := range imgA.Layers {
		if _, err := os.Stat(l); err != nil {
			t.Errorf("acquired image's layer %s: %v", l, err)
		}
	}
}

func TestLastUseSurvivesReopen(t *testing.T) {
	host := imagestest.Registry(t, nil)
	file := func(name string) v1.Layer {
		return imagestest.Layer(t, imagestest.File{Name: name, Body: strings.Repeat("x", 1000)})
	}
	a := pushSized(t, host, "a", file("a"))
	b := pushSized(t, host, "b", file("b"))
	c := pushSized(t, host, "c", file("c"))
	dir := t.TempDir()
	ctx := context.Background()
	s := open(t, dir, host, nil)
	for _, ref := range []string{a, b} {
		if _, err := s.Pull(ctx, ref, nil); err != nil {
			t.Fatal(err)
		}
	}
	_, release, err := s.Acquire(ctx, a) // a is now the most recently used
	if err != nil {
		t.Fatal(err)
	}
	release()

	s = open(t, dir, host, func(c *images.Config) { c.MaxBytes = 2500 })
	if _, err := s.Pull(ctx, c, nil); err != nil {
		t.Fatal(err)
	}
	var refs []string
	for _, e := range s.List() {
		refs = append(refs, e.Ref)
	}
	if want := []string{c, a}; !slices.Equal(refs, want) {
		t.Errorf("List after reopen and evict = %v, want %v (b least recently used)", refs, want)
	}
}

func TestRemoveRefusesImageInUse(t *testing.T) {
	host := imagestest.Registry(t, nil)
	ref := pushSized(t, host, "rm", imagestest.Layer(t, imagestest.File{Name: "f", Body: "f"}))
	s := open(t, t.TempDir(), host, nil)
	ctx := context.Background()
	img, release, err := s.Acquire(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if e := s.List(); len(e) != 1 || e[0].InUse != 1 || e[0].Digest != img.Digest {
		t.Errorf("List = %+v, want the image in use once", e)
	}
	if err := s.Remove(ctx, ref); !errors.Is(err, images.ErrInUse) {
		t.Fatalf("Remove in use: err = %v, want ErrInUse", err)
	}
	release()
	release() // safe twice: must not make the count negative
	if e := s.List(); len(e) != 1 || e[0].InUse != 0 {
		t.Errorf("List after release = %+v", e)
	}
	if err := s.Remove(ctx, img.Digest); err != nil {
		t.Fatal(err)
	}
	if e := s.List(); len(e) != 0 {
		t.Errorf("List after Remove = %+v", e)
	}
	if _, err := os.Stat(img.Layers[0]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("removed image's layer kept: %v", err)
	}
	if err := s.Remove(ctx, ref); !errors.Is(err, images.ErrNotFound) {
		t.Errorf("Remove again: err = %v, want ErrNotFound", err)
	}
}

func TestTagsPersistAcrossOpenUntilRefresh(t *testing.T) {
	var c counter
	host := imagestest.Registry(t, c.wrap)
	ref := host + "/test/tagged:latest"
	first := imagestest.Push(t, ref, imagestest.Image(t, v1.Config{}, imagestest.Layer(t, imagestest.File{Name: "v", Body: "1"})))
	dir := t.TempDir()
	ctx := context.Background()
	d, err := open(t, dir, host, nil).Resolve(ctx, ref)
	if err != nil || d != first {
		t.Fatalf("Resolve = %s, %v, want %s", d, err, first)
	}
	if _, err := os.Stat(filepath.Join(dir, "tags.json")); err != nil {
		t.Fatal(err)
	}

	second := imagestest.Push(t, ref, imagestest.Image(t, v1.Config{}, imagestest.Layer(t, imagestest.File{Name: "v", Body: "2"})))
	c.reset()
	s := open(t, dir, host, nil)
	if d, err := s.Resolve(ctx, ref); err != nil || d != first {
		t.Errorf("Resolve after reopen = %s, %v, want the remembered %s", d, err, first)
	}
	if n := c.snapshot(); len(n) != 0 {
		t.Errorf("remembered tag fetched %v", n)
	}
	img, err := s.Pull(ctx, ref, nil)
	if err != nil || img.Digest != first {
		t.Fatalf("Pull = %s, %v, want the remembered %s", img.Digest, err, first)
	}
	if err := s.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if d, err := s.Resolve(ctx, ref); err != nil || d != second {
		t.Errorf("Resolve after Refresh = %s, %v, want %s", d, err, second)
	}
	if d, err := open(t, dir, host, nil).Resolve(ctx, ref); err != nil || d != second {
		t.Errorf("Resolve after Refresh and reopen = %s, %v, want %s", d, err, second)
	}
	// The image pulled before stays listed after reopen.
	if e := open(t, dir, host, nil).List(); len(e) != 1 || e[0].Digest != first {
		t.Errorf("List after reopen = %+v", e)
	}
}

func TestIsRef(t *testing.T) {
	for s, want := range map[string]bool{
		"host":                               false,
		"":                                   false,
		"busybox":                            false,
		"busybox:1.36":                       true,
		"docker.io/library/python:3.12-slim": true,
		"buildpack-deps:bookworm":            true,
		"ghcr.io/org/img@sha256:" + strings.Repeat("a", 64): true,
		"Bad:Ref:x": false,
	} {
		if got := images.IsRef(s); got != want {
			t.Errorf("IsRef(%q) = %v, want %v", s, got, want)
		}
	}
}

func remoteAuth(user, password string) []remote.Option {
	return []remote.Option{remote.WithAuth(&authn.Basic{Username: user, Password: password})}
}

func TestIndexPullsTheConfiguredPlatform(t *testing.T) {
	host := imagestest.Registry(t, nil)
	marker := func(s string) v1.Image {
		return imagestest.Image(t, v1.Config{}, imagestest.Layer(t, imagestest.File{Name: "etc/os-release", Body: s}))
	}
	amd, arm := marker("amd64"), marker("arm64")
	index := imagestest.PushIndex(t, host+"/test/multi:1", map[string]v1.Image{"linux/amd64": amd, "linux/arm64": arm})
	armDigest, err := arm.Digest()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, ref := range []string{host + "/test/multi:1", host + "/test/multi@" + index} {
		s := open(t, t.TempDir(), host, func(c *images.Config) { c.Platform = "linux/arm64" })
		img, err := s.Pull(ctx, ref, nil)
		if err != nil {
			t.Fatal(err)
		}
		if img.Digest != armDigest.String() {
			t.Errorf("%s: digest = %s, want the arm64 image's %s", ref, img.Digest, armDigest)
		}
		if got := readFile(t, filepath.Join(img.Layers[0], "etc/os-release")); got != "arm64" {
			t.Errorf("%s: os-release = %q, want arm64", ref, got)
		}
		// The index digest now names the platform's image without a fetch.
		if again, err := s.Pull(ctx, ref, nil); err != nil || again.Digest != img.Digest {
			t.Errorf("%s again: %s, %v", ref, again.Digest, err)
		}
	}
}

// BenchmarkFirstPull100MB times pulling and unpacking an uncached image of
// one 100 MB incompressible layer from a loopback registry.
func BenchmarkFirstPull100MB(b *testing.B) {
	host := imagestest.Registry(b, nil)
	ref := host + "/bench/random:1"
	imagestest.Push(b, ref, imagestest.Image(b, v1.Config{}, imagestest.RandomLayer(b, 100<<20)))
	ctx := context.Background()
	for b.Loop() {
		b.StopTimer()
		s, err := images.Open(images.Config{Dir: b.TempDir(), Insecure: []string{host}})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := s.Pull(ctx, ref, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(100 << 20)
}

func TestPullTimeoutBoundsAStalledRegistry(t *testing.T) {
	var stall sync.Map
	host := imagestest.Registry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, on := stall.Load(true); on && strings.Contains(r.URL.Path, "/blobs/") {
				<-r.Context().Done() // a registry that never answers
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	ref := pushSized(t, host, "stall", imagestest.Layer(t, imagestest.File{Name: "f", Body: "f"}))
	stall.Store(true, true)
	dir := t.TempDir()
	s := open(t, dir, host, func(c *images.Config) { c.PullTimeout = time.Second })
	_, err := s.Pull(context.Background(), ref, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the pull's deadline", err)
	}
	if l := s.List(); len(l) != 0 {
		t.Errorf("List = %v after a timed-out pull", l)
	}
}

func TestCancelledCallerDoesNotFailTheOthers(t *testing.T) {
	var hold sync.Map
	requested, release := make(chan struct{}, 16), make(chan struct{})
	host := imagestest.Registry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, on := hold.Load(true); on && r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
				requested <- struct{}{}
				<-release
			}
			h.ServeHTTP(w, r)
		})
	})
	ref := pushSized(t, host, "shared", imagestest.Layer(t, imagestest.File{Name: "f", Body: "f"}))
	hold.Store(true, true)
	s := open(t, t.TempDir(), host, nil)

	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() {
		_, err := s.Pull(ctx, ref, nil)
		first <- err
	}()
	<-requested // the first caller's pull is fetching
	second := make(chan error, 1)
	go func() {
		_, _, err := s.Acquire(context.Background(), ref)
		second <- err
	}()
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled caller: err = %v, want context.Canceled", err)
	}
	close(release)
	if err := <-second; err != nil {
		t.Fatalf("waiting caller: %v", err)
	}
	if n := 1 + len(requested); n != 2 {
		t.Errorf("%d blob fetches, want 2 (config and layer) shared by both callers", n)
	}
	if e := s.List(); len(e) != 1 || e[0].InUse != 1 {
		t.Errorf("List = %+v, want the image acquired once", e)
	}
}

func TestOpenDropsAnImageWithAMissingLayer(t *testing.T) {
	host := imagestest.Registry(t, nil)
	ref := pushSized(t, host, "lost", imagestest.Layer(t, imagestest.File{Name: "f", Body: "f"}))
	dir := t.TempDir()
	ctx := context.Background()
	img, err := open(t, dir, host, nil).Pull(ctx, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(img.Layers[0]); err != nil {
		t.Fatal(err)
	}
	s := open(t, dir, host, nil)
	if e := s.List(); len(e) != 0 {
		t.Errorf("List = %+v, want the broken image dropped", e)
	}
	again, err := s.Pull(ctx, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(again.Layers[0], "f")); got != "f" {
		t.Errorf("f = %q after the pull again", got)
	}
}
