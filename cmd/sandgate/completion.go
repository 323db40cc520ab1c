package main

import (
	"context"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
)

// Shell completion of values that live in the broker: account and
// instance ids (--account, --instance), provider names (--provider) and
// workspace ids (the ID argument of the workspace commands), each with
// its name or owner as the description. The CLI asks the operator API
// with the command's --url and --token (or their variables); when that
// fails there are no completions, and nothing is printed about it.

// completionTimeout bounds one completion's request: a shell waits on it.
const completionTimeout = 3 * time.Second

// addCompletions registers the broker-backed completions on root and
// every command under it.
func addCompletions(root *cobra.Command) {
	flags := map[string]cobra.CompletionFunc{
		"account":  completeFrom("/accounts", func(a adminapi.Account) (string, string) { return a.ID, a.Name }),
		"instance": completeFrom("/instances", func(in adminapi.Instance) (string, string) { return in.ID, in.Name + " " + in.AccountID }),
		"provider": completeFrom("/providers", func(p adminapi.Provider) (string, string) { return p.Name, p.Kind }),
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for name, fn := range flags {
			if c.LocalNonPersistentFlags().Lookup(name) != nil {
				_ = c.RegisterFlagCompletionFunc(name, fn)
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// completeWorkspaceID completes the first argument, a live workspace's
// id, described by its account and instance.
func completeWorkspaceID(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveDefault // a path, a file, an argv
	}
	var page adminapi.WorkspaceList
	listForCompletion(cmd, "/workspaces?limit=500", &page)
	return completions(page.Workspaces, func(w adminapi.Workspace) (string, string) { return w.ID, w.AccountID + " " + w.InstanceID })
}

// completeFrom returns a completion of the values the list at path
// holds, as item renders each (value and description).
func completeFrom[T any](path string, item func(T) (string, string)) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		var list []T
		listForCompletion(cmd, path, &list)
		return completions(list, item)
	}
}

func completions[T any](items []T, item func(T) (string, string)) ([]cobra.Completion, cobra.ShellCompDirective) {
	var out []cobra.Completion
	for _, it := range items {
		v, desc := item(it)
		out = append(out, cobra.CompletionWithDesc(v, desc))
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// listForCompletion reads the operator API's answer at path into dst
// with the command's URL and token, leaving dst as it is on any failure.
func listForCompletion(cmd *cobra.Command, path string, dst any) {
	u, _ := cmd.Flags().GetString("url")
	t, _ := cmd.Flags().GetString("token")
	if u == "" {
		u = os.Getenv("SANDGATE_ADMIN_URL")
	}
	if t == "" {
		t = os.Getenv("SANDGATE_ADMIN_TOKEN")
	}
	c, err := adminapi.NewClient(u, sandgate.Secret(t), &http.Client{Timeout: completionTimeout})
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
	defer cancel()
	_ = c.Do(ctx, http.MethodGet, path, nil, dst)
}
