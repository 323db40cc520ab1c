package providers_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/fakeprovider"
	"github.com/sandgate/sandgate/providers"
)

// settings returns the mapping node of a YAML document.
func settings(t *testing.T, doc string) yaml.Node {
	t.Helper()
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(doc), &n); err != nil {
		t.Fatal(err)
	}
	return *n.Content[0]
}

// registry has a "fake" kind whose settings take one field, and records
// every provider it opened.
func registry(opened *[]*fakeprovider.Provider) providers.Registry {
	return providers.Registry{
		"fake": func(_ context.Context, _ string, raw yaml.Node, _ providers.Env) (providers.Provider, error) {
			var s struct {
				Region string `yaml:"region"`
			}
			if err := providers.DecodeSettings(raw, &s); err != nil {
				return nil, err
			}
			if s.Region == "broken" {
				return nil, errors.New("region: no such region")
			}
			p := fakeprovider.New()
			*opened = append(*opened, p)
			return p, nil
		},
	}
}

func TestRegistryOpen(t *testing.T) {
	tests := []struct {
		name    string
		cfgs    func(t *testing.T) []providers.Config
		def     string
		wantErr []string // words the error must hold; nil: opens
	}{
		{"two", func(t *testing.T) []providers.Config {
			return []providers.Config{{Name: "a", Kind: "fake"}, {Name: "b", Kind: "fake", Settings: settings(t, "region: ams")}}
		}, "b", nil},
		{"unknown kind", func(t *testing.T) []providers.Config {
			return []providers.Config{{Name: "a", Kind: "fake"}, {Name: "m", Kind: "modal"}}
		}, "a", []string{`"m"`, `"modal"`, "fake"}},
		{"duplicate name", func(t *testing.T) []providers.Config {
			return []providers.Config{{Name: "a", Kind: "fake"}, {Name: "a", Kind: "fake"}}
		}, "a", []string{`"a"`, "twice"}},
		{"unknown setting", func(t *testing.T) []providers.Config {
			return []providers.Config{{Name: "a", Kind: "fake"}, {Name: "b", Kind: "fake", Settings: settings(t, "regoin: ams")}}
		}, "a", []string{`"b"`, "regoin"}},
		{"opener fails", func(t *testing.T) []providers.Config {
			return []providers.Config{{Name: "a", Kind: "fake"}, {Name: "b", Kind: "fake", Settings: settings(t, "region: broken")}}
		}, "a", []string{`"b"`, "region"}},
		{"bad name", func(t *testing.T) []providers.Config {
			return []providers.Config{{Name: "A/b", Kind: "fake"}}
		}, "A/b", []string{`"A/b"`}},
		{"default not configured", func(t *testing.T) []providers.Config {
			return []providers.Config{{Name: "a", Kind: "fake"}}
		}, "z", []string{`"z"`, "default_provider"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opened []*fakeprovider.Provider
			set, err := registry(&opened).Open(context.Background(), tt.cfgs(t), tt.def, providers.Env{})
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				if got := set.Names(); len(got) != 2 || got[0] != "a" || got[1] != "b" || set.Default() != tt.def {
					t.Errorf("Names() = %v, Default() = %q; want [a b], %q", got, set.Default(), tt.def)
				}
				if err := set.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				for i, p := range opened {
					if !p.Closed() {
						t.Errorf("provider %d not closed by Set.Close", i)
					}
				}
				return
			}
			if err == nil {
				t.Fatalf("Open succeeded; want an error naming %v", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Open error %q does not name %s", err, w)
				}
			}
			for i, p := range opened {
				if !p.Closed() {
					t.Errorf("provider %d opened before the failure was not closed", i)
				}
			}
		})
	}
}

func TestSetLookup(t *testing.T) {
	a, b := fakeprovider.New(), fakeprovider.New()
	set, err := providers.NewSet("b", providers.Entry{Name: providers.LegacyName, Provider: a, AcceptNew: true},
		providers.Entry{Name: "b", Provider: b})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		lookup func() (*providers.Entry, error)
		want   providers.Provider // nil: ErrUnknownProvider
	}{
		{func() (*providers.Entry, error) { return set.Get("") }, a}, // records older than names
		{func() (*providers.Entry, error) { return set.Get("b") }, b},
		{func() (*providers.Entry, error) { return set.ForInstance("") }, b}, // the default
		{func() (*providers.Entry, error) { return set.ForInstance(providers.LegacyName) }, a},
		{func() (*providers.Entry, error) { return set.Get("gone") }, nil},
	}
	for i, tt := range tests {
		e, err := tt.lookup()
		switch {
		case tt.want == nil && !errors.Is(err, providers.ErrUnknownProvider):
			t.Errorf("lookup %d: err = %v; want ErrUnknownProvider", i, err)
		case tt.want != nil && (err != nil || e.Provider != tt.want):
			t.Errorf("lookup %d: got %v, %v; want provider %p", i, e, err, tt.want)
		}
	}
	if e, _ := set.Get("b"); e.AcceptNew {
		t.Errorf("b.AcceptNew = true; want false as configured")
	}
}

