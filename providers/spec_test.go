package providers_test

import (
	"testing"

	"github.com/sandgate/sandgate/providers"
)

func TestExecSpecCheck(t *testing.T) {
	tests := []struct {
		name string
		spec providers.ExecSpec
		ok   bool
	}{
		{"plain", providers.ExecSpec{Argv: []string{"true"}}, true},
		{"dir", providers.ExecSpec{Argv: []string{"true"}, Dir: "/workspace"}, true},
		{"empty argv", providers.ExecSpec{}, false},
		{"NUL in argv", providers.ExecSpec{Argv: []string{"echo", "a\x00b"}}, false},
		{"relative dir", providers.ExecSpec{Argv: []string{"true"}, Dir: "workspace"}, false},
		{"NUL in dir", providers.ExecSpec{Argv: []string{"true"}, Dir: "/a\x00b"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.spec.Check(); (err == nil) != tt.ok {
				t.Errorf("Check() = %v; want ok %v", err, tt.ok)
			}
		})
	}
}
