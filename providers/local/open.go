package local

import (
	"context"
	"path/filepath"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
)

// Open opens a local provider from its config block: the fields of
// Config (bwrap_path, tiers, uid_base, free_reserve_mib, …), with no
// egress proxy. Its workspaces live under the broker's data directory:
// data_dir/local for the provider named "local" (as before providers had
// names), data_dir/local-NAME for any other.
func Open(ctx context.Context, name string, raw yaml.Node, env providers.Env) (providers.Provider, error) {
	return Opener(nil, nil)(ctx, name, raw, env)
}

// Opener is Open with the broker's egress proxy in the config (nil: none),
// so that workspaces may be admitted with domain allowlists, and its image
// store (nil: none), so that they may run on OCI images.
func Opener(ex Egress, imgs Images) providers.Opener {
	return func(ctx context.Context, name string, raw yaml.Node, env providers.Env) (providers.Provider, error) {
		return providers.OpenSettings(ctx, raw, env, func(ctx context.Context, c Config, _ func(string) string) (*Provider, error) {
			dir := "local"
			if name != providers.LegacyName {
				dir = "local-" + name
			}
			c.DataDir = filepath.Join(env.DataDir, dir)
			c.Egress = ex
			c.Images = imgs
			return New(ctx, c, env)
		})
	}
}

// Capabilities implements providers.Provider: domain allowlists through
// the broker's egress proxy when it has one (Config.Egress), else no
// network at all; the broker's reaper and each workspace's supervisor end
// workspaces at their deadlines, snapshots and durable commands are its
// own, and the one image is the host's /usr.
func (p *Provider) Capabilities() providers.Capabilities {
	mode := providers.EgressNoneOnly
	if p.cfg.Egress != nil {
		mode = providers.EgressProxy
	}
	return providers.Capabilities{
		Egress:         mode,
		VendorLifetime: true, // the detached supervisor ends it at expires_at with no broker alive
		Snapshots:      true,
		NativeCommands: true,
		Sizes:          p.sizes(),
		Images:         p.images(),
		DefaultImage:   Image,
	}
}

// sizes are the standard tiers with this host's disk quota of each.
func (p *Provider) sizes() []sandgate.Size {
	out := slices.Clone(sandgate.StandardSizes)
	for i := range out {
		out[i].DiskMiB = p.DiskMiB(out[i])
	}
	return out
}
