package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
)

// adminFlags are shared by every `sandgate admin` command.
type adminFlags struct {
	url, token string
	timeout    time.Duration
}

func (f *adminFlags) client() (*adminapi.Client, error) {
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
	return adminapi.NewClient(u, sandgate.Secret(t), &http.Client{Timeout: f.timeout})
}

// do sends one request to the operator API with the flags' URL and token.
func (f *adminFlags) do(cmd *cobra.Command, method, path string, in, out any) error {
	c, err := f.client()
	if err != nil {
		return err
	}
	return c.Do(cmd.Context(), method, path, in, out)
}

// call sends one request with the flags' URL and token and prints its
// answer (emit), its text form as text renders it.
func call[T any](cmd *cobra.Command, f *adminFlags, method, path string, in any, text func(T) string) error {
	var out T
	if err := f.do(cmd, method, path, in, &out); err != nil {
		return err
	}
	return emit(cmd, out, text(out))
}

// accountPath is the path of the account acct's resource rest.
func accountPath(acct, rest string) string { return "/accounts/" + url.PathEscape(acct) + "/" + rest }

// accountGetCommand is a command that shows the account's rest, as text
// renders it.
func accountGetCommand[T any](f *adminFlags, use, short, rest string, text func(T) string) *cobra.Command {
	var acct string
	cmd := &cobra.Command{Use: use, Short: short, RunE: func(cmd *cobra.Command, _ []string) error {
		return call(cmd, f, http.MethodGet, accountPath(acct, rest), nil, text)
	}}
	accountFlag(cmd, &acct)
	return cmd
}

// accountPutCommand is a command that PUTs *req, whose fields the
// caller binds to flags, as the account's rest, and shows the answer as
// text renders it.
func accountPutCommand[T any](f *adminFlags, use, short, rest string, req any, text func(T) string) *cobra.Command {
	var acct string
	cmd := &cobra.Command{Use: use, Short: short, RunE: func(cmd *cobra.Command, _ []string) error {
		return call(cmd, f, http.MethodPut, accountPath(acct, rest), req, text)
	}}
	accountFlag(cmd, &acct)
	return cmd
}

// rowsOf renders a list as a table of header, one row an item.
func rowsOf[T any](header []string, row func(T) []string) func([]T) string {
	return func(items []T) string {
		var rows [][]string
		for _, it := range items {
			rows = append(rows, row(it))
		}
		return table(header, rows)
	}
}

// accountFlag adds the required --account flag to cmd.
func accountFlag(cmd *cobra.Command, acct *string) {
	cmd.Flags().StringVar(acct, "account", "", "account id (required)")
	_ = cmd.MarkFlagRequired("account")
}

// addPersistent adds the connection flags to cmd and the commands under it.
func (f *adminFlags) addPersistent(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&f.url, "url", "", "operator API URL (default $SANDGATE_ADMIN_URL)")
	cmd.PersistentFlags().StringVar(&f.token, "token", "", "operator token (default $SANDGATE_ADMIN_TOKEN)")
	cmd.PersistentFlags().DurationVar(&f.timeout, "timeout", 10*time.Minute, "bound on one request (a stop waits for its workspaces to end)")
}

func adminCommand() *cobra.Command {
	f := &adminFlags{}
	cmd := &cobra.Command{Use: "admin", Short: "Drive the operator API (accounts, instances, tokens, stops, pauses, limits, audit, billing, images)"}
	f.addPersistent(cmd)
	cmd.AddCommand(accountCommand(f), instanceCommand(f), tokenCommand(f),
		stopCommand(f), pauseCommand(f), resumeCommand(f), limitsCommand(f), statusCommand(f), auditCommand(f),
		rateCardCommand(f), billingCommand(f), fundsCommand(f), budgetCommand(f))
	cmd.AddCommand(workspaceCommand(f))
	cmd.AddCommand(imageCommand(f))
	return cmd
}

