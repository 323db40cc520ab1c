package images

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Store is the image store. Its methods are safe for concurrent use.
//
// On disk under Dir: layers/<hex>/ one unpacked layer per compressed layer
// digest; images/<hex>/ one pulled image (manifest.json, config.json,
// meta.json) per manifest digest; tags.json the remembered tag → digest
// answers; tmp/ work in progress, renamed into place when complete.
type Store struct {
	cfg      Config
	log      *slog.Logger
	platform v1.Platform
	keys     *keychain

	resolves flight[string]
	pulls    flight[*imageMeta]
	unpacks  flight[int64]

	mu      sync.Mutex
	images  map[string]*cached // by manifest digest hex
	tags    map[string]string  // canonical tag ref → manifest digest
	pending map[string]int     // layer hex → pulls in progress that need it
	layers  map[string]int64   // layer hex → unpacked bytes, for layers present
}

// cached is one image present in the store.
type cached struct {
	meta  *imageMeta
	inUse int
}

// imageMeta is images/<hex>/meta.json.
type imageMeta struct {
	Ref      string      `json:"ref"`
	Digest   string      `json:"digest"`
	Layers   []layerMeta `json:"layers"`
	Config   ImageConfig `json:"config"`
	Size     int64       `json:"size"`
	LastUsed time.Time   `json:"last_used"`
}

type layerMeta struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"` // unpacked bytes
}

