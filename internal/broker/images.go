package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admin"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/images"
	"github.com/sandgate/sandgate/internal/tick"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
)

// ImagesConfig is the `images:` section: the store of OCI images the local
// provider's workspaces run on (package images, docs/images.md).
type ImagesConfig struct {
	// Dir is the content store; default <data_dir>/images.
	Dir string `yaml:"dir"`
	// MaxBytes bounds the cache (unpacked bytes): past it, images no
	// workspace uses are evicted, least recently used first; default 20 GiB.
	MaxBytes int64 `yaml:"max_bytes"`
	// MaxImageBytes bounds one image's compressed size; default 4 GiB.
	MaxImageBytes int64 `yaml:"max_image_bytes"`
	// PullTimeout bounds a pull, which is part of a workspace's create;
	// default 10m.
	PullTimeout time.Duration `yaml:"pull_timeout"`
	// RefreshInterval is how often every tag an instance allows is
	// resolved to its digest again; default 1h, negative for never.
	RefreshInterval time.Duration `yaml:"refresh_interval"`
	// DockerConfig is a Docker config.json with registry logins; "" = none.
	DockerConfig string `yaml:"docker_config"`
	// Registries are logins by registry host (they win over
	// docker_config's); each password is read from a file, never inline.
	Registries map[string]RegistryConfig `yaml:"registries"`
	// Insecure are registry hosts reached over plain HTTP.
	Insecure []string `yaml:"insecure"`
}

// RegistryConfig is one registry's login.
type RegistryConfig struct {
	Username     string `yaml:"username"`
	PasswordFile string `yaml:"password_file"`
}

// defaultRefreshInterval is images.refresh_interval's default.
const defaultRefreshInterval = time.Hour

// openImages opens the image store of cfg. Registry passwords are read
// here, once; an error names the registry, never the password.
func openImages(cfg *Config, log *slog.Logger) (*images.Store, error) {
	c := cfg.Images
	creds := make(map[string]images.Credential, len(c.Registries))
	for host, r := range c.Registries {
		if r.Username == "" || r.PasswordFile == "" {
			return nil, fmt.Errorf("config: images.registries.%s: username and password_file are required", host)
		}
		b, err := os.ReadFile(r.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("config: images.registries.%s.password_file: %w", host, err)
		}
		creds[host] = images.Credential{Username: r.Username, Password: strings.TrimRight(string(b), "\r\n")}
	}
	s, err := images.Open(images.Config{
		Dir:           cmp.Or(c.Dir, filepath.Join(cfg.DataDir, "images")),
		MaxBytes:      c.MaxBytes,
		MaxImageBytes: c.MaxImageBytes,
		PullTimeout:   c.PullTimeout,
		DockerConfig:  c.DockerConfig,
		Registries:    creds,
		Insecure:      c.Insecure,
		Log:           log,
	})
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	return s, nil
}

// localImages is the image store as the local provider takes it.
type localImages struct{ s *images.Store }

func (li localImages) Acquire(ctx context.Context, ref string) (local.RootImage, func(), error) {
	if !images.IsRef(ref) {
		return local.RootImage{}, nil, fmt.Errorf("%w: not an image reference", providers.ErrImageUnavailable)
	}
	img, release, err := li.s.Acquire(ctx, ref)
	if err != nil {
		return local.RootImage{}, nil, imageError(err)
	}
	return local.RootImage{
		Digest:     img.Digest,
		Layers:     img.Layers,
		Env:        img.Config.Env,
		WorkingDir: img.Config.WorkingDir,
		User:       img.Config.User,
	}, release, nil
}

// imageError marks the store's errors that no retry mends (the client
// must pick another image) as providers.ErrImageUnavailable; the rest
// (the registry refused our login, the network, a timeout) are the
// operator's or passing.
func imageError(err error) error {
	if errors.Is(err, images.ErrNotFound) || errors.Is(err, images.ErrTooLarge) {
		return fmt.Errorf("%w: %w", providers.ErrImageUnavailable, err)
	}
	return err
}

// adminImages is the image store as the operator API uses it
// (admin.Images).
type adminImages struct{ s *images.Store }

// ResolveImages resolves the OCI references of an instance's scope when
// the operator sets it: a tag is pinned to its digest from then until the
// next refresh, and a reference no registry knows is refused at once
// rather than at the first acquire.
func (a adminImages) ResolveImages(ctx context.Context, kind string, refs []string) error {
	if kind != "local" {
		return nil // Modal and Fly pull their images themselves
	}
	for _, ref := range refs {
		if !images.IsRef(ref) {
			continue // "host", or another provider's image name
		}
		if _, err := a.s.Resolve(ctx, ref); err != nil {
			return fmt.Errorf("image %s: %w", ref, adminImageError(err))
		}
	}
	return nil
}

func (a adminImages) Pull(ctx context.Context, ref string, progress func(string)) (adminapi.Image, error) {
	img, err := a.s.Pull(ctx, ref, progress)
	if err != nil {
		return adminapi.Image{}, adminImageError(err)
	}
	for _, e := range a.s.List() {
		if e.Digest == img.Digest {
			return toAdminImage(e), nil
		}
	}
	return adminapi.Image{Ref: img.Ref, Digest: img.Digest, Size: img.Size}, nil
}

func (a adminImages) List() []adminapi.Image {
	var out []adminapi.Image
	for _, e := range a.s.List() {
		out = append(out, toAdminImage(e))
	}
	return out
}

func (a adminImages) Remove(ctx context.Context, refOrDigest string) error {
	return adminImageError(a.s.Remove(ctx, refOrDigest))
}

func toAdminImage(e images.Entry) adminapi.Image {
	return adminapi.Image{Ref: e.Ref, Digest: e.Digest, Size: e.Size, LastUsed: e.LastUsed.UTC(), InUse: e.InUse}
}

// adminImageError marks the store's errors the operator API answers in
// its own way.
func adminImageError(err error) error {
	switch {
	case errors.Is(err, images.ErrNotFound):
		return fmt.Errorf("%w: %w", admin.ErrImageNotFound, err)
	case errors.Is(err, images.ErrInUse):
		return fmt.Errorf("%w: %w", admin.ErrImageInUse, err)
	}
	return err
}

// refreshImages re-resolves every remembered tag each interval until ctx
// ends.
func refreshImages(ctx context.Context, s *images.Store, every time.Duration, log *slog.Logger) {
	if every < 0 {
		return
	}
	tick.Every(ctx, cmp.Or(every, defaultRefreshInterval), func() bool {
		if err := s.Refresh(ctx); err != nil {
			log.Warn("image tags not refreshed", sandgate.KeyError, err)
		}
		return true
	})
}