func accountCommand(f *adminFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "account", Short: "Create and list accounts"}
	var name string
	create := &cobra.Command{
		Use: "create", Short: "Create an account; prints its id",
		RunE: func(cmd *cobra.Command, _ []string) error {
			var a adminapi.Account
			if err := f.do(cmd, http.MethodPost, "/accounts", adminapi.CreateAccountRequest{Name: name}, &a); err != nil {
				return err
			}
			return emit(cmd, a, a.ID)
		},
	}
	create.Flags().StringVar(&name, "name", "", "account name (required)")
	_ = create.MarkFlagRequired("name")
	list := &cobra.Command{
		Use: "list", Short: "List accounts",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, f, http.MethodGet, "/accounts", nil, rowsOf([]string{"ID", "NAME", "CREATED"},
				func(a adminapi.Account) []string { return []string{a.ID, a.Name, a.CreatedAt} }))
		},
	}
	cmd.AddCommand(create, list)
	return cmd
}

func instanceCommand(f *adminFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "instance", Short: "Create and inspect instances and their scope"}
	var req adminapi.CreateInstanceRequest
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
			var in adminapi.Instance
			if err := c.Do(cmd.Context(), http.MethodPost, "/instances", req, &in); err != nil {
				return err
			}
			return emit(cmd, in, in.ID)
		},
	}
	fl := create.Flags()
	fl.StringVar(&req.AccountID, "account", "", "account id (required)")
	_ = create.MarkFlagRequired("account")
	fl.StringVar(&req.Name, "name", "", "instance name")
	fl.StringVar(&req.Provider, "provider", "", "provider of the instance's workspaces (a name from the config's providers:); default the broker's default_provider")
	fl.IntVar(&req.Scope.Limits.MaxConcurrentWorkspaces, "max-concurrent", 0, "max_concurrent_workspaces")
	fl.DurationVar(&durs.lifetime, "max-lifetime", 0, "max_lifetime (e.g. 1h)")
	fl.DurationVar(&durs.idle, "idle-timeout", 0, "idle_timeout (e.g. 15m)")
	fl.DurationVar(&durs.maxExec, "max-exec-timeout", 0, "max_exec_timeout")
	fl.DurationVar(&durs.defExec, "default-exec-timeout", 0, "default_exec_timeout")
	fl.IntVar(&req.Scope.Limits.MaxSnapshots, "max-snapshots", 0, "max_snapshots")
	fl.Int64Var(&req.Scope.Limits.MaxSnapshotBytes, "max-snapshot-bytes", 0, "max_snapshot_bytes: bytes the live snapshots may hold together")
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
			var in adminapi.Instance
			if err := f.do(cmd, http.MethodGet, "/instances/"+url.PathEscape(args[0]), nil, &in); err != nil {
				return err
			}
			// The scope has no one-line form: the text form is the JSON.
			b, err := json.MarshalIndent(in, "", "  ")
			if err != nil {
				return err
			}
			return emit(cmd, in, string(b))
		},
	}
	var acct string
	list := &cobra.Command{
		Use: "list", Short: "List instances",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, f, http.MethodGet, "/instances?account="+url.QueryEscape(acct), nil, rowsOf([]string{"ID", "ACCOUNT", "NAME", "PROVIDER", "CREATED"},
				func(in adminapi.Instance) []string {
					return []string{in.ID, in.AccountID, in.Name, in.Provider, in.CreatedAt}
				}))
		},
	}
	list.Flags().StringVar(&acct, "account", "", "only this account's instances")
	var prov string
	setProvider := &cobra.Command{
		Use: "set-provider ID --provider NAME", Short: "Run the instance's new workspaces on another provider (running ones stay where they are)",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var in adminapi.Instance
			if err := f.do(cmd, http.MethodPut, "/instances/"+url.PathEscape(args[0])+"/provider", adminapi.SetProviderRequest{Provider: prov}, &in); err != nil {
				return err
			}
			return emit(cmd, in, in.ID+"\t"+in.Provider)
		},
	}
	setProvider.Flags().StringVar(&prov, "provider", "", "provider name (required)")
	_ = setProvider.MarkFlagRequired("provider")
	providersCmd := &cobra.Command{
		Use: "providers", Short: "List the broker's providers: what each enforces and whether it takes new workspaces",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, f, http.MethodGet, "/providers", nil, rowsOf([]string{"NAME", "KIND", "DEFAULT", "ACCEPT_NEW", "EGRESS"},
				func(p adminapi.Provider) []string {
					return []string{p.Name, p.Kind, fmt.Sprint(p.Default), fmt.Sprint(p.AcceptNew), p.Egress}
				}))
		},
	}
	cmd.AddCommand(create, get, list, setProvider, providersCmd)
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
				var out adminapi.IssuedToken
				req := adminapi.IssueTokenRequest{TTLSeconds: int64(ttl / time.Second), GraceSeconds: int64(grace / time.Second)}
				if err := cl.Do(cmd.Context(), http.MethodPost, "/instances/"+url.PathEscape(inst)+path, req, &out); err != nil {
					return err
				}
				return emit(cmd, out, out.Token)
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
				var out adminapi.Count
				if err := f.do(cmd, http.MethodPost, "/instances/"+url.PathEscape(inst)+path, nil, &out); err != nil {
					return err
				}
				return emit(cmd, out, fmt.Sprint(out.Count))
			},
		}
		c.Flags().StringVar(&inst, "instance", "", "instance id (required)")
		_ = c.MarkFlagRequired("instance")
		return c
	}
	var keep bool
	var lease string
	revoke := &cobra.Command{
		Use: "revoke",
		Short: "Revoke every token of the instance now and end its running workspaces, or (--lease) one token alone; " +
			"prints revoked=N terminated=N failed=N",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (inst == "") == (lease == "") {
				return errors.New("give exactly one of --instance (every token) and --lease (one token)")
			}
			if lease != "" && keep {
				return errors.New("--keep-workspaces goes with --instance: revoking one token never ends workspaces")
			}
			cl, err := f.client()
			if err != nil {
				return err
			}
			var out adminapi.RevokeResult
			if lease != "" {
				err = cl.Do(cmd.Context(), http.MethodPost, "/leases/"+url.PathEscape(lease)+"/revoke", nil, &out)
			} else {
				terminate := !keep
				req := adminapi.RevokeRequest{TerminateWorkspaces: &terminate}
				err = cl.Do(cmd.Context(), http.MethodPost, "/instances/"+url.PathEscape(inst)+"/tokens/revoke", req, &out)
			}
			if err != nil {
				return err
			}
			return emit(cmd, out, fmt.Sprintf("revoked=%d terminated=%d failed=%d", out.Count, out.Terminated, out.Failed))
		},
	}
	revoke.Flags().StringVar(&inst, "instance", "", "instance id: revoke every token of it")
	revoke.Flags().StringVar(&lease, "lease", "", "lease id (from token list): revoke this token only; the instance's other tokens and its workspaces are untouched")
	revoke.Flags().BoolVar(&keep, "keep-workspaces", false, "with --instance: leave the instance's running workspaces running")
	rotate := issue("rotate", "Issue a new token and supersede the others after a grace period; prints the token", "/tokens/rotate")
	rotate.Flags().DurationVar(&grace, "grace", 0, "grace period of the superseded tokens (0: the broker's default)")
	list := &cobra.Command{
		Use: "list", Short: "List an instance's tokens (prefixes and states only)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, f, http.MethodGet, "/instances/"+url.PathEscape(inst)+"/tokens", nil, rowsOf([]string{"LEASE", "TOKEN", "STATE", "ISSUED"},
				func(l adminapi.Lease) []string { return []string{l.ID, l.TokenPrefix + "…", l.State, l.IssuedAt} }))
		},
	}
	list.Flags().StringVar(&inst, "instance", "", "instance id (required)")
	_ = list.MarkFlagRequired("instance")
	cmd.AddCommand(
		issue("issue", "Issue a token for an instance; prints the token (shown once)", "/tokens"),
		rotate,
		count("end-grace", "End the grace period of superseded tokens now; prints how many", "/tokens/end-grace"),
		revoke,
		list,
	)
	return cmd
}

