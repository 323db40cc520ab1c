package broker

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

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
// local provider's workspaces reach the network through, imgs the image
// store its workspaces on OCI images run on.
func kinds(ex local.Egress, imgs local.Images) providers.Registry {
	return providers.Registry{
		"local":        local.Opener(ex, imgs),
		"modal":        modal.Open,
		"fly-machines": flymachines.Open,
		"fly-sprites":  flysprites.Open,
		noop.Kind:      noop.Open, // load tests only: never a default, warns at startup
	}
}

// checkProvider decodes a provider's settings strictly into its kind's
// settings type and checks the environment variables the kind requires,
// as the kind's Open would, without dialling or creating anything.
func checkProvider(pc providers.Config, getenv func(string) string) error {
	need := func(env string) error {
		if getenv(env) == "" {
			return fmt.Errorf("%s is not set", env)
		}
		return nil
	}
	decode := func(v any) error {
		if err := providers.DecodeSettings(pc.Settings, v); err != nil {
			return yamlError(nil, err)
		}
		return nil
	}
	switch pc.Kind {
	case "local":
		var c local.Config
		return decode(&c)
	case "modal":
		var s modal.Settings
		if err := decode(&s); err != nil {
			return err
		}
		return errors.Join(need(modal.EnvTokenID), need(modal.EnvTokenSecret))
	case "fly-machines":
		var s flymachines.Settings
		if err := decode(&s); err != nil {
			return err
		}
		errs := []error{need(cmp.Or(s.TokenEnv, flymachines.EnvToken))}
		if s.App == "" {
			errs = append(errs, need(flymachines.EnvApp))
		}
		return errors.Join(errs...)
	case "fly-sprites":
		var s flysprites.Settings
		if err := decode(&s); err != nil {
			return err
		}
		return need(flysprites.EnvToken)
	case noop.Kind:
		var c noop.Config
		return decode(&c)
	}
	return fmt.Errorf("unknown kind %q; this build runs: %s", pc.Kind, strings.Join(slices.Sorted(maps.Keys(kinds(nil, nil))), ", "))
}
