package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// refuseUnknownSubcommands makes every command group under root (a
// command with subcommands and nothing to run of its own) refuse an
// unknown subcommand with a non-zero exit and a suggestion, instead of
// printing its help and exiting 0: a runbook's mistyped `admin stp on`
// must fail, not "succeed". A group called alone still prints its help.
// The root command does this already (cobra's own check).
func refuseUnknownSubcommands(root *cobra.Command) {
	for _, c := range root.Commands() {
		refuseUnknownSubcommands(c)
		if !c.HasSubCommands() || c.Runnable() {
			continue
		}
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			if cmd.SuggestionsMinimumDistance <= 0 {
				cmd.SuggestionsMinimumDistance = 2
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			} else {
				msg += "; run '" + cmd.CommandPath() + " --help' for its commands"
			}
			return usageErr(errors.New(msg))
		}
	}
}
