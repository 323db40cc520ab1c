package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admin"
)

// adminFlags are shared by every `sandgate admin` command.
type adminFlags struct {
	url, token, output string
}

func (f *adminFlags) client() (*admin.Client, error) {
	u, t := f.url, f.token
	if u == "" {
		u = os.Getenv("SANDGATE_ADMIN_URL")
	}
	if t == "" {
		t = os.Getenv("SANDGATE_ADMIN_TOKEN")
	}
	if u == "" {
		return nil, fmt.Errorf("the operator API's URL is required (--url or SANDGATE_ADMIN_URL)")
	}
	return admin.NewClient(u, sandgate.Secret(t), nil)
}

// print writes v as JSON with -o json, else the plain value alone.
func (f *adminFlags) print(w io.Writer, v any, plain string) error {
	switch f.output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "", "text":
		_, err := fmt.Fprintln(w, plain)
		return err
	}
	return fmt.Errorf("-o %q: want json or text", f.output)
}

func adminCommand() *cobra.Command {
	f := &adminFlags{}
	cmd := &cobra.Command{Use: "admin", Short: "Drive the operator API (accounts, instances, tokens)"}
	cmd.PersistentFlags().StringVar(&f.url, "url", "", "operator API URL (default $SANDGATE_ADMIN_URL)")
	cmd.PersistentFlags().StringVar(&f.token, "token", "", "operator token (default $SANDGATE_ADMIN_TOKEN)")
	cmd.PersistentFlags().StringVarP(&f.output, "output", "o", "", "output format: text (default) or json")
	cmd.AddCommand(accountCommand(f), instanceCommand(f), tokenCommand(f))
	return cmd
}

func accountCommand(f *adminFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "account", Short: "Create and list accounts"}
	var name string
	create := &cobra.Command{
		Use: "create", Short: "Create an account; prints its id",
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			var a admin.Account
			if err := c.Do(cmd.Context(), http.MethodPost, "/accounts", admin.CreateAccountRequest{Name: name}, &a); err != nil {
				return err
			}
			return f.print(cmd.OutOrStdout(), a, a.ID)
		},
	}
	create.Flags().StringVar(&name, "name", "", "account name (required)")
	_ = create.MarkFlagRequired("name")
	list := &cobra.Command{
		Use: "list", Short: "List accounts",
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			var as []admin.Account
			if err := c.Do(cmd.Context(), http.MethodGet, "/accounts", nil, &as); err != nil {
				return err
			}
			plain := ""
			for i, a := range as {
				if i > 0 {
					plain += "\n"
				}
				plain += a.ID + "\t" + a.Name
			}
			return f.print(cmd.OutOrStdout(), as, plain)
		},
	}
	cmd.AddCommand(create, list)
	return cmd
}

func instanceCommand(f *adminFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "instance", Short: "Create and inspect instances and their scope"}
	var req admin.CreateInstanceRequest
	var durs struct{ lifetime, idle, maxExec, defExec, snapTTL time.Duration }
	var ceiling []string
	create := &cobra.Command{
		Use: "create", Short: "Create an instance; prints its id",
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			l := &req.Scope.Limits
			l.MaxLifetimeSeconds = int64(durs.lifetime / time.Second)
			l.IdleTimeoutSeconds = int64(durs.idle / time.Second)
			l.MaxExecTimeoutSeconds = int64(durs.maxExec / time.Second)
			l.DefaultExecTimeoutSeconds = int64(durs.defExec / time.Second)
			l.SnapshotTTLSeconds = int64(durs.snapTTL / time.Second)
			if cmd.Flags().Changed("egress-ceiling") {
				cl := []string{}
				for _, d := range ceiling {
					if d != "" {
						cl = append(cl, d)
					}
				}
				req.Scope.EgressCeiling = &cl
			}
			var in admin.Instance
			if err := c.Do(cmd.Context(), http.MethodPost, "/instances", req, &in); err != nil {
				return err
			}
			return f.print(cmd.OutOrStdout(), in, in.ID)
		},
	}
	fl := create.Flags()
	fl.StringVar(&req.AccountID, "account", "", "account id (required)")
	_ = create.MarkFlagRequired("account")
	fl.StringVar(&req.Name, "name", "", "instance name")
	fl.IntVar(&req.Scope.Limits.MaxConcurrentWorkspaces, "max-concurrent", 0, "max_concurrent_workspaces")
	fl.DurationVar(&durs.lifetime, "max-lifetime", 0, "max_lifetime (e.g. 1h)")
	fl.DurationVar(&durs.idle, "idle-timeout", 0, "idle_timeout (e.g. 15m)")
	fl.DurationVar(&durs.maxExec, "max-exec-timeout", 0, "max_exec_timeout")
	fl.DurationVar(&durs.defExec, "default-exec-timeout", 0, "default_exec_timeout")
	fl.IntVar(&req.Scope.Limits.MaxSnapshots, "max-snapshots", 0, "max_snapshots")
	fl.DurationVar(&durs.snapTTL, "snapshot-ttl", 0, "snapshot_ttl (e.g. 336h)")
	fl.Int64Var(&req.Scope.Limits.MaxFileBytes, "max-file-bytes", 0, "max_file_bytes")
	fl.Int64Var(&req.Scope.Limits.MaxOutputBytes, "max-output-bytes", 0, "max_output_bytes")
	fl.IntVar(&req.Scope.Limits.MaxEnvEntries, "max-env-entries", 0, "max_env_entries")
	fl.IntVar(&req.Scope.Limits.MaxEgressDomains, "max-egress-domains", 0, "max_egress_domains")
	fl.StringSliceVar(&req.Scope.Sizes, "sizes", nil, "allowed sizes, comma-separated (small,standard,large,xlarge)")
	fl.StringVar(&req.Scope.DefaultSize, "default-size", "", "default size")
	fl.StringSliceVar(&req.Scope.Images, "images", nil, "allowed images, comma-separated")
	fl.StringVar(&req.Scope.DefaultImage, "default-image", "", "default image")
	fl.StringSliceVar(&ceiling, "egress-ceiling", nil, "egress ceiling: comma-separated domains or *.domains; empty for no network")
	fl.BoolVar(&req.Scope.AnyEgress, "any-egress", false, "egress ceiling null: any valid domain")

	get := &cobra.Command{
		Use: "get ID", Short: "Show an instance and its scope", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			var in admin.Instance
			if err := c.Do(cmd.Context(), http.MethodGet, "/instances/"+url.PathEscape(args[0]), nil, &in); err != nil {
				return err
			}
			if f.output == "" || f.output == "text" {
				f.output = "json" // the scope has no one-line form
			}
			return f.print(cmd.OutOrStdout(), in, "")
		},
	}
	var acct string
	list := &cobra.Command{
		Use: "list", Short: "List instances",
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			var ins []admin.Instance
			if err := c.Do(cmd.Context(), http.MethodGet, "/instances?account="+url.QueryEscape(acct), nil, &ins); err != nil {
				return err
			}
			plain := ""
			for i, in := range ins {
				if i > 0 {
					plain += "\n"
				}
				plain += in.ID + "\t" + in.AccountID + "\t" + in.Name
			}
			return f.print(cmd.OutOrStdout(), ins, plain)
		},
	}
	list.Flags().StringVar(&acct, "account", "", "only this account's instances")
	cmd.AddCommand(create, get, list)
	return cmd
}

