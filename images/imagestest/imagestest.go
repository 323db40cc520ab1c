// Package imagestest runs an in-process OCI registry and builds images for
// tests of code that pulls them.
package imagestest

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Registry starts an in-memory registry on loopback for the test's life
// and returns its host ("127.0.0.1:port"), to be listed as insecure. wrap,
// when not nil, wraps its handler (to count, corrupt or demand auth); the
// pushes of [Push] pass through it too.
func Registry(t testing.TB, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// File is one tar entry of a [Layer]. Typeflag 0 means a regular file
// holding Body; Mode 0 means 0644 for files and 0755 for dirs.
type File struct {
	Name     string
	Typeflag byte
	Body     string
	Linkname string
	Mode     int64
	Uid, Gid int
	Xattrs   map[string]string // extended attributes, as PAX records
}

// Layer builds a gzip layer holding files in order.
func Layer(t testing.TB, files ...File) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, f := range files {
		hdr := &tar.Header{
			Name: f.Name, Typeflag: f.Typeflag, Linkname: f.Linkname, Mode: f.Mode,
			Uid: f.Uid, Gid: f.Gid, ModTime: mtime, Format: tar.FormatPAX,
		}
		for k, v := range f.Xattrs {
			if hdr.PAXRecords == nil {
				hdr.PAXRecords = make(map[string]string)
			}
			hdr.PAXRecords["SCHILY.xattr."+k] = v
		}
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		if hdr.Typeflag == tar.TypeReg {
			hdr.Size = int64(len(f.Body))
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
			if hdr.Typeflag == tar.TypeDir {
				hdr.Mode = 0o755
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Size > 0 {
			if _, err := io.WriteString(tw, f.Body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return layerFromBytes(t, buf.Bytes())
}

func layerFromBytes(t testing.TB, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// BusyboxLayer holds /bin/busybox (from the busybox-static package) with
// sh, cat, echo, ls, id, env, mkdir, rm, touch, test and stat as symlinks to
// it, /etc/os-release saying "ID=<marker>", empty /usr/bin and a 1777 /tmp.
func BusyboxLayer(t testing.TB, marker string) v1.Layer {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("busybox-static: %v", err)
	}
	files := []File{
		{Name: "bin/", Typeflag: tar.TypeDir},
		{Name: "bin/busybox", Body: string(bb), Mode: 0o755},
	}
	for _, applet := range []string{"sh", "cat", "echo", "ls", "id", "env", "mkdir", "rm", "touch", "test", "stat"} {
		files = append(files, File{Name: "bin/" + applet, Typeflag: tar.TypeSymlink, Linkname: "busybox"})
	}
	return Layer(t, append(files,
		File{Name: "etc/", Typeflag: tar.TypeDir},
		File{Name: "etc/os-release", Body: "ID=" + marker + "\n"},
		File{Name: "usr/", Typeflag: tar.TypeDir},
		File{Name: "usr/bin/", Typeflag: tar.TypeDir},
		File{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777},
	)...)
}

// RandomLayer holds one file of size incompressible bytes, for timing
// first pulls.
func RandomLayer(t testing.TB, size int64) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "random", Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(tw, rand.Reader, size); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return layerFromBytes(t, buf.Bytes())
}

// Image stacks layers, bottom first, with cfg as the image's config, for
// this machine's platform.
func Image(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = runtime.GOOS, runtime.GOARCH
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// Push writes img to ref ("host/repo:tag") over plain HTTP and returns its
// manifest digest.
func Push(t testing.TB, ref string, img v1.Image, opts ...remote.Option) string {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, opts...); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// PushIndex writes an image index of imgs keyed by platform ("linux/arm64")
// to ref and returns the index's digest.
func PushIndex(t testing.TB, ref string, imgs map[string]v1.Image) string {
	t.Helper()
	idx := v1.ImageIndex(empty.Index)
	for p, img := range imgs {
		plat, err := v1.ParsePlatform(p)
		if err != nil {
			t.Fatal(err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: plat}})
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(r, idx); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}
