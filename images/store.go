package images

import (
	"context"
	"errors"
)

// Store is the image store. Its methods are safe for concurrent use.
type Store struct {
	cfg Config
}

// Open opens (creating if needed) the store under cfg.Dir.
func Open(cfg Config) (*Store, error) {
	if cfg.Dir == "" {
		return nil, errors.New("images: Dir is required")
	}
	return &Store{cfg: cfg}, nil
}

// IsRef reports whether s names an OCI image (not "host" or another
// provider-internal name).
func IsRef(s string) bool { return false }

// Resolve returns the digest ("sha256:…") of ref's manifest for the
// platform (a digest ref returns itself without a registry call). Tag to
// digest answers are remembered (persisted under Dir) until Refresh.
func (s *Store) Resolve(ctx context.Context, ref string) (string, error) {
	return "", errors.New("images: not implemented")
}

// Refresh re-resolves every remembered tag.
func (s *Store) Refresh(ctx context.Context) error { return nil }

// Pull makes ref (tag or digest) present: manifest, config, every layer
// verified by digest and unpacked once per layer digest. Concurrent calls
// for one image pull it once. progress, when not nil, gets human lines
// without secrets.
func (s *Store) Pull(ctx context.Context, ref string, progress func(string)) (Image, error) {
	return Image{}, errors.New("images: not implemented")
}

// Acquire pins a pulled image against eviction while a workspace uses it
// (pulling it first if needed); release is safe to call more than once.
func (s *Store) Acquire(ctx context.Context, ref string) (img Image, release func(), err error) {
	return Image{}, func() {}, errors.New("images: not implemented")
}

// List returns the cached images, most recently used first.
func (s *Store) List() []Entry { return nil }

// Remove deletes an image and the layers no other image shares. It
// refuses an image in use with [ErrInUse].
func (s *Store) Remove(ctx context.Context, refOrDigest string) error {
	return errors.New("images: not implemented")
}
