package main

import (
	"fmt"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate/adminapi"
)

// stripeFlags adds the Stripe sync's flags to `sandgate admin billing
// set`. A flag left out keeps the account's value; --stripe-customer ""
// --stripe-meter-event "" turns the sync off.
func stripeFlags(cmd *cobra.Command, req *adminapi.BillingSettings) {
	var customer, event, unit string
	fl := cmd.Flags()
	fl.StringVar(&customer, "stripe-customer", "", `the account's Stripe customer id (cus_…); with --stripe-meter-event, sends its usage to Stripe Billing ("" with --stripe-meter-event "": stop)`)
	fl.StringVar(&event, "stripe-meter-event", "", "the event_name of the account's Stripe meter")
	fl.StringVar(&unit, "stripe-unit", "", "what a meter event's value counts: seconds (default) or micros")
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		for name, dst := range map[string]**string{"stripe-customer": &req.StripeCustomer, "stripe-meter-event": &req.StripeMeterEvent, "stripe-unit": &req.StripeUnit} {
			if f := c.Flags().Lookup(name); f.Changed {
				v := f.Value.String()
				*dst = &v
			}
		}
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
}

// usageStripeCommand is `sandgate usage stripe status|retry`: the Stripe
// Billing sync of an account, through the operator API.
func usageStripeCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "stripe", Short: "Show and retry an account's Stripe Billing sync (status: finance or admin token; retry: admin)"}
	var sf, rf adminFlags
	status := &cobra.Command{
		Use:     "status ACCOUNT",
		Short:   "Show how far an account's usage is in Stripe: lag, failures, last error, dead letters",
		Example: `  sandgate usage stripe status "$ACCT" --token "$FINANCE_TOKEN"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, &sf, http.MethodGet, accountPath(args[0], "billing/stripe"), nil, stripeStatusText)
		},
	}
	usageFlags(status, &sf)
	retry := &cobra.Command{
		Use:     "retry ACCOUNT [ENTRY_ID...]",
		Short:   "Send an account's Stripe dead letters again (all of them when no ENTRY_ID is given)",
		Example: `  sandgate usage stripe retry "$ACCT" ws_01J…:final`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, &rf, http.MethodPost, accountPath(args[0], "billing/stripe/retry"), adminapi.StripeRetryRequest{EntryIDs: args[1:]},
				func(r adminapi.StripeRetryResult) string {
					return fmt.Sprintf("%d requeued; the sync's next round sends them", r.Requeued)
				})
		},
	}
	usageFlags(retry, &rf)
	cmd.AddCommand(status, retry)
	return cmd
}

// stripeStatusText renders a Stripe status: a line of settings and
// counters, then the dead letters as a table.
func stripeStatusText(st adminapi.StripeStatus) string {
	var b strings.Builder
	if st.Enabled {
		fmt.Fprintf(&b, "account %s: syncing to customer %s, meter event %s (%s)\n", st.AccountID, st.Customer, st.EventName, st.Unit)
	} else {
		fmt.Fprintf(&b, "account %s: not synced to Stripe (set --stripe-customer and --stripe-meter-event with sandgate admin billing set)\n", st.AccountID)
	}
	pending := fmt.Sprint(st.Pending)
	if st.PendingMore {
		pending += "+"
	}
	fmt.Fprintf(&b, "pending=%s lag=%s sent=%d failures=%d dead_lettered=%d last_sent_at=%s\n", pending,
		(time.Duration(st.LagSeconds) * time.Second).String(), st.Sent, st.Failures, st.DeadLettered, orDash(st.LastSentAt))
	if st.LastError != "" {
		fmt.Fprintf(&b, "last error at %s: %s\n", st.LastErrorAt, st.LastError)
	}
	if len(st.DeadLetters)+len(st.Requeued) > 0 {
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ENTRY\tSTATE\tSTATUS\tATTEMPTS\tAT\tERROR")
		for _, set := range []struct {
			state string
			ds    []adminapi.StripeDeadLetter
		}{{"dead", st.DeadLetters}, {"requeued", st.Requeued}} {
			for _, d := range set.ds {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", d.EntryID, set.state, d.Status, d.Attempts, d.At, d.Error)
			}
		}
		tw.Flush()
	}
	return strings.TrimRight(b.String(), "\n")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