// controlFlags are the flags of a command that sets a stop or a pause.
type controlFlags struct {
	reason, note, until string
	dur                 time.Duration
}

func (c *controlFlags) add(cmd *cobra.Command, reasonHelp string) {
	fl := cmd.Flags()
	fl.StringVar(&c.reason, "reason", "", reasonHelp)
	fl.StringVar(&c.note, "note", "", "free text for operators (at most 500 characters; never shown to clients)")
	fl.StringVar(&c.until, "until", "", "lift it automatically at this RFC 3339 time")
	fl.DurationVar(&c.dur, "for", 0, "lift it automatically after this long (e.g. 30m); instead of --until")
	cmd.MarkFlagsMutuallyExclusive("until", "for")
}

// untilValue is --until, or now + --for.
func (c *controlFlags) untilValue() string {
	if c.dur > 0 {
		return time.Now().Add(c.dur).UTC().Format(time.RFC3339)
	}
	return c.until
}

func swept(out adminapi.Swept) string {
	return fmt.Sprintf("terminated=%d failed=%d", out.Terminated, out.Failed)
}

func stopCommand(f *adminFlags) *cobra.Command {
	var acct string
	var cf controlFlags
	cmd := &cobra.Command{
		Use:   "stop on|off",
		Short: "Set or lift the emergency stop of the whole broker or one account; on prints terminated=N failed=N",
		Long: "stop on refuses every new workspace of its scope (403 emergency_stopped, details.reason the --reason)\n" +
			"and terminates the scope's running workspaces (emergency_stopped). Those it fails to end are\n" +
			"retried in the background. stop off lifts it.",
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{"on", "off"},
		RunE: func(cmd *cobra.Command, args []string) error {
			var on bool
			switch args[0] {
			case "on":
				on = true
				if cf.reason == "" {
					return fmt.Errorf("stop on: --reason is required")
				}
			case "off":
				if cf.reason != "" || cf.note != "" || cf.until != "" || cf.dur != 0 {
					return fmt.Errorf("stop off takes no --reason, --note, --until or --for")
				}
			default:
				return fmt.Errorf("stop %q: want on or off", args[0])
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			req := adminapi.StopRequest{On: &on, AccountID: acct, Reason: cf.reason, Note: cf.note, Until: cf.untilValue()}
			var out adminapi.Swept
			if err := c.Do(cmd.Context(), http.MethodPost, "/stop", req, &out); err != nil {
				return err
			}
			if !on {
				return emit(cmd, struct{}{}, "off")
			}
			return emit(cmd, out, swept(out))
		},
	}
	cmd.Flags().StringVar(&acct, "account", "", "stop this account only (default: the whole broker)")
	cf.add(cmd, "why, as clients see it in details.reason: [a-z0-9_-], e.g. operator, incident (required for on)")
	return cmd
}

// scopeFlags are --account and --instance, exactly one of them required.
func scopeFlags(cmd *cobra.Command, acct, inst *string) {
	cmd.Flags().StringVar(acct, "account", "", "account id")
	cmd.Flags().StringVar(inst, "instance", "", "instance id")
	cmd.MarkFlagsMutuallyExclusive("account", "instance")
	cmd.MarkFlagsOneRequired("account", "instance")
}

func pauseCommand(f *adminFlags) *cobra.Command {
	var acct, inst string
	var cf controlFlags
	cmd := &cobra.Command{
		Use:   "pause (--account ID | --instance ID)",
		Short: "Pause one account or one instance and terminate its running workspaces; prints terminated=N failed=N",
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := adminapi.PauseRequest{AccountID: acct, InstanceID: inst, Reason: cf.reason, Note: cf.note, Until: cf.untilValue()}
			return call(cmd, f, http.MethodPost, "/pause", req, swept)
		},
	}
	scopeFlags(cmd, &acct, &inst)
	cf.add(cmd, "why, as clients see it in details.reason: [a-z0-9_-], e.g. payment (default account_paused or instance_paused)")
	return cmd
}

