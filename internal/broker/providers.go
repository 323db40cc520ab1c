package broker

import (
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/flymachines"
	"github.com/sandgate/sandgate/providers/flysprites"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/modal"
	"github.com/sandgate/sandgate/providers/noop"
)

// kinds is the one table of the provider kinds this binary runs: a kind
// a config names that is not here fails at startup. Tests build
// registries of their own. ex is the broker's egress proxy, which the
// local provider's workspaces reach the network through.
func kinds(ex local.Egress) providers.Registry {
	return providers.Registry{
		"local":        local.Opener(ex),
		"modal":        modal.Open,
		"fly-machines": flymachines.Open,
		"fly-sprites":  flysprites.Open,
		noop.Kind:      noop.Open, // load tests only: never a default, warns at startup
	}
}
