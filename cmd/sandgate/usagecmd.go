package main

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
)

// usageFlags are the connection and output flags of `sandgate usage`
// commands, the same as `sandgate admin`'s.
func usageFlags(cmd *cobra.Command, f *adminFlags) {
	fl := cmd.Flags()
	fl.StringVar(&f.url, "url", "", "operator API URL (default $SANDGATE_ADMIN_URL)")
	fl.StringVar(&f.token, "token", "", "finance or admin operator token (default $SANDGATE_ADMIN_TOKEN)")
	fl.DurationVar(&f.timeout, "timeout", 10*time.Minute, "bound on the request")
}

// usageSummaryCommand is `sandgate usage summary`: GET /admin/v1/usage/summary.
func usageSummaryCommand() *cobra.Command {
	var f adminFlags
	var by string
	var sel usageSelection
	cmd := &cobra.Command{
		Use:   "summary [--group-by account|instance|agent|size|day]",
		Short: "Total the usage ledger by account, instance, agent, size or UTC day (finance or admin token)",
		Long: `summary totals the same entries as export (termination time in [--from, --to),
default the current UTC month) per group and currency: entries, workspaces
that ended, metered seconds and the amount, summed exactly in micro-units and
rounded once at the currency's minor units.`,
		Example: `  sandgate usage summary --token "$FINANCE_TOKEN"
  sandgate usage summary --group-by day --account "$ACCT" --token "$FINANCE_TOKEN" -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := url.Values{"group_by": {by}}
			for k, v := range map[string]string{"from": sel.from, "to": sel.to, "account": sel.acct, "instance": sel.inst, "agent": sel.agent, "size": sel.size} {
				if v == "" {
					continue
				}
				if k == "from" || k == "to" {
					if _, err := time.Parse(time.RFC3339, v); err != nil {
						return fmt.Errorf("--%s takes an RFC 3339 time, e.g. 2026-10-01T00:00:00Z: %q", k, v)
					}
				}
				q.Set(k, v)
			}
			var sum adminapi.UsageSummary
			if err := f.do(cmd, http.MethodGet, "/usage/summary?"+q.Encode(), nil, &sum); err != nil {
				return err
			}
			return emit(cmd, sum, summaryTable(sum))
		},
	}
	usageFlags(cmd, &f)
	fl := cmd.Flags()
	fl.StringVar(&by, "group-by", "account", "account, instance, agent, size or day")
	sel.addFlags(cmd, "only this account")
	return cmd
}

// summaryTable is the text form of a usage summary: its groups, then the
// warm pools' lines apart.
func summaryTable(sum adminapi.UsageSummary) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\tCURRENCY\tENTRIES\tWORKSPACES\tSECONDS\tAMOUNT\n", strings.ToUpper(sum.GroupBy))
	for _, g := range sum.Groups {
		key := g.Key
		if key == "" {
			key = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", key, g.Currency, g.Entries, g.Workspaces, g.Seconds, money(g.AmountMicros, g.Currency))
	}
	tw.Flush()
	if len(sum.Pool) > 0 {
		// The warm pools' own time: the operator's cost, in no
		// group above.
		b.WriteString("\nwarm pool (billed to no account):\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "PROVIDER\tSIZE\tIMAGE\tSECONDS\tAMOUNT\n")
		for _, l := range sum.Pool {
			amount := "-"
			if l.Currency != "" {
				amount = money(l.AmountMicros, l.Currency)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", l.Provider, l.Size, l.Image, l.Seconds, amount)
		}
		tw.Flush()
	}
	fmt.Fprintf(&b, "from %s to %s", sum.From, sum.To)
	return b.String()
}

// usageSelection is what a usage command reads: the entries whose
// termination time is in [from, to), of one account, instance, agent or
// size when set.
type usageSelection struct {
	from, to, acct, inst, agent, size string
}

// addFlags adds the selection's flags to cmd; accountHelp is --account's.
func (u *usageSelection) addFlags(cmd *cobra.Command, accountHelp string) {
	fl := cmd.Flags()
	fl.StringVar(&u.from, "from", "", "first termination time included (RFC 3339; default: the start of the current UTC month)")
	fl.StringVar(&u.to, "to", "", "first termination time excluded (RFC 3339; default: the start of the next UTC month)")
	fl.StringVar(&u.acct, "account", "", accountHelp)
	fl.StringVar(&u.inst, "instance", "", "only this instance")
	fl.StringVar(&u.agent, "agent", "", "only this agent")
	fl.StringVar(&u.size, "size", "", "only this size (small, standard, large, xlarge)")
}

// usageStatementCommand is `sandgate usage statement`: GET
// /admin/v1/accounts/{id}/statement.
func usageStatementCommand() *cobra.Command {
	var f adminFlags
	var acct, month string
	cmd := &cobra.Command{
		Use:   "statement --account ID [--month YYYY-MM]",
		Short: "Show an account's monthly statement: opening, credits, usage, adjustments, holds, closing (finance or admin token)",
		Example: `  sandgate usage statement --account "$ACCT" --token "$FINANCE_TOKEN"
  sandgate usage statement --account "$ACCT" --month 2026-10 --token "$FINANCE_TOKEN" -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := "/accounts/" + url.PathEscape(acct) + "/statement"
			if month != "" {
				if _, err := billing.ParseMonth(month); err != nil {
					return fmt.Errorf("--month takes YYYY-MM, e.g. 2026-10: %q", month)
				}
				path += "?month=" + url.QueryEscape(month)
			}
			var st billing.Statement
			if err := f.do(cmd, http.MethodGet, path, nil, &st); err != nil {
				return err
			}
			return emit(cmd, st, statementTable(st))
		},
	}
	usageFlags(cmd, &f)
	cmd.Flags().StringVar(&acct, "account", "", "account id (required)")
	_ = cmd.MarkFlagRequired("account")
	cmd.Flags().StringVar(&month, "month", "", "YYYY-MM (default: the current UTC month)")
	return cmd
}

// statementTable renders a statement's figures as a two-column table.
func statementTable(st billing.Statement) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	c := st.Currency
	fmt.Fprintf(&b, "account %s, %s (%s to %s)", st.AccountID, st.Month, st.From.Format(time.RFC3339), st.To.Format(time.RFC3339))
	if !st.Complete {
		fmt.Fprintf(&b, ", incomplete: generated %s", st.GeneratedAt.UTC().Format(time.RFC3339))
	}
	b.WriteString("\n")
	fmt.Fprintln(tw, "LINE\tAMOUNT\t")
	rows := []struct {
		name   string
		micros int64
	}{
		{"opening balance", st.OpeningMicros},
		{"credits and debits", st.CreditsMicros},
		{"usage", -st.UsageMicros},
		{"adjustments", -st.AdjustMicros},
		{"closing balance", st.ClosingMicros},
		{"open holds", st.HoldsMicros},
		{"available", st.AvailMicros},
		{"unexplained", st.UnexplMicros},
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t\n", r.name, money(r.micros, c))
	}
	tw.Flush()
	return strings.TrimRight(b.String(), "\n")
}

// money is how every command prints an amount of money: the currency's
// minor units, then the ISO 4217 code.
func money(micros int64, currency string) string {
	if currency == "" {
		currency = billing.NoCurrency
	}
	return billing.FormatMinor(micros, currency) + " " + currency
}
