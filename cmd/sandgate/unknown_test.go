package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// groups returns the path of every command group under c (c included).
func groups(c *cobra.Command, path []string) [][]string {
	var out [][]string
	if c.HasSubCommands() {
		out = append(out, path)
	}
	for _, s := range c.Commands() {
		if s.Name() == "help" || s.Name() == "completion" {
			continue
		}
		out = append(out, groups(s, append(append([]string{}, path...), s.Name()))...)
	}
	return out
}

// TestUnknownSubcommandFails: a typo under any command group is an error
// (a non-zero exit) naming the group and, when one is close, the command
// meant; the group alone still prints its help.
func TestUnknownSubcommandFails(t *testing.T) {
	gs := groups(rootCommand(), nil)
	if len(gs) < 10 {
		t.Fatalf("found %d command groups; want every group of the tree", len(gs))
	}
	for _, g := range gs {
		args := append(append([]string{}, g...), "zzqx")
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			root := rootCommand()
			var out bytes.Buffer
			root.SetOut(&out)
			root.SetErr(&out)
			root.SetArgs(args)
			err := root.ExecuteContext(context.Background())
			want := `unknown command "zzqx" for "` + strings.Join(append([]string{"sandgate"}, g...), " ") + `"`
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("sandgate %s = %v; want an error containing %s", strings.Join(args, " "), err, want)
			}
		})
	}
	root := rootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"admin"})
	if err := root.ExecuteContext(context.Background()); err != nil || !strings.Contains(out.String(), "Available Commands:") {
		t.Errorf("sandgate admin = %v, %q; want its help and no error", err, out.String())
	}
}

// TestMistypedStopExitsNonZero runs the real binary: `sandgate admin stp
// on` must exit non-zero and suggest stop, never print help and exit 0.
func TestMistypedStopExitsNonZero(t *testing.T) {
	t.Parallel()
	stdout, stderr, err := tryCLI([]string{"SANDGATE_ADMIN_URL=http://127.0.0.1:1", "SANDGATE_ADMIN_TOKEN=x"}, "admin", "stp", "on")
	if err == nil {
		t.Fatalf("sandgate admin stp on exited 0; stdout %q", stdout)
	}
	if want := `unknown command "stp" for "sandgate admin"; did you mean stop?`; !strings.Contains(stderr, want) {
		t.Errorf("sandgate admin stp on stderr = %q; want %q", stderr, want)
	}
}

// TestEveryCommandHasExamples: every command's help has an Examples:
// section.
func TestEveryCommandHasExamples(t *testing.T) {
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Name() == "help" || c.Name() == "completion" {
			return
		}
		if strings.TrimSpace(c.Example) == "" {
			t.Errorf("%s has no Examples: section", c.CommandPath())
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(rootCommand())
}
