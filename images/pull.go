package images

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/docker/cli/cli/config"
	"github.com/docker/cli/cli/config/configfile"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// keychain answers credentials from the per-registry settings first, then
// the Docker config file; never from $HOME or the environment.
type keychain struct {
	file  *configfile.ConfigFile
	creds map[string]Credential
}

func newKeychain(dockerConfig string, creds map[string]Credential) (*keychain, error) {
	k := &keychain{creds: creds}
	if dockerConfig == "" {
		return k, nil
	}
	f, err := os.Open(dockerConfig)
	if err != nil {
		return nil, fmt.Errorf("images: docker config: %w", err)
	}
	defer f.Close()
	k.file, err = config.LoadFromReader(f)
	if err != nil {
		// The loader's error may quote the file; it holds secrets.
		return nil, errors.New("images: docker config: cannot parse")
	}
	return k, nil
}

// Resolve implements [authn.Keychain].
func (k *keychain) Resolve(res authn.Resource) (authn.Authenticator, error) {
	if c, ok := k.creds[res.RegistryStr()]; ok {
		return authn.FromConfig(authn.AuthConfig{Username: c.Username, Password: c.Password}), nil
	}
	if k.file == nil {
		return authn.Anonymous, nil
	}
	for _, key := range []string{res.String(), res.RegistryStr()} {
		if key == name.DefaultRegistry {
			key = authn.DefaultAuthKey
		}
		ac, err := k.file.GetAuthConfig(key)
		if err != nil {
			return nil, fmt.Errorf("images: credentials for %s: %w", res.RegistryStr(), err)
		}
		if ac.Username != "" || ac.Password != "" || ac.Auth != "" || ac.IdentityToken != "" || ac.RegistryToken != "" {
			return authn.FromConfig(authn.AuthConfig{
				Username:      ac.Username,
				Password:      ac.Password,
				Auth:          ac.Auth,
				IdentityToken: ac.IdentityToken,
				RegistryToken: ac.RegistryToken,
			}), nil
		}
	}
	return authn.Anonymous, nil
}

// parse parses ref, reaching the hosts listed in Insecure over plain HTTP.
func (s *Store) parse(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("images: %q: %w", ref, err)
	}
	if slices.Contains(s.cfg.Insecure, r.Context().RegistryStr()) {
		return name.ParseReference(ref, name.Insecure)
	}
	return r, nil
}

func (s *Store) remoteOpts(ctx context.Context) []remote.Option {
	return []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(s.keys),
		remote.WithPlatform(s.platform),
	}
}

// pullContext bounds work shared by every caller of one pull: it outlives
// the first caller's ctx but not PullTimeout.
func (s *Store) pullContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.cfg.PullTimeout)
}

// registryErr turns a registry's answer into the package's errors. An
// authorization failure names the registry host only.
func registryErr(r name.Reference, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch {
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden:
			return fmt.Errorf("images: registry %s: %w", r.Context().RegistryStr(), ErrUnauthorized)
		case te.StatusCode == http.StatusNotFound:
			return fmt.Errorf("images: %s: %w", r, ErrNotFound)
		}
		for _, d := range te.Errors {
			switch d.Code {
			case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode:
				return fmt.Errorf("images: %s: %w", r, ErrNotFound)
			case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
				return fmt.Errorf("images: registry %s: %w", r.Context().RegistryStr(), ErrUnauthorized)
			}
		}
	}
	return fmt.Errorf("images: pull %s: %w", r, err)
}

// lookup fetches tag's manifest for the platform.
func (s *Store) lookup(ctx context.Context, r name.Reference) (v1.Image, string, error) {
	desc, err := remote.Get(r, s.remoteOpts(ctx)...)
	if err != nil {
		return nil, "", registryErr(r, err)
	}
	img, err := desc.Image()
	if err != nil {
		return nil, "", registryErr(r, err)
	}
	d, err := img.Digest()
	if err != nil {
		return nil, "", registryErr(r, err)
	}
	return img, d.String(), nil
}

// remember records that tag r names digest d.
func (s *Store) remember(r name.Reference, d string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tags[r.Name()] = d
	return s.saveTagsLocked()
}

// lookupAndRemember looks tag r up and remembers the answer.
func (s *Store) lookupAndRemember(ctx context.Context, r name.Reference) (string, error) {
	_, d, err := s.lookup(ctx, r)
	if err != nil {
		return "", err
	}
	return d, s.remember(r, d)
}

