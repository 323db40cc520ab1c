package local

import (
	"context"
	"path/filepath"

	"go.yaml.in/yaml/v3"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
)

// Settings is the kind-specific block of a `kind: local` provider in the
// broker's config. A zero field means the default noted beside it.
type Settings struct {
	// BwrapPath is the bwrap binary; "" means bwrap on PATH.
	BwrapPath string `yaml:"bwrap_path"`
}

// Open opens a local provider from its config block. Its workspaces live
// under the broker's data directory: data_dir/local for the provider
// named "local" (as before providers had names), data_dir/local-NAME for
// any other.
func Open(ctx context.Context, name string, raw yaml.Node, env providers.Env) (providers.Provider, error) {
	var s Settings
	if err := providers.DecodeSettings(raw, &s); err != nil {
		return nil, err
	}
	dir := "local"
	if name != providers.LegacyName {
		dir = "local-" + name
	}
	p, err := New(ctx, Config{DataDir: filepath.Join(env.DataDir, dir), BwrapPath: s.BwrapPath}, env)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Capabilities implements providers.Provider: no network at all (until
// the egress proxy lands), the broker's reaper and each workspace's
// supervisor end workspaces at their deadlines, snapshots and durable
// commands are its own, and the one image is the host's /usr.
func (p *Provider) Capabilities() providers.Capabilities {
	return providers.Capabilities{
		Egress:         providers.EgressNoneOnly,
		VendorLifetime: true, // the detached supervisor ends it at expires_at with no broker alive
		Snapshots:      true,
		NativeCommands: true,
		Sizes:          sandgate.StandardSizes,
		Images:         []string{Image},
		DefaultImage:   Image,
	}
}

// Close implements providers.Provider. Workspaces and durable commands
// outlive the process by design; execs in flight end with their requests.
func (p *Provider) Close() error { return nil }
