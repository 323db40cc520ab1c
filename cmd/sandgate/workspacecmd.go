package main

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate/adminapi"
)

// rootWorkspaceCommand is `sandgate workspace`, the same commands as
// `sandgate admin workspace`, at the top where operators debugging a
// tenant's workspace look for exec (as in the vendors' CLIs).
func rootWorkspaceCommand() *cobra.Command {
	f := &adminFlags{}
	cmd := workspaceCommand(f)
	f.addPersistent(cmd)
	return cmd
}

// workspaceCommand is `sandgate admin workspace`: single workspaces
// across accounts and instances.
func workspaceCommand(f *adminFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "workspace",
		Short: "List, show, end, exec in and copy files of single workspaces across accounts and instances",
		Example: `  sandgate admin workspace list --account "$ACCT"
  sandgate admin workspace get ws_…
  sandgate admin workspace kill ws_…   # termination_reason emergency_stopped
  sandgate workspace exec ws_… -- ls /workspace`,
	}
	var q struct {
		account, instance, provider, state, after, before string
		limit                                             int
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List workspaces (live by default) with their account, instance, provider, size, age, expiry, metered seconds and amount",
		Example: `  sandgate admin workspace list
  sandgate admin workspace list --account "$ACCT" --state all
  sandgate admin workspace list --provider local --created-after 2026-10-01T00:00:00Z -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, v := range []string{q.after, q.before} {
				if _, err := time.Parse(time.RFC3339, v); v != "" && err != nil {
					return fmt.Errorf("--created-after and --created-before take RFC 3339 times, e.g. 2026-01-02T15:04:05Z: %q", v)
				}
			}
			if q.limit < 0 {
				return fmt.Errorf("--limit must not be negative")
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			v := url.Values{}
			for k, s := range map[string]string{"account": q.account, "instance": q.instance, "provider": q.provider,
				"state": q.state, "created_after": q.after, "created_before": q.before} {
				if s != "" {
					v.Set(k, s)
				}
			}
			out := adminapi.WorkspaceList{Workspaces: []adminapi.Workspace{}}
			for {
				page := 500
				if q.limit > 0 {
					page = min(page, q.limit-len(out.Workspaces))
				}
				v.Set("limit", strconv.Itoa(page))
				var l adminapi.WorkspaceList
				if err := c.Do(cmd.Context(), http.MethodGet, "/workspaces?"+v.Encode(), nil, &l); err != nil {
					return err
				}
				out.Workspaces = append(out.Workspaces, l.Workspaces...)
				out.NextCursor = l.NextCursor
				if l.NextCursor == nil || (q.limit > 0 && len(out.Workspaces) >= q.limit) {
					break
				}
				v.Set("cursor", *l.NextCursor)
			}
			return emit(cmd, out, workspaceTable(out.Workspaces))
		},
	}
	fl := list.Flags()
	fl.StringVar(&q.account, "account", "", "only this account's workspaces")
	fl.StringVar(&q.instance, "instance", "", "only this instance's workspaces")
	fl.StringVar(&q.provider, "provider", "", "only workspaces on this provider (a name from the config's providers:)")
	fl.StringVar(&q.state, "state", "", "live (default), all, starting, running, terminating or terminated")
	fl.StringVar(&q.after, "created-after", "", "only workspaces created at or after this RFC 3339 time")
	fl.StringVar(&q.before, "created-before", "", "only workspaces created before this RFC 3339 time")
	fl.IntVar(&q.limit, "limit", 0, "at most this many rows (0: all)")

	get := &cobra.Command{
		Use:     "get ID",
		Short:   "Show one workspace, whichever account holds it",
		Example: `  sandgate admin workspace get ws_… -o json`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var w adminapi.Workspace
			if err := f.do(cmd, http.MethodGet, "/workspaces/"+url.PathEscape(args[0]), nil, &w); err != nil {
				return err
			}
			return emit(cmd, w, workspaceTable([]adminapi.Workspace{w}))
		},
	}
	kill := &cobra.Command{
		Use:   "kill ID",
		Short: "End one workspace now (termination_reason emergency_stopped); prints its state and reason",
		Long: "kill ends the workspace at once: the provider ends its sandbox, its usage is settled, and the\n" +
			"client's next call on it answers 410 workspace_gone. Killing a workspace already ended prints\n" +
			"its end again. When the provider does not confirm, the workspace stays terminating, the broker\n" +
			"retries it in the background, and kill exits non-zero (502 upstream_error).",
		Example: `  sandgate admin workspace kill ws_…`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var w adminapi.Workspace
			if err := f.do(cmd, http.MethodDelete, "/workspaces/"+url.PathEscape(args[0]), nil, &w); err != nil {
				return err
			}
			reason := "-"
			if w.TerminationReason != nil {
				reason = *w.TerminationReason
			}
			return emit(cmd, w, w.State+" "+reason)
		},
	}
	cmd.AddCommand(list, get, kill, workspaceExecCommand(f), workspaceFilesCommand(f))
	for _, c := range []*cobra.Command{get, kill} {
		c.ValidArgsFunction = completeWorkspaceID
	}
	return cmd
}

// workspaceTable renders workspaces as an aligned table with a header.
func workspaceTable(ws []adminapi.Workspace) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tACCOUNT\tINSTANCE\tPROVIDER\tSIZE\tSTATE\tAGE\tEXPIRES\tMETERED\tAMOUNT")
	for _, w := range ws {
		state := w.State
		if w.TerminationReason != nil {
			state += "/" + *w.TerminationReason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%ds\t%s %s\n", w.ID, w.AccountID, w.InstanceID, w.Provider,
			w.Size, state, time.Duration(w.AgeSeconds)*time.Second, w.ExpiresAt, w.MeteredSeconds, w.Amount, w.Currency)
	}
	tw.Flush()
	return strings.TrimRight(b.String(), "\n")
}
