package providers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"

	"go.yaml.in/yaml/v3"
)

// LegacyName is the provider of records written before providers had
// names: the broker then ran one provider, the local one, and the old
// single `provider:` block of the config still opens it under this name.
const LegacyName = "local"

// Opener opens one provider of its kind from the kind-specific settings
// of a `providers:` entry (a YAML mapping, possibly empty). It decodes
// strictly and returns a literal nil on error; [OpenSettings] does both.
// What happens to the provider after it is the lifecycle on [Provider].
type Opener func(ctx context.Context, name string, raw yaml.Node, env Env) (Provider, error)

// OpenSettings is the body of an [Opener]: it decodes raw strictly into
// the kind's settings S (DecodeSettings) and calls open with them and the
// host's reader of vendor variables (env.Getenv, or os.Getenv when nil).
// On error it returns a literal nil, so that no nil *T hides inside a
// non-nil Provider.
func OpenSettings[S any, P Provider](ctx context.Context, raw yaml.Node, env Env, open func(ctx context.Context, s S, getenv func(string) string) (P, error)) (Provider, error) {
	var s S
	if err := DecodeSettings(raw, &s); err != nil {
		return nil, err
	}
	getenv := env.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	p, err := open(ctx, s, getenv)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Registry maps a provider kind ("local", "modal", …) to its Opener. The
// binary lists its kinds in one table (cmd/sandgate); tests build their own.
type Registry map[string]Opener

// Config is one named provider of the broker's config.
type Config struct {
	Name string
	Kind string
	// AcceptNew is false for a provider that takes no new workspaces: its
	// existing workspaces and snapshots are still served, released, reaped
	// and swept through it.
	AcceptNew bool
	// Settings is the kind-specific part of the entry (a mapping node; the
	// zero Node means none).
	Settings yaml.Node
}

// ValidName checks a provider's name: 1 to 63 characters of [a-z0-9-],
// starting with a letter or digit. It names directories and metric
// values, so nothing else is allowed.
func ValidName(name string) error {
	ok := len(name) >= 1 && len(name) <= 63 && name[0] != '-'
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = c == '-' || ('a' <= c && c <= 'z') || ('0' <= c && c <= '9')
	}
	if !ok {
		return fmt.Errorf("provider name %q: want 1 to 63 characters of a-z, 0-9 and -, not starting with -", name)
	}
	return nil
}

// ErrUnknownProvider is returned for a provider name the broker has not
// configured.
var ErrUnknownProvider = errors.New("no such provider")

// Open opens every provider of cfgs, in order, and returns them as a Set
// whose default is def. A duplicate or empty name, an unknown kind, or an
// opener's failure is an error naming the provider; what was opened before
// it is closed again.
func (r Registry) Open(ctx context.Context, cfgs []Config, def string, env Env) (*Set, error) {
	var entries []Entry
	fail := func(err error) (*Set, error) {
		for _, e := range entries {
			_ = e.Provider.Close()
		}
		return nil, err
	}
	seen := map[string]bool{}
	for _, c := range cfgs {
		if err := ValidName(c.Name); err != nil {
			return fail(fmt.Errorf("providers: %w", err))
		}
		switch {
		case seen[c.Name]:
			return fail(fmt.Errorf("providers: provider %q: name used twice", c.Name))
		}
		seen[c.Name] = true
		open, ok := r[c.Kind]
		if !ok {
			return fail(fmt.Errorf("providers: provider %q: kind %q is unknown; this build has: %s", c.Name, c.Kind, r.kinds()))
		}
		p, err := open(ctx, c.Name, c.Settings, env)
		if err != nil {
			return fail(fmt.Errorf("providers: provider %q (kind %s): %w", c.Name, c.Kind, err))
		}
		entries = append(entries, Entry{Name: c.Name, Kind: c.Kind, Provider: p, AcceptNew: c.AcceptNew})
	}
	s, err := NewSet(def, entries...)
	if err != nil {
		return fail(err)
	}
	return s, nil
}

func (r Registry) kinds() string {
	ks := make([]string, 0, len(r))
	for k := range r {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b bytes.Buffer
	for i, k := range ks {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k)
	}
	return b.String()
}

// DecodeSettings decodes a provider's settings into v strictly: a key v
// has no field for is an error. The zero Node decodes as an empty mapping.
func DecodeSettings(raw yaml.Node, v any) error {
	if raw.Kind == 0 {
		return nil
	}
	b, err := yaml.Marshal(&raw)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("settings: %w", err)
	}
	return nil
}

// Entry is one named provider of a Set.
type Entry struct {
	Name     string
	Kind     string
	Provider Provider
	// AcceptNew is whether new workspaces may be created on it.
	AcceptNew bool
}

// Set is the broker's named providers. It is read-only once built and safe
// for concurrent use.
type Set struct {
	byName map[string]*Entry
	order  []string
	def    string
}

// NewSet returns the set of entries with def as the default provider of
// instances that name none. def must be one of the entries.
func NewSet(def string, entries ...Entry) (*Set, error) {
	s := &Set{byName: map[string]*Entry{}, def: def}
	for _, e := range entries {
		if e.Name == "" || e.Provider == nil {
			return nil, errors.New("providers: an entry has no name or no provider")
		}
		if _, dup := s.byName[e.Name]; dup {
			return nil, fmt.Errorf("providers: provider %q: name used twice", e.Name)
		}
		e := e
		s.byName[e.Name] = &e
		s.order = append(s.order, e.Name)
	}
	if len(s.order) == 0 {
		return nil, errors.New("providers: no provider is configured")
	}
	if _, ok := s.byName[def]; !ok {
		return nil, fmt.Errorf("providers: default_provider %q is not one of the configured providers (%s)", def, s.names())
	}
	return s, nil
}

// Single returns a set of one provider, the default, named name: for
// tests and callers that run one provider.
func Single(name string, p Provider) *Set {
	s, err := NewSet(name, Entry{Name: name, Kind: name, Provider: p, AcceptNew: true})
	if err != nil {
		panic(err) // only an empty name or a nil provider gets here
	}
	return s
}

// Default is the name of the provider of instances that name none.
func (s *Set) Default() string { return s.def }

// Get returns the provider called name, whether or not it accepts new
// work; "" means LegacyName, the provider of records older than names.
// Returns ErrUnknownProvider.
func (s *Set) Get(name string) (*Entry, error) {
	if name == "" {
		name = LegacyName
	}
	e, ok := s.byName[name]
	if !ok {
		return nil, fmt.Errorf("provider %q: %w", name, ErrUnknownProvider)
	}
	return e, nil
}

// ForInstance returns the provider of an instance's new workspaces: the
// one it names, or the default. Returns ErrUnknownProvider.
func (s *Set) ForInstance(name string) (*Entry, error) {
	if name == "" {
		name = s.def
	}
	return s.Get(name)
}

// All returns every entry, in configuration order.
func (s *Set) All() []*Entry {
	out := make([]*Entry, 0, len(s.order))
	for _, n := range s.order {
		out = append(out, s.byName[n])
	}
	return out
}

// Names returns the configured names, in configuration order.
func (s *Set) Names() []string { return slices.Clone(s.order) }

func (s *Set) names() string {
	var b bytes.Buffer
	for i, n := range s.order {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(n)
	}
	return b.String()
}

// Close closes every provider and returns their errors joined.
func (s *Set) Close() error {
	var errs []error
	for _, n := range s.order {
		if err := s.byName[n].Provider.Close(); err != nil {
			errs = append(errs, fmt.Errorf("provider %q: %w", n, err))
		}
	}
	return errors.Join(errs...)
}
