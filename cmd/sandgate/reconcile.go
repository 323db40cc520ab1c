package main

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate/billing"
)

// usageCommand is `sandgate usage`: the usage ledger for finance —
// reconcile (here) and export (cmd/sandgate/usage_export.go).
func usageCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "usage", Short: "Reconcile and export the usage ledger (finance or admin token)"}
	cmd.AddCommand(reconcileCommand(), usageExportCommand())
	cmd.AddCommand(usageSummaryCommand(), usageStatementCommand())
	cmd.AddCommand(usageStripeCommand())
	return cmd
}

// reconcileCommand is `sandgate usage reconcile [--account ID]`: every
// balance recomputed from the ledgers and compared with the stored
// balance and open holds. It prints one line per account and one per
// drift, and fails when there is any.
func reconcileCommand() *cobra.Command {
	f := &adminFlags{}
	var acct string
	cmd := &cobra.Command{
		Use:   "reconcile [--account ID]",
		Short: "Recompute every balance from the ledgers and print any drift (exit 5 on drift)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			path := "/billing/reconcile"
			if acct != "" {
				path += "?account=" + url.QueryEscape(acct)
			}
			var out []billing.Report
			if err := c.Do(cmd.Context(), http.MethodGet, path, nil, &out); err != nil {
				return err
			}
			var lines, free, unconfigured []string
			drift := 0
			for _, r := range out {
				status := "ok"
				if len(r.Drift) > 0 {
					status = "DRIFT"
				}
				f := func(m int64) string { return billing.FormatExact(m, r.Stored.Currency) }
				lines = append(lines, fmt.Sprintf("%s %s balance=%s holds=%s settled=%s credits=%s debits=%s open_holds=%d usage_entries=%d billing=%s",
					r.AccountID, status, f(r.Stored.BalanceMicros), f(r.Stored.HoldsMicros),
					f(r.Stored.SettledMicros), f(r.Stored.CreditsMicros),
					f(r.Stored.DebitsMicros), r.OpenHolds, r.UsageEntries, r.Billing))
				switch r.Billing {
				case billing.StateFree:
					free = append(free, r.AccountID)
				case billing.StateNotConfigured:
					unconfigured = append(unconfigured, r.AccountID)
				}
				for _, d := range r.Drift {
					lines = append(lines, "  "+d)
				}
				drift += len(r.Drift)
			}
			if len(free) > 0 {
				lines = append(lines, "free accounts (billing set --free, cost 0): "+strings.Join(free, " "))
			}
			if len(unconfigured) > 0 {
				lines = append(lines, "accounts without billing (their acquires are refused until billing set or --free): "+strings.Join(unconfigured, " "))
			}
			if err := emit(cmd, out, strings.Join(lines, "\n")); err != nil {
				return err
			}
			if drift > 0 {
				return &exitError{code: exitDrift, err: fmt.Errorf("reconcile: %d drift(s)", drift)}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&acct, "account", "", "one account (default: every account)")
	fl.StringVar(&f.url, "url", "", "operator API URL (default $SANDGATE_ADMIN_URL)")
	fl.StringVar(&f.token, "token", "", "operator token (default $SANDGATE_ADMIN_TOKEN)")
	fl.DurationVar(&f.timeout, "timeout", 10*time.Minute, "bound on the request")
	return cmd
}
