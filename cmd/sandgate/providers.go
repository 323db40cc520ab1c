package main

import (
	"context"
	"path/filepath"

	"go.yaml.in/yaml/v3"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/flymachines"
	"github.com/sandgate/sandgate/providers/flysprites"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/modal"
)

// kinds is the one table of the provider kinds this binary runs: a kind
// a config names that is not here fails at startup. Tests build
// registries of their own. ex is the broker's egress proxy, which the
// local provider's workspaces reach the network through.
func kinds(ex local.Egress) providers.Registry {
	return providers.Registry{
		"local":        openLocal(ex),
		"modal":        modal.Open,
		"fly-machines": flymachines.Open,
		"fly-sprites":  flysprites.Open,
	}
}

// openLocal is local.Open with the broker's egress proxy in the config:
// the same settings and the same data directory (data_dir/local for the
// provider named "local", data_dir/local-NAME for any other).
func openLocal(ex local.Egress) providers.Opener {
	return func(ctx context.Context, name string, raw yaml.Node, env providers.Env) (providers.Provider, error) {
		var c local.Config
		if err := providers.DecodeSettings(raw, &c); err != nil {
			return nil, err
		}
		dir := "local"
		if name != providers.LegacyName {
			dir = "local-" + name
		}
		c.DataDir = filepath.Join(env.DataDir, dir)
		c.Egress = ex
		p, err := local.New(ctx, c, env)
		if err != nil {
			return nil, err
		}
		return p, nil
	}
}