// Open opens (creating if needed) the store under cfg.Dir. It drops work
// left in progress by a previous process and layers no image refers to.
func Open(cfg Config) (*Store, error) {
	if cfg.Dir == "" {
		return nil, errors.New("images: Dir is required")
	}
	cfg.MaxBytes = cmp.Or(cfg.MaxBytes, DefaultMaxBytes)
	cfg.MaxImageBytes = cmp.Or(cfg.MaxImageBytes, DefaultMaxImageBytes)
	cfg.PullTimeout = cmp.Or(cfg.PullTimeout, DefaultPullTimeout)
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	plat := v1.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH}
	if cfg.Platform != "" {
		p, err := v1.ParsePlatform(cfg.Platform)
		if err != nil {
			return nil, fmt.Errorf("images: platform %q: %w", cfg.Platform, err)
		}
		plat = *p
	}
	keys, err := newKeychain(cfg.DockerConfig, cfg.Registries)
	if err != nil {
		return nil, err
	}
	s := &Store{
		cfg:      cfg,
		log:      cfg.Log,
		platform: plat,
		keys:     keys,
		images:   make(map[string]*cached),
		tags:     make(map[string]string),
		pending:  make(map[string]int),
		layers:   make(map[string]int64),
	}
	if err := os.RemoveAll(s.path("tmp")); err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	for _, d := range []string{"tmp", "layers", "images"} {
		if err := os.MkdirAll(s.path(d), 0o700); err != nil {
			return nil, fmt.Errorf("images: %w", err)
		}
	}
	if b, err := os.ReadFile(s.path("tags.json")); err == nil {
		if err := json.Unmarshal(b, &s.tags); err != nil {
			return nil, fmt.Errorf("images: tags.json: %w", err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("images: %w", err)
	}
	ents, err := os.ReadDir(s.path("images"))
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(s.path("images", e.Name(), "meta.json"))
		var m imageMeta
		if err == nil {
			err = json.Unmarshal(b, &m)
		}
		for _, l := range m.Layers {
			if err == nil {
				_, err = os.Stat(s.path("layers", hexOf(l.Digest)))
			}
		}
		if err != nil {
			s.log.Warn("images: dropping unreadable image", "digest", "sha256:"+e.Name(), "err", err)
			os.RemoveAll(s.path("images", e.Name()))
			continue
		}
		s.images[e.Name()] = &cached{meta: &m}
		for _, l := range m.Layers {
			s.layers[hexOf(l.Digest)] = l.Size
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gcLayersLocked()
	return s, nil
}

func (s *Store) path(elem ...string) string {
	return filepath.Join(append([]string{s.cfg.Dir}, elem...)...)
}

// hexOf is the hex part of a "sha256:…" digest.
func hexOf(digest string) string {
	_, h, _ := strings.Cut(digest, ":")
	return h
}

// image builds the caller's view of a cached image.
func (s *Store) image(ref string, m *imageMeta) Image {
	img := Image{Ref: ref, Digest: m.Digest, Config: m.Config, Size: m.Size}
	for _, l := range m.Layers {
		img.Layers = append(img.Layers, s.path("layers", hexOf(l.Digest)))
	}
	return img
}

// IsRef reports whether s names an OCI image (not "host" or another
// provider-internal name): a reference with a registry or repository path,
// a tag or a digest, such as "busybox:1.36" or "ghcr.io/org/img@sha256:…".
// A bare word is not one.
func IsRef(s string) bool {
	if !strings.ContainsAny(s, "/:@") {
		return false
	}
	_, err := name.ParseReference(s)
	return err == nil
}

// Pull makes ref (tag or digest) present: manifest, config, every layer
// verified by digest and unpacked once per layer digest. Concurrent calls
// for one image pull it once. progress, when not nil, gets human lines
// without secrets.
func (s *Store) Pull(ctx context.Context, ref string, progress func(string)) (Image, error) {
	if progress != nil {
		// The pull may outlive this call (see pullContext): stop telling
		// the caller once it has returned.
		var mu sync.Mutex
		done := false
		defer func() {
			mu.Lock()
			done = true
			mu.Unlock()
		}()
		report := progress
		progress = func(line string) {
			mu.Lock()
			defer mu.Unlock()
			if !done {
				report(line)
			}
		}
	}
	img, release, err := s.acquire(ctx, ref, progress, false)
	release()
	return img, err
}

// Acquire pins a pulled image against eviction while a workspace uses it
// (pulling it first if needed); release is safe to call more than once.
func (s *Store) Acquire(ctx context.Context, ref string) (img Image, release func(), err error) {
	return s.acquire(ctx, ref, nil, true)
}

func (s *Store) acquire(ctx context.Context, ref string, progress func(string), pin bool) (Image, func(), error) {
	noop := func() {}
	for {
		m, err := s.pull(ctx, ref, progress)
		if err != nil {
			return Image{}, noop, err
		}
		h := hexOf(m.Digest)
		s.mu.Lock()
		c, ok := s.images[h]
		if !ok {
			// Evicted between the pull and now by another pull's bound:
			// pull again.
			s.mu.Unlock()
			continue
		}
		c.meta.LastUsed = time.Now().UTC()
		if err := s.saveMetaLocked(c.meta); err != nil {
			// Only the eviction order after a restart suffers.
			s.log.Warn("images: recording last use", "digest", c.meta.Digest, "err", err)
		}
		if !pin {
			s.mu.Unlock()
			return s.image(ref, c.meta), noop, nil
		}
		c.inUse++
		s.mu.Unlock()
		var once sync.Once
		return s.image(ref, c.meta), func() {
			once.Do(func() {
				s.mu.Lock()
				c.inUse--
				s.mu.Unlock()
			})
		}, nil
	}
}

// List returns the cached images, most recently used first.
func (s *Store) List() []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Entry, 0, len(s.images))
	for _, c := range s.images {
		out = append(out, Entry{Ref: c.meta.Ref, Digest: c.meta.Digest, Size: c.meta.Size, LastUsed: c.meta.LastUsed, InUse: c.inUse})
	}
	slices.SortFunc(out, func(a, b Entry) int { return b.LastUsed.Compare(a.LastUsed) })
	return out
}

