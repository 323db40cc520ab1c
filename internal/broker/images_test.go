package broker

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/images"
	"github.com/sandgate/sandgate/images/imagestest"
	"github.com/sandgate/sandgate/internal/logbuf"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
)

const (
	registryUser = "puller"
	registryPass = "s3cret-registry-pass-7Q"
)

// imageEnv is a registry that demands a login, a broker config naming it,
// the image store that config opens and a local provider on it.
type imageEnv struct {
	host     string
	blobGets atomic.Int64 // GETs of blobs since the pushes
	logs     logbuf.Buffer
	store    *localImages
	provider *local.Provider
}

func newImageEnv(t testing.TB, maxBytes int64) *imageEnv {
	t.Helper()
	e := &imageEnv{}
	e.host = imagestest.Registry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != registryUser || p != registryPass {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
				e.blobGets.Add(1)
			}
			h.ServeHTTP(w, r)
		})
	})
	dir := t.TempDir()
	pw := filepath.Join(dir, "registry-password")
	if err := os.WriteFile(pw, []byte(registryPass+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := &Config{DataDir: filepath.Join(dir, "data")}
	cfg.Images = ImagesConfig{
		MaxBytes:   maxBytes,
		Registries: map[string]RegistryConfig{e.host: {Username: registryUser, PasswordFile: pw}},
		Insecure:   []string{e.host},
	}
	log := slog.New(slog.NewJSONHandler(&e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := openImages(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	e.store = &localImages{s}
	e.provider, err = local.New(t.Context(), local.Config{DataDir: filepath.Join(dir, "local"), Images: *e.store, Tiers: map[string]local.Tier{"small": {DiskMiB: 64}}},
		providers.Env{BrokerID: "images-test", Logger: log})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() {
		sbs, _ := e.provider.List(context.Background())
		for _, sb := range sbs {
			e.provider.Terminate(context.Background(), sb)
		}
		e.provider.Close()
	})
	return e
}

// push pushes img to repo:tag with the registry's login and returns its
// digest reference.
func (e *imageEnv) push(t testing.TB, repo string, img v1.Image) string {
	t.Helper()
	auth := remote.WithAuth(&authn.Basic{Username: registryUser, Password: registryPass})
	d := imagestest.Push(t, e.host+"/"+repo+":1", img, auth)
	e.blobGets.Store(0)
	return e.host + "/" + repo + "@" + d
}

func (e *imageEnv) create(t testing.TB, image string) (providers.Sandbox, error) {
	t.Helper()
	return e.provider.Create(t.Context(), providers.CreateSpec{
		WorkspaceID: sandgate.NewID("ws_"), InstanceID: "in_images", AccountID: "acct_images",
		Size: sandgate.Size{Name: "small", CPUCores: 1, MemoryMiB: 256}, Image: image,
	})
}

func (e *imageEnv) sh(t *testing.T, sb providers.Sandbox, script string) string {
	t.Helper()
	res, err := e.provider.Exec(t.Context(), sb, providers.ExecSpec{Argv: []string{"sh", "-c", script}, MaxOutputBytes: 1 << 16})
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exec %q: exit %d: %s", script, res.ExitCode, res.Stderr)
	}
	return string(res.Stdout)
}

// markerImage is busybox, a layer with /etc/gone, and a layer with a
// marker file that deletes /etc/gone (a whiteout).
func markerImage(t *testing.T, marker string) v1.Image {
	return imagestest.Image(t, v1.Config{Env: []string{"PATH=/bin", "FROM_IMAGE=yes"}},
		imagestest.BusyboxLayer(t, marker),
		imagestest.Layer(t, imagestest.File{Name: "etc/gone", Body: "deleted above\n"}),
		imagestest.Layer(t,
			imagestest.File{Name: "marker", Body: marker + "\n"},
			imagestest.File{Name: "etc/.wh.gone"}),
	)
}

// TestImagesFromRegistry: workspaces run on images pulled with the
// configured login from a registry, by tag and by digest; ten concurrent
// creates on an uncached image pull it once; the login is in no log.
func TestImagesFromRegistry(t *testing.T) {
	t.Parallel()
	e := newImageEnv(t, 0)
	byDigest := e.push(t, "test/marker", markerImage(t, "sandgate-marker"))
	byTag := e.host + "/test/marker:1"

	var wg sync.WaitGroup
	sbs := make([]providers.Sandbox, 10)
	errs := make([]error, 10)
	for i := range sbs {
		wg.Go(func() { sbs[i], errs[i] = e.create(t, byTag) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent create %d on an uncached image: %v", i, err)
		}
	}
	// The config and three layers, each fetched once.
	if n := e.blobGets.Load(); n != 4 {
		t.Errorf("blob GETs for ten concurrent creates on one uncached image = %d; want 4 (one pull)", n)
	}
	for _, sb := range sbs[:2] {
		if got := e.sh(t, sb, "cat /marker /etc/os-release; test -e /etc/gone && echo present || echo absent; echo $FROM_IMAGE"); got != "sandgate-marker\nID=sandgate-marker\nabsent\nyes\n" {
			t.Errorf("image content = %q; want the marker, the image's os-release, the whiteout honoured", got)
		}
	}
	sb, err := e.create(t, byDigest)
	if err != nil {
		t.Fatalf("create by digest: %v", err)
	}
	if got := e.sh(t, sb, "cat /marker"); got != "sandgate-marker\n" {
		t.Errorf("by digest: marker = %q", got)
	}
	if n := e.blobGets.Load(); n != 4 {
		t.Errorf("blob GETs after a create by the cached digest = %d; want still 4", n)
	}
	if logs := e.logs.String(); strings.Contains(logs, registryPass) || strings.Contains(logs, "cHVsbGVy") {
		t.Errorf("the registry login appears in the logs")
	}
	if !strings.Contains(e.logs.String(), "image_digest") {
		t.Errorf("no create logged its image's digest")
	}
}

// TestImageErrors: an image no registry has, or one that runs as another
// user than root, is ErrImageUnavailable (422 image_not_allowed); a wrong
// login is not (the operator's to fix, 502).
func TestImageErrors(t *testing.T) {
	t.Parallel()
	e := newImageEnv(t, 0)
	e.push(t, "test/nonroot", imagestest.Image(t, v1.Config{User: "1000"}, imagestest.BusyboxLayer(t, "nonroot")))
	for _, ref := range []string{e.host + "/test/missing:1", e.host + "/test/nonroot:1"} {
		if _, err := e.create(t, ref); !errors.Is(err, providers.ErrImageUnavailable) {
			t.Errorf("create on %s = %v; want ErrImageUnavailable", ref, err)
		}
	}
}

// TestImageCacheBound: past images.max_bytes, an image no workspace runs
// on is evicted; one a live workspace runs on is not.
func TestImageCacheBound(t *testing.T) {
	t.Parallel()
	probe := newImageEnv(t, 0)
	probe.push(t, "test/a", imagestest.Image(t, v1.Config{}, imagestest.BusyboxLayer(t, "a")))
	img, release, err := probe.store.s.Acquire(t.Context(), probe.host+"/test/a:1")
	if err != nil {
		t.Fatal(err)
	}
	release()
	// Room for one image and a half.
	e := newImageEnv(t, img.Size*3/2)
	a := e.push(t, "test/a", imagestest.Image(t, v1.Config{}, imagestest.BusyboxLayer(t, "a")))
	b := e.push(t, "test/b", imagestest.Image(t, v1.Config{}, imagestest.BusyboxLayer(t, "b")))
	c := e.push(t, "test/c", imagestest.Image(t, v1.Config{}, imagestest.BusyboxLayer(t, "c")))
	digest := func(ref string) string { _, d, _ := strings.Cut(ref, "@"); return d }
	cached := func(ref string) bool {
		for _, en := range e.store.s.List() {
			if en.Digest == digest(ref) {
				return true
			}
		}
		return false
	}
	sbA, err := e.create(t, a)
	if err != nil {
		t.Fatal(err)
	}
	// A runs: pulling B cannot evict it.
	sbB, err := e.create(t, b)
	if err != nil {
		t.Fatal(err)
	}
	if !cached(a) {
		t.Errorf("an image a live workspace runs on was evicted")
	}
	if got := e.sh(t, sbA, "cat /etc/os-release"); got != "ID=a\n" {
		t.Errorf("workspace on A after B's pull sees %q", got)
	}
	// A's workspace ends: the next pull evicts it, not B (in use).
	if err := e.provider.Terminate(t.Context(), sbA); err != nil {
		t.Fatal(err)
	}
	if _, err := e.create(t, c); err != nil {
		t.Fatal(err)
	}
	if cached(a) {
		t.Errorf("an unused image is still cached past images.max_bytes")
	}
	if !cached(b) || !cached(c) {
		t.Errorf("images in use were evicted: b %v, c %v", cached(b), cached(c))
	}
	if got := e.sh(t, sbB, "cat /etc/os-release"); got != "ID=b\n" {
		t.Errorf("workspace on B sees %q", got)
	}
}

// TestVendorImagesNotResolved: an instance on a vendor provider names the
// vendor's images (Modal's "debian:bookworm-slim"); the broker's store
// never resolves them, so creating such an instance asks no registry (and
// a broker that cannot reach one still admits it).
func TestVendorImagesNotResolved(t *testing.T) {
	var asked atomic.Int64
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		http.Error(w, "no", http.StatusServiceUnavailable)
	}))
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	s, err := images.Open(images.Config{Dir: t.TempDir(), Insecure: []string{host}})
	if err != nil {
		t.Fatal(err)
	}
	a := adminImages{s}
	for _, kind := range []string{"modal", "fly-machines", "fly-sprites"} {
		if err := a.ResolveImages(t.Context(), kind, []string{host + "/debian:bookworm-slim"}); err != nil {
			t.Errorf("resolve on %s = %v; want nothing asked", kind, err)
		}
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the registry was asked %d times for vendor images; want 0", n)
	}
	if err := a.ResolveImages(t.Context(), "local", []string{host + "/debian:bookworm-slim"}); err == nil || asked.Load() == 0 {
		t.Errorf("resolve on local = %v after %d requests; want the registry asked, and its refusal", err, asked.Load())
	}
}
