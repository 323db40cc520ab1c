// Package images keeps a content-addressed store of OCI images pulled from
// registries and unpacked once per layer digest into overlayfs lower dirs.
package images

import (
	"errors"
	"log/slog"
	"time"
)

// Defaults for the zero fields of [Config].
const (
	DefaultMaxBytes      = 20 << 30
	DefaultMaxImageBytes = 4 << 30
	DefaultPullTimeout   = 10 * time.Minute
)

// Config of the image store. Zero fields mean the defaults noted.
type Config struct {
	Dir           string                // content store root, <data_dir>/images; required
	MaxBytes      int64                 // cache bound (unpacked bytes); 0 = 20 GiB
	MaxImageBytes int64                 // one image's compressed size bound; 0 = 4 GiB
	PullTimeout   time.Duration         // 0 = 10m
	DockerConfig  string                // path of a Docker config.json with registry auths; "" = none
	Registries    map[string]Credential // per registry host: credentials (override DockerConfig)
	Insecure      []string              // registry hosts reached over plain HTTP (tests: 127.0.0.1:port)
	Platform      string                // "linux/amd64" style; "" = runtime.GOOS/GOARCH
	Log           *slog.Logger          // never gets credentials; refs and digests are fine
}

// Credential is a registry login. Its Password is never logged.
type Credential struct{ Username, Password string }

// Image is a pulled image, ready to be mounted.
type Image struct {
	Ref    string // as asked
	Digest string // manifest digest
	// Layers are absolute dirs of the unpacked layers, bottom first, each
	// ready to be an overlayfs lowerdir (see docs/images.md).
	Layers []string
	Config ImageConfig
	Size   int64 // unpacked bytes
}

// ImageConfig is the part of an image's config a workspace runs with.
type ImageConfig struct {
	Env        []string
	WorkingDir string
	User       string
	Entrypoint []string
	Cmd        []string
}

// Entry describes one cached image for [Store.List].
type Entry struct {
	Ref      string
	Digest   string
	Size     int64
	LastUsed time.Time
	InUse    int
}

// Errors the callers map to protocol codes.
var (
	// ErrNotFound means the registry has no such image or tag.
	ErrNotFound = errors.New("image not found")
	// ErrTooLarge means the image is over MaxImageBytes (compressed) or
	// does not fit the cache bound unpacked.
	ErrTooLarge = errors.New("image too large")
	// ErrUnauthorized means the registry refused the credentials; the
	// error's text names the registry host only.
	ErrUnauthorized = errors.New("registry refused the credentials")
	// ErrInUse means [Store.Remove] was asked to remove an acquired image.
	ErrInUse = errors.New("image in use")
)
