package main

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
// registries of their own.
func kinds() providers.Registry {
	return providers.Registry{
		"local":        local.Open,
		"modal":        modal.Open,
		"fly-machines": flymachines.Open,
		"fly-sprites":  flysprites.Open,
		noop.Kind:      noop.Open, // load tests only: never a default, warns at startup
	}
}
