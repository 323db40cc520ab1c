package broker

import (
	"strings"
	"testing"
)

// TestConfigErrorsNameThePath: a refused config names the YAML path of the
// problem and, where there is a choice, the allowed values, and never a Go
// type.
func TestConfigErrorsNameThePath(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"unknown default size", "defaults: {default_size: huge}\n",
			[]string{`defaults.default_size: "huge" is not a size; allowed: small, standard, large, xlarge`}},
		{"unknown size", "defaults: {sizes: [small, huge]}\n", []string{`defaults.sizes[1]: "huge" is not a size; allowed: small`}},
		{"default size not allowed", "defaults:\n  sizes: [small]\n  default_size: large\n",
			[]string{`defaults.default_size: "large" is not among defaults.sizes; allowed: small`}},
		{"unknown nested key", "admission:\n  risk:\n    max_sise: large\n", []string{`line 3: admission.risk.max_sise: unknown key "max_sise"`}},
		{"not a duration", "shutdown_timeout: soon\n", []string{`line 1: shutdown_timeout: "soon" is not a valid duration`}},
		{"not an integer", "admission:\n  inflight: {per_workspace: many}\n", []string{`admission.inflight.per_workspace: "many" is not a valid integer`}},
		{"accept_new not a boolean", "providers:\n  - {name: a, kind: local, accept_new: maybe}\n", []string{`accept_new: "maybe" is not a valid boolean`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadYAML(t, tt.yaml, nil)
			if err == nil {
				t.Fatalf("LoadConfig(%q) succeeded; want %v", tt.yaml, tt.want)
			}
			wantNaming(t, err, tt.want)
			for _, goType := range []string{"broker.", "struct {", "time.Duration", "int64", "!!str"} {
				if strings.Contains(err.Error(), goType) {
					t.Errorf("LoadConfig(%q) = %q; names the Go type %q", tt.yaml, err, goType)
				}
			}
		})
	}
}