// Remove deletes an image, the tags that name it and the layers no other
// image shares. It refuses an image in use with [ErrInUse].
func (s *Store) Remove(ctx context.Context, refOrDigest string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	digest := s.knownDigestLocked(refOrDigest)
	c, ok := s.images[hexOf(digest)]
	if digest == "" || !ok {
		return fmt.Errorf("images: %s: %w", refOrDigest, ErrNotFound)
	}
	if c.inUse > 0 {
		return fmt.Errorf("images: %s: %w", refOrDigest, ErrInUse)
	}
	for t, d := range s.tags {
		if d == digest {
			delete(s.tags, t)
		}
	}
	if err := s.saveTagsLocked(); err != nil {
		return err
	}
	return s.removeLocked(hexOf(digest))
}

// knownDigestLocked answers the digest a ref names from what the store
// remembers, without a registry call; "" when it does not know.
func (s *Store) knownDigestLocked(ref string) string {
	if strings.HasPrefix(ref, "sha256:") {
		return ref
	}
	r, err := s.parse(ref)
	if err != nil {
		return ""
	}
	if d, ok := r.(name.Digest); ok {
		if alias, ok := s.tags[d.Name()]; ok {
			return alias
		}
		return d.DigestStr()
	}
	return s.tags[r.Name()]
}

// removeLocked deletes image h and the layers left without an image.
func (s *Store) removeLocked(h string) error {
	m := s.images[h].meta
	delete(s.images, h)
	if err := os.RemoveAll(s.path("images", h)); err != nil {
		return fmt.Errorf("images: %w", err)
	}
	s.log.Info("images: removed", "ref", m.Ref, "digest", m.Digest, "bytes", m.Size)
	return s.gcLayersLocked()
}

// gcLayersLocked deletes layer dirs no image and no pull in progress uses.
func (s *Store) gcLayersLocked() error {
	used := make(map[string]bool)
	for _, c := range s.images {
		for _, l := range c.meta.Layers {
			used[hexOf(l.Digest)] = true
		}
	}
	ents, err := os.ReadDir(s.path("layers"))
	if err != nil {
		return fmt.Errorf("images: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if used[e.Name()] || s.pending[e.Name()] > 0 {
			continue
		}
		delete(s.layers, e.Name())
		if err := os.RemoveAll(s.path("layers", e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// usedBytesLocked is the unpacked size of every layer present once.
func (s *Store) usedBytesLocked() int64 {
	seen := make(map[string]bool)
	var n int64
	for _, c := range s.images {
		for _, l := range c.meta.Layers {
			if !seen[l.Digest] {
				seen[l.Digest] = true
				n += l.Size
			}
		}
	}
	return n
}

// evictLocked removes least recently used images nobody has acquired, other
// than keep, until the cache is within MaxBytes.
func (s *Store) evictLocked(keep string) {
	for s.usedBytesLocked() > s.cfg.MaxBytes {
		var victim *cached
		for h, c := range s.images {
			if h == keep || c.inUse > 0 {
				continue
			}
			if victim == nil || c.meta.LastUsed.Before(victim.meta.LastUsed) {
				victim = c
			}
		}
		if victim == nil {
			return
		}
		s.log.Info("images: evicting", "ref", victim.meta.Ref, "digest", victim.meta.Digest, "bytes", victim.meta.Size)
		if err := s.removeLocked(hexOf(victim.meta.Digest)); err != nil {
			s.log.Warn("images: evict", "digest", victim.meta.Digest, "err", err)
			return
		}
	}
}

// saveMetaLocked rewrites an image's meta.json atomically.
func (s *Store) saveMetaLocked(m *imageMeta) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return writeFileAtomic(s.path("images", hexOf(m.Digest), "meta.json"), s.path("tmp"), b)
}

// saveTagsLocked writes tags.json atomically.
func (s *Store) saveTagsLocked() error {
	b, err := json.MarshalIndent(s.tags, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(s.path("tags.json"), s.path("tmp"), b)
}

func writeFileAtomic(path, tmpDir string, b []byte) error {
	f, err := os.CreateTemp(tmpDir, "write-*")
	if err != nil {
		return fmt.Errorf("images: %w", err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("images: %w", err)
	}
	return nil
}