func tokenCommand(f *adminFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Issue, rotate, end grace, revoke and list an instance's tokens"}
	var inst string
	var ttl, grace time.Duration
	issue := func(use, short, path string) *cobra.Command {
		c := &cobra.Command{
			Use: use, Short: short,
			RunE: func(cmd *cobra.Command, _ []string) error {
				cl, err := f.client()
				if err != nil {
					return err
				}
				var out admin.IssuedToken
				req := admin.IssueTokenRequest{TTLSeconds: int64(ttl / time.Second), GraceSeconds: int64(grace / time.Second)}
				if err := cl.Do(cmd.Context(), http.MethodPost, "/instances/"+url.PathEscape(inst)+path, req, &out); err != nil {
					return err
				}
				return f.print(cmd.OutOrStdout(), out, out.Token)
			},
		}
		c.Flags().StringVar(&inst, "instance", "", "instance id (required)")
		_ = c.MarkFlagRequired("instance")
		c.Flags().DurationVar(&ttl, "ttl", 0, "token lifetime (0: never expires)")
		return c
	}
	count := func(use, short, path string) *cobra.Command {
		c := &cobra.Command{
			Use: use, Short: short,
			RunE: func(cmd *cobra.Command, _ []string) error {
				cl, err := f.client()
				if err != nil {
					return err
				}
				var out admin.Count
				if err := cl.Do(cmd.Context(), http.MethodPost, "/instances/"+url.PathEscape(inst)+path, nil, &out); err != nil {
					return err
				}
				return f.print(cmd.OutOrStdout(), out, fmt.Sprint(out.Count))
			},
		}
		c.Flags().StringVar(&inst, "instance", "", "instance id (required)")
		_ = c.MarkFlagRequired("instance")
		return c
	}
	rotate := issue("rotate", "Issue a new token and supersede the others after a grace period; prints the token", "/tokens/rotate")
	rotate.Flags().DurationVar(&grace, "grace", 0, "grace period of the superseded tokens (0: the broker's default)")
	list := &cobra.Command{
		Use: "list", Short: "List an instance's tokens (prefixes and states only)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := f.client()
			if err != nil {
				return err
			}
			var out []admin.Lease
			if err := cl.Do(cmd.Context(), http.MethodGet, "/instances/"+url.PathEscape(inst)+"/tokens", nil, &out); err != nil {
				return err
			}
			plain := ""
			for i, l := range out {
				if i > 0 {
					plain += "\n"
				}
				plain += l.ID + "\t" + l.TokenPrefix + "…\t" + l.State
			}
			return f.print(cmd.OutOrStdout(), out, plain)
		},
	}
	list.Flags().StringVar(&inst, "instance", "", "instance id (required)")
	_ = list.MarkFlagRequired("instance")
	cmd.AddCommand(
		issue("issue", "Issue a token for an instance; prints the token (shown once)", "/tokens"),
		rotate,
		count("end-grace", "End the grace period of superseded tokens now; prints how many", "/tokens/end-grace"),
		count("revoke", "Revoke every token of the instance now; prints how many", "/tokens/revoke"),
		list,
	)
	return cmd
}
