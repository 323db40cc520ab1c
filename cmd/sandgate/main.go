// Command sandgate is the execution broker: `serve` runs it, `dev` runs it
// with zero set-up, and `admin` drives the operator API.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := rootCommand().ExecuteContext(ctx); err != nil {
		if ee := (*exitError)(nil); !errors.As(err, &ee) || !ee.silent {
			fmt.Fprintln(os.Stderr, "sandgate:", err)
		}
		os.Exit(exitCode(err))
	}
}

func rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "sandgate",
		Short:         "sandgate is an execution broker (protocol v1)",
		Long:          "sandgate is an execution broker (protocol v1).\n\n" + exitHelp + "\n\n" + outputHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       readBuildInfo().Version,
	}
	root.SetVersionTemplate(readBuildInfo().String())
	root.AddCommand(serveCommand(), devCommand(), adminCommand(), usageCommand(), versionCommand())
	root.AddCommand(operatorTokenCommand())
	root.AddCommand(rootWorkspaceCommand())
	root.AddCommand(conformanceCommand())
	refuseUnknownSubcommands(root)
	addOutputFlags(root)
	addCompletions(root)
	markUsageErrors(root)
	addExamples(root)
	return root
}