func resumeCommand(f *adminFlags) *cobra.Command {
	var acct, inst string
	cmd := &cobra.Command{
		Use:   "resume (--account ID | --instance ID)",
		Short: "Lift the pause of one account or one instance (not the other's)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.do(cmd, http.MethodPost, "/resume", adminapi.ResumeRequest{AccountID: acct, InstanceID: inst}, nil); err != nil {
				return err
			}
			return emit(cmd, struct{}{}, "resumed")
		},
	}
	scopeFlags(cmd, &acct, &inst)
	return cmd
}

func limitsLine(l adminapi.RiskLimits) string {
	orDefault := func(v string) string {
		if v == "" || v == "0" {
			return "default"
		}
		return v
	}
	return fmt.Sprintf("acquires_per_minute=%s max_open_workspaces=%s max_size=%s",
		orDefault(fmt.Sprint(l.AcquiresPerMinute)), orDefault(fmt.Sprint(l.MaxOpenWorkspaces)), orDefault(l.MaxSize))
}

func limitsCommand(f *adminFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "limits", Short: "Set and show an account's risk limits"}
	var acct string
	var l adminapi.RiskLimits
	set := &cobra.Command{
		Use:   "set --account ID",
		Short: "Change an account's risk limits; unnamed limits keep their value, 0 or \"\" means the broker default",
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			path := "/accounts/" + url.PathEscape(acct) + "/limits"
			var cur adminapi.RiskLimits
			if err := c.Do(cmd.Context(), http.MethodGet, path, nil, &cur); err != nil {
				return err
			}
			fl := cmd.Flags()
			if fl.Changed("acquires-per-minute") {
				cur.AcquiresPerMinute = l.AcquiresPerMinute
			}
			if fl.Changed("max-open") {
				cur.MaxOpenWorkspaces = l.MaxOpenWorkspaces
			}
			if fl.Changed("max-size") {
				cur.MaxSize = l.MaxSize
			}
			var out adminapi.RiskLimits
			if err := c.Do(cmd.Context(), http.MethodPut, path, cur, &out); err != nil {
				return err
			}
			return emit(cmd, out, limitsLine(out))
		},
	}
	accountFlag(set, &acct)
	set.Flags().IntVar(&l.AcquiresPerMinute, "acquires-per-minute", 0, "acquires per minute across the account's instances")
	set.Flags().IntVar(&l.MaxOpenWorkspaces, "max-open", 0, "open workspaces across the account's instances")
	set.Flags().StringVar(&l.MaxSize, "max-size", "", "largest size one acquire may ask for (small, standard, large, xlarge)")
	get := accountGetCommand(f, "get --account ID", "Show an account's risk limits", "limits", limitsLine)
	cmd.AddCommand(set, get)
	return cmd
}