// Resolve returns the digest ("sha256:…") of ref's manifest for the
// platform (a digest ref returns itself without a registry call). Tag to
// digest answers are remembered (persisted under Dir) until Refresh.
func (s *Store) Resolve(ctx context.Context, ref string) (string, error) {
	r, err := s.parse(ref)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	d := s.knownDigestLocked(ref)
	s.mu.Unlock()
	if d != "" {
		return d, nil
	}
	return s.resolves.do(ctx, r.Name(), func() (string, error) {
		ctx, cancel := s.pullContext(ctx)
		defer cancel()
		return s.lookupAndRemember(ctx, r)
	})
}

// Refresh re-resolves every remembered tag, so the next pull of a tag whose
// image moved fetches the new one. Images already pulled stay until evicted.
func (s *Store) Refresh(ctx context.Context) error {
	s.mu.Lock()
	var names []string
	for n := range s.tags {
		if _, err := name.NewTag(n, name.StrictValidation); err == nil {
			names = append(names, n)
		}
	}
	s.mu.Unlock()
	var errs []error
	for _, n := range names {
		r, err := s.parse(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.mu.Lock()
		was := s.tags[n]
		s.mu.Unlock()
		lctx, cancel := context.WithTimeout(ctx, s.cfg.PullTimeout)
		d, err := s.lookupAndRemember(lctx, r)
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if d != was {
			s.log.Info("images: tag moved", "ref", n, "from", was, "digest", d)
		}
	}
	return errors.Join(errs...)
}

// pull returns the metadata of ref's image, pulling it if absent.
func (s *Store) pull(ctx context.Context, ref string, progress func(string)) (*imageMeta, error) {
	r, err := s.parse(ref)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	d := s.knownDigestLocked(ref)
	if c, ok := s.images[hexOf(d)]; ok && d != "" {
		s.mu.Unlock()
		return c.meta, nil
	}
	s.mu.Unlock()
	if d != "" {
		// A digest, or a tag resolved before: pull exactly that digest.
		byDigest := r.Context().Digest(d)
		return s.pulls.do(ctx, d, func() (*imageMeta, error) {
			ctx, cancel := s.pullContext(ctx)
			defer cancel()
			img, err := remote.Image(byDigest, s.remoteOpts(ctx)...)
			if err != nil {
				return nil, registryErr(r, err)
			}
			return s.fetch(ctx, ref, r, img, progress)
		})
	}
	return s.pulls.do(ctx, r.Name(), func() (*imageMeta, error) {
		ctx, cancel := s.pullContext(ctx)
		defer cancel()
		img, d, err := s.lookup(ctx, r)
		if err != nil {
			return nil, err
		}
		m, err := s.pulls.do(ctx, d, func() (*imageMeta, error) {
			// Remembered only now that this pull of d is registered: a
			// caller that finds the tag then joins it instead of
			// fetching d's manifest again.
			if err := s.remember(r, d); err != nil {
				return nil, err
			}
			return s.fetch(ctx, ref, r, img, progress)
		})
		if err != nil {
			return nil, err
		}
		// This joined a pull of d by another name: remember the tag too.
		s.mu.Lock()
		known := s.tags[r.Name()] == d
		s.mu.Unlock()
		if !known {
			if err := s.remember(r, d); err != nil {
				return nil, err
			}
		}
		return m, nil
	})
}

// fetch stores img: every layer unpacked (once per digest), then its
// manifest, config and metadata, then the bound enforced.
func (s *Store) fetch(ctx context.Context, ref string, r name.Reference, img v1.Image, progress func(string)) (*imageMeta, error) {
	say := func(format string, args ...any) {
		if progress != nil {
			progress(fmt.Sprintf(format, args...))
		}
	}
	start := time.Now()
	dg, err := img.Digest()
	if err != nil {
		return nil, registryErr(r, err)
	}
	digest := dg.String()
	h := dg.Hex
	s.mu.Lock()
	if c, ok := s.images[h]; ok {
		s.mu.Unlock()
		return c.meta, nil
	}
	s.mu.Unlock()

	manifest, err := img.Manifest()
	if err != nil {
		return nil, registryErr(r, err)
	}
	compressed := manifest.Config.Size
	for _, l := range manifest.Layers {
		compressed += l.Size
	}
	if compressed > s.cfg.MaxImageBytes {
		return nil, fmt.Errorf("images: %s is %d bytes compressed, over the %d allowed: %w", ref, compressed, s.cfg.MaxImageBytes, ErrTooLarge)
	}
	rawManifest, err := img.RawManifest()
	if err != nil {
		return nil, registryErr(r, err)
	}
	rawConfig, err := img.RawConfigFile()
	if err != nil {
		return nil, registryErr(r, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, registryErr(r, err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, registryErr(r, err)
	}
	s.log.Info("images: pulling", "ref", ref, "digest", digest, "bytes", compressed)
	say("pulling %s (%s, %d layers, %d bytes)", ref, digest, len(layers), compressed)

	m := &imageMeta{Ref: ref, Digest: digest, Config: ImageConfig{
		Env:        cf.Config.Env,
		WorkingDir: cf.Config.WorkingDir,
		User:       cf.Config.User,
		Entrypoint: cf.Config.Entrypoint,
		Cmd:        cf.Config.Cmd,
	}}
	var hexes []string
	for _, l := range layers {
		ld, err := l.Digest()
		if err != nil {
			return nil, registryErr(r, err)
		}
		hexes = append(hexes, ld.Hex)
	}
	s.mu.Lock()
	for _, lh := range hexes {
		s.pending[lh]++
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		for _, lh := range hexes {
			s.pending[lh]--
			if s.pending[lh] == 0 {
				delete(s.pending, lh)
			}
		}
		s.mu.Unlock()
	}()
	for i, l := range layers {
		lh := hexes[i]
		size, err := s.unpacks.do(ctx, lh, func() (int64, error) { return s.unpack(ctx, r, l, lh) })
		if err != nil {
			return nil, err
		}
		m.Layers = append(m.Layers, layerMeta{Digest: "sha256:" + lh, Size: size})
		m.Size += size
		say("layer %d/%d sha256:%.12s: %d bytes unpacked", i+1, len(layers), lh, size)
	}
	m.LastUsed = time.Now().UTC()

	dir, err := os.MkdirTemp(s.path("tmp"), "image-")
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	defer os.RemoveAll(dir)
	metaJSON, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	for name, b := range map[string][]byte{"manifest.json": rawManifest, "config.json": rawConfig, "meta.json": metaJSON} {
		if err := os.WriteFile(dir+"/"+name, b, 0o600); err != nil {
			return nil, fmt.Errorf("images: %w", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.images[h]; ok {
		// Pulled meanwhile under another name (a tag and its digest).
		return c.meta, nil
	}
	if err := os.Rename(dir, s.path("images", h)); err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	s.images[h] = &cached{meta: m}
	if d, ok := r.(name.Digest); ok && d.DigestStr() != digest {
		// The digest named an index: remember which image it meant here.
		s.tags[d.Name()] = digest
		if err := s.saveTagsLocked(); err != nil {
			return nil, err
		}
	}
	s.evictLocked(h)
	dur := time.Since(start)
	s.log.Info("images: pulled", "ref", ref, "digest", digest, "bytes", compressed, "unpacked_bytes", m.Size, "duration", dur)
	say("pulled %s in %s", digest, dur.Round(time.Millisecond))
	return m, nil
}

// unpack makes layers/<lh>/ from l unless it is already there, and returns
// its unpacked bytes. The layer's digest is verified as it is read: a
// corrupt blob fails before the dir is renamed into place.
func (s *Store) unpack(ctx context.Context, r name.Reference, l v1.Layer, lh string) (int64, error) {
	s.mu.Lock()
	size, ok := s.layers[lh]
	s.mu.Unlock()
	if ok {
		return size, nil
	}
	start := time.Now()
	tmp, err := os.MkdirTemp(s.path("tmp"), "layer-")
	if err != nil {
		return 0, fmt.Errorf("images: %w", err)
	}
	defer os.RemoveAll(tmp)
	rc, err := l.Uncompressed()
	if err != nil {
		return 0, registryErr(r, err)
	}
	defer rc.Close()
	size, err = unpackLayer(rc, tmp, s.cfg.MaxBytes)
	if errors.Is(err, ErrTooLarge) {
		return 0, fmt.Errorf("images: layer sha256:%s unpacks to more than the cache's %d bytes: %w", lh, s.cfg.MaxBytes, ErrTooLarge)
	}
	if err == nil {
		// The tar's end comes before the stream's: read the rest so the
		// digest check at EOF runs.
		_, err = io.Copy(io.Discard, rc)
	}
	if err == nil {
		err = rc.Close()
	}
	if err != nil {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("images: layer sha256:%s: %w", lh, ctx.Err())
		}
		return 0, fmt.Errorf("images: %s: layer sha256:%s: %w", r, lh, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// A dir already there is one no image records (a crash between rename
	// and meta.json): replace it.
	if err := os.RemoveAll(s.path("layers", lh)); err != nil {
		return 0, fmt.Errorf("images: %w", err)
	}
	if err := os.Rename(tmp, s.path("layers", lh)); err != nil {
		return 0, fmt.Errorf("images: %w", err)
	}
	s.layers[lh] = size
	s.log.Info("images: layer unpacked", "digest", "sha256:"+lh, "bytes", size, "duration", time.Since(start))
	return size, nil
}
