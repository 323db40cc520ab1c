package broker

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConfigProviders(t *testing.T) {
	tests := []struct {
		name      string
		yaml      string
		env       map[string]string
		wantNames []string // nil when loading must fail
		wantDef   string
		wantErr   []string // words the error must hold
	}{
		{name: "no provider: the local one", yaml: "log: {level: info}\n", wantNames: []string{"local"}, wantDef: "local"},
		{name: "the old provider block", yaml: "provider:\n  name: local\n  local: {bwrap_path: /usr/bin/bwrap}\n",
			wantNames: []string{"local"}, wantDef: "local"},
		{name: "two named", yaml: "providers:\n  - {name: local, kind: local}\n  - {name: eu, kind: fake, accept_new: false, region: ams}\ndefault_provider: eu\n",
			wantNames: []string{"local", "eu"}, wantDef: "eu"},
		{name: "default from the environment", yaml: "providers:\n  - {name: a, kind: local}\n  - {name: b, kind: local}\n",
			env: map[string]string{"SANDGATE_DEFAULT_PROVIDER": "b"}, wantNames: []string{"a", "b"}, wantDef: "b"},
		{name: "both blocks", yaml: "provider: {name: local}\nproviders:\n  - {name: local, kind: local}\n", wantErr: []string{"not both"}},
		{name: "no kind", yaml: "providers:\n  - {name: x}\n", wantErr: []string{`"x"`, "kind"}},
		{name: "bad name", yaml: "providers:\n  - {name: Big_Name, kind: local}\n", wantErr: []string{"Big_Name"}},
		{name: "unknown default", yaml: "providers:\n  - {name: a, kind: local}\ndefault_provider: z\n", wantErr: []string{`"z"`}},
		{name: "noop, named the default", yaml: "providers:\n  - {name: bench, kind: noop}\ndefault_provider: bench\n",
			wantNames: []string{"bench"}, wantDef: "bench"},
		{name: "noop is never the default by accident", yaml: "providers:\n  - {name: bench, kind: noop}\n  - {name: local, kind: local}\n",
			wantErr: []string{`"bench"`, "noop", "default_provider"}},
		{name: "accept_new not a bool", yaml: "providers:\n  - {name: a, kind: local, accept_new: maybe}\n", wantErr: []string{`"a"`, "accept_new"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := loadCase(t, tt.yaml, tt.env, tt.wantNames == nil, tt.wantErr)
			if cfg == nil {
				return
			}
			var names []string
			for _, p := range cfg.providers {
				names = append(names, p.Name)
			}
			if strings.Join(names, ",") != strings.Join(tt.wantNames, ",") || cfg.DefaultProvider != tt.wantDef {
				t.Errorf("providers %v, default %q; want %v, %q", names, cfg.DefaultProvider, tt.wantNames, tt.wantDef)
			}
		})
	}
}

// TestServeRefusesBadProviders: a provider kind this build lacks, or
// settings its kind does not know, stop the broker at startup with a
// message naming the provider and the field.
func TestServeRefusesBadProviders(t *testing.T) {
	tests := []struct {
		name, providers string
		want            []string
	}{
		{"unknown kind", "  - {name: k1, kind: k8s}\n", []string{`"k1"`, `"k8s"`, "fly-machines, fly-sprites, local, modal"}},
		{"modal without its token", "  - {name: m1, kind: modal}\n", []string{`"m1"`, "MODAL_TOKEN_ID"}},
		{"unknown modal setting", "  - {name: m2, kind: modal, token: x}\n", []string{`"m2"`, "token"}},
		{"unknown setting", "  - {name: l2, kind: local, bwrap: /x}\n", []string{`"l2"`, "bwrap"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "c.yaml")
			y := "data_dir: " + dir + "\ntls: {trusted_proxies: [127.0.0.1]}\nproviders:\n" + tt.providers
			if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := LoadConfig(path, func(string) string { return "" })
			if err != nil {
				t.Fatalf("loadConfig: %v", err)
			}
			b, err := New(t.Context(), *cfg, Options{Log: discardLogger(), Getenv: func(string) string { return "" }})
			if err == nil {
				b.Close()
				t.Fatal("run succeeded; want a startup error")
			}
			wantNaming(t, err, tt.want)
		})
	}
}

// loadYAML loads the config yaml, with env as the environment.
func loadYAML(t *testing.T, yaml string, env map[string]string) (*Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return LoadConfig(path, func(k string) string { return env[k] })
}

// loadCase loads yaml under env for a table case. When refused is set it
// checks that loading fails with an error naming every one of wantErr, and
// returns nil; otherwise it returns the config, and stops the test if
// loading fails.
func loadCase(t *testing.T, yaml string, env map[string]string, refused bool, wantErr []string) *Config {
	t.Helper()
	cfg, err := loadYAML(t, yaml, env)
	if refused {
		if err == nil {
			t.Fatalf("loadConfig succeeded; want an error naming %v", wantErr)
		}
		wantNaming(t, err, wantErr)
		return nil
	}
	if err != nil {
		t.Fatalf("loadConfig: %v", err)
	}
	return cfg
}

// wantNaming fails t unless err's message holds every one of words: an
// operator must be able to tell which setting to fix.
func wantNaming(t *testing.T, err error, words []string) {
	t.Helper()
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not name %s", err, w)
		}
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