func statusCommand(f *adminFlags) *cobra.Command {
	return &cobra.Command{
		Use: "status", Short: "Show what is stopped or paused, why, by whom, since when",
		RunE: func(cmd *cobra.Command, _ []string) error {
			var st adminapi.Status
			if err := f.do(cmd, http.MethodGet, "/status", nil, &st); err != nil {
				return err
			}
			return emit(cmd, st, statusTable(st))
		},
	}
}

// statusTable renders a status as an aligned table, one control a row.
func statusTable(st adminapi.Status) string {
	if st.BrokerStop == nil && len(st.Controls) == 0 {
		return "nothing is stopped or paused"
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tKIND\tREASON\tACTOR\tSINCE\tUNTIL\tNOTE")
	row := func(scope, kind string, c adminapi.Control) {
		until := "-"
		if c.Until != nil {
			until = *c.Until
		}
		if !c.Active {
			until += " (expired)"
		}
		note := strings.Join(strings.Fields(c.Note), " ")
		if note == "" {
			note = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", scope, kind, c.Reason, c.Actor, c.Since, until, note)
	}
	if st.BrokerStop != nil {
		row("broker", "stop", *st.BrokerStop)
	}
	for _, sc := range st.Controls {
		scope := "account " + sc.AccountID
		if sc.InstanceID != "" {
			scope = "instance " + sc.InstanceID + " (" + sc.AccountID + ")"
		}
		row(scope, sc.Kind, sc.Control)
	}
	tw.Flush()
	return strings.TrimRight(b.String(), "\n")
}

func auditCommand(f *adminFlags) *cobra.Command {
	var from, to, out string
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Export the audit log as JSON lines, oldest first (every operator action and refused request)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, v := range []string{from, to} {
				if _, err := time.Parse(time.RFC3339, v); v != "" && err != nil {
					return fmt.Errorf("--from and --to take RFC 3339 times, e.g. 2026-01-02T15:04:05Z: %q", v)
				}
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			q := url.Values{}
			if from != "" {
				q.Set("from", from)
			}
			if to != "" {
				q.Set("to", to)
			}
			path := "/audit"
			if len(q) > 0 {
				path += "?" + q.Encode()
			}
			if out == "" || out == "-" {
				return c.Stream(cmd.Context(), path, cmd.OutOrStdout())
			}
			file, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			if err := c.Stream(cmd.Context(), path, file); err != nil {
				file.Close()
				return err
			}
			return file.Close()
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "first time included (RFC 3339; default: the oldest entry)")
	cmd.Flags().StringVar(&to, "to", "", "first time excluded (RFC 3339; default: now)")
	cmd.Flags().StringVar(&out, "out", "", "write to this file (mode 0600) instead of stdout")
	return cmd
}