func TestCheckScope(t *testing.T) {
	sizes := []sandgate.Size{{Name: "small", CPUCores: 1, MemoryMiB: 512}, {Name: "standard", CPUCores: 2, MemoryMiB: 2048}}
	none := providers.Capabilities{Egress: providers.EgressNoneOnly, Sizes: sizes, Images: []string{"host"}, DefaultImage: "host"}
	native := providers.Capabilities{Egress: providers.EgressNative, Sizes: sizes, DefaultImage: "debian:12"}
	tests := []struct {
		name  string
		caps  providers.Capabilities
		scope sandgate.Scope
		field string // "" when the provider can enforce it
	}{
		{"no network on none", none, sandgate.Scope{EgressCeiling: []string{}}, ""},
		{"domains on none", none, sandgate.Scope{EgressCeiling: []string{"github.com"}}, "egress_ceiling"},
		{"any domain on none", none, sandgate.Scope{}, "egress_ceiling"},
		{"any domain on native", native, sandgate.Scope{}, ""},
		{"size it runs", native, sandgate.Scope{Sizes: []string{"small"}}, ""},
		{"size it does not run", native, sandgate.Scope{Sizes: []string{"small", "xlarge"}}, "sizes"},
		{"default size it does not run", native, sandgate.Scope{DefaultSize: "large"}, "sizes"},
		{"image it does not run", none, sandgate.Scope{EgressCeiling: []string{}, Images: []string{"debian:12"}}, "images"},
		{"default image it does not run", none, sandgate.Scope{EgressCeiling: []string{}, DefaultImage: "debian:12"}, "default_image"},
		{"any image on native", native, sandgate.Scope{Images: []string{"a:1", "b:2"}, DefaultImage: "a:1"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.caps.CheckScope("p1", tt.scope)
			var se *providers.ScopeError
			switch {
			case tt.field == "" && err != nil:
				t.Errorf("CheckScope = %v; want nil", err)
			case tt.field != "" && (!errors.As(err, &se) || se.Field != tt.field || se.Provider != "p1"):
				t.Errorf("CheckScope = %v; want a ScopeError of p1 on %s", err, tt.field)
			}
		})
	}
}

func TestEffectiveScope(t *testing.T) {
	caps := providers.Capabilities{Sizes: []sandgate.Size{{Name: "small", CPUCores: 1, MemoryMiB: 512}}, DefaultImage: "host"}
	got := caps.Effective(sandgate.Scope{})
	if len(got.Sizes) != 1 || got.Sizes[0] != "small" || got.DefaultImage != "host" {
		t.Errorf("Effective(empty) = sizes %v, image %q; want [small], host", got.Sizes, got.DefaultImage)
	}
	got = caps.Effective(sandgate.Scope{Sizes: []string{"small"}, DefaultImage: "x"})
	if got.DefaultImage != "x" {
		t.Errorf("Effective kept image %q; want x", got.DefaultImage)
	}

	// The ceiling is what the provider enforces: any on a domain filter,
	// [] on a provider that has none, whatever the instance was set with.
	for _, mode := range []providers.EgressMode{providers.EgressNative, providers.EgressProxy} {
		caps.Egress = mode
		if got := caps.Effective(sandgate.Scope{EgressCeiling: nil}); got.EgressCeiling != nil {
			t.Errorf("%v: Effective ceiling = %q; want null kept", mode, got.EgressCeiling)
		}
		if got := caps.Effective(sandgate.Scope{EgressCeiling: []string{"a.example"}}); len(got.EgressCeiling) != 1 {
			t.Errorf("%v: Effective ceiling = %q; want [a.example] kept", mode, got.EgressCeiling)
		}
	}
	caps.Egress = providers.EgressNoneOnly
	for _, c := range [][]string{nil, {"a.example"}} {
		if got := caps.Effective(sandgate.Scope{EgressCeiling: c}); got.EgressCeiling == nil || len(got.EgressCeiling) != 0 {
			t.Errorf("none: Effective(ceiling %q) = %q; want []", c, got.EgressCeiling)
		}
	}
}
