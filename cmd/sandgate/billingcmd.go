package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
)

// Billing commands of `sandgate admin`: rate cards, account billing
// settings, funds and budgets. Amounts are decimal strings of currency
// units ("25.00"); prices are per second.

func rateCardCommand(f *adminFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "rate-card", Short: "Create and list rate cards (prices per second per size)"}
	var name, currency string
	prices := map[string]*string{}
	create := &cobra.Command{
		Use:   "create --name N --currency USD --small P --standard P --large P --xlarge P",
		Short: "Create a rate card, or a new version of it; accounts on it price new workspaces at the new version",
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := adminapi.RateCardRequest{Name: name, Currency: currency, Prices: map[string]string{}}
			for size, p := range prices {
				req.Prices[size] = *p
			}
			return call(cmd, f, http.MethodPost, "/rate-cards", req, rateCardLine)
		},
	}
	create.Flags().StringVar(&name, "name", "", "rate card name (required)")
	_ = create.MarkFlagRequired("name")
	create.Flags().StringVar(&currency, "currency", "", "ISO 4217 currency its prices are in, e.g. USD (required; a card keeps one currency)")
	_ = create.MarkFlagRequired("currency")
	for _, s := range sandgate.StandardSizes {
		p := new(string)
		prices[s.Name] = p
		create.Flags().StringVar(p, s.Name, "", "price per second of size "+s.Name+" in currency units, e.g. 0.000100 (required)")
		_ = create.MarkFlagRequired(s.Name)
	}
	list := &cobra.Command{
		Use: "list", Short: "List the newest version of every rate card",
		RunE: func(cmd *cobra.Command, _ []string) error {
			var out []adminapi.RateCard
			if err := f.do(cmd, http.MethodGet, "/rate-cards", nil, &out); err != nil {
				return err
			}
			header := []string{"NAME", "VERSION", "CURRENCY"}
			for _, s := range sandgate.StandardSizes {
				header = append(header, strings.ToUpper(s.Name)+"/S")
			}
			var rows [][]string
			for _, rc := range out {
				row := []string{rc.Name, fmt.Sprint(rc.Version), cardCurrency(rc)}
				for _, s := range sandgate.StandardSizes {
					row = append(row, rc.Prices[s.Name])
				}
				rows = append(rows, row)
			}
			return emit(cmd, out, table(header, rows))
		},
	}
	var setCur string
	setCurrency := &cobra.Command{
		Use:   "set-currency NAME --currency USD",
		Short: "State the currency of a rate card created before cards had one (once); accounts can then be put on it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, f, http.MethodPut, "/rate-cards/"+url.PathEscape(args[0])+"/currency",
				adminapi.RateCardCurrencyRequest{Currency: setCur}, rateCardLine)
		},
	}
	setCurrency.Flags().StringVar(&setCur, "currency", "", "ISO 4217 currency the card's prices were written in (required)")
	_ = setCurrency.MarkFlagRequired("currency")
	cmd.AddCommand(create, list, setCurrency)
	return cmd
}

// cardCurrency is a card's currency as lists show it; a card created
// before cards had one says what to do.
func cardCurrency(rc adminapi.RateCard) string {
	if rc.Currency == "" {
		return "NONE (set-currency)"
	}
	return rc.Currency
}

func rateCardLine(rc adminapi.RateCard) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s v%d %s", rc.Name, rc.Version, cardCurrency(rc))
	for _, s := range sandgate.StandardSizes {
		fmt.Fprintf(&b, " %s=%s/s", s.Name, rc.Prices[s.Name])
	}
	return b.String()
}

func billingCommand(f *adminFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "billing", Short: "Set and show an account's billing: rate card, currency, credit limit, postpaid"}
	var req adminapi.BillingSettings
	set := accountPutCommand(f, "set --account ID (--rate-card N --currency USD [--credit-limit 0] [--postpaid] | --free)",
		"Configure an account's billing; it is prepaid (needs funds) unless --postpaid, and costs nothing with --free", "billing", &req, billingLine)
	set.Flags().StringVar(&req.RateCard, "rate-card", "", "rate card name")
	set.Flags().StringVar(&req.Currency, "currency", "", "ISO 4217 currency code (required unless --free); the rate card's")
	set.Flags().StringVar(&req.CreditLimit, "credit-limit", "0", "how far below zero the available amount may go")
	set.Flags().BoolVar(&req.Postpaid, "postpaid", false, "no funds check (budgets still apply)")
	set.Flags().BoolVar(&req.Free, "free", false, "mark the account free on purpose: no rate card, price 0 in XXX, no funds check")
	set.MarkFlagsMutuallyExclusive("free", "currency")
	set.MarkFlagsOneRequired("free", "currency")
	stripeFlags(set, &req)
	get := accountGetCommand(f, "get --account ID", "Show an account's billing settings", "billing", billingLine)
	cmd.AddCommand(set, get)
	return cmd
}

func billingLine(s adminapi.BillingSettings) string {
	if !s.Configured {
		return "not configured: cannot acquire until billing is set (or the account is marked --free)"
	}
	if s.Free {
		return "free: no rate card, price 0 (XXX), no funds check"
	}
	mode := "prepaid"
	if s.Postpaid {
		mode = "postpaid"
	}
	return fmt.Sprintf("%s rate_card=%s currency=%s credit_limit=%s", mode, s.RateCard, s.Currency, s.CreditLimit)
}

func fundsCommand(f *adminFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "funds", Short: "Credit, debit and show an account's prepaid funds"}
	adjust := func(kind string) *cobra.Command {
		var acct string
		var req adminapi.FundsRequest
		c := &cobra.Command{
			Use:   kind + " --account ID --amount 25.00 --reason TEXT [--idempotency-key K]",
			Short: "Append a " + kind + " to the account's funds ledger (once per idempotency key)",
			RunE: func(cmd *cobra.Command, _ []string) error {
				if req.IdempotencyKey == "" {
					req.IdempotencyKey = newIdempotencyKey()
				}
				return call(cmd, f, http.MethodPost, accountPath(acct, "funds/"+kind), req,
					func(e adminapi.FundsEntry) string { return e.Balance.Available })
			},
		}
		c.Flags().StringVar(&acct, "account", "", "account id (required)")
		c.Flags().StringVar(&req.Amount, "amount", "", "amount in currency units, e.g. 25.00 (required)")
		c.Flags().StringVar(&req.Reason, "reason", "", "why (required; kept in the ledger)")
		c.Flags().StringVar(&req.IdempotencyKey, "idempotency-key", "", "a retry with the same key applies once (default: random, printed with -o json)")
		for _, fl := range []string{"account", "amount", "reason"} {
			_ = c.MarkFlagRequired(fl)
		}
		return c
	}
	balance := accountGetCommand(f, "balance --account ID", "Print the available amount (balance − holds); -o json adds holds, settled and currency",
		"funds", func(b adminapi.Balance) string { return b.Available })
	cmd.AddCommand(adjust("credit"), adjust("debit"), balance, adjustmentCommand(f))
	return cmd
}

func budgetCommand(f *adminFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "budget", Short: "Set and list monthly budgets (account, instance, agent)"}
	var req adminapi.BudgetRequest
	show := func(out []adminapi.Budget) string {
		var rows [][]string
		for _, b := range out {
			scope := "account"
			if b.InstanceID != "" {
				scope = "instance=" + b.InstanceID
			}
			if b.Agent != "" {
				scope += " agent=" + b.Agent
			}
			kind := "hard"
			if b.Soft {
				kind = "soft"
			}
			rows = append(rows, []string{scope, b.Monthly, b.Used, kind})
		}
		return table([]string{"SCOPE", "MONTHLY", "USED", "KIND"}, rows)
	}
	set := accountPutCommand(f, "set --account ID [--instance ID] [--agent SLUG] --monthly 100.00 [--soft]",
		"Set a monthly budget (calendar month, UTC); --monthly 0 removes it", "budgets", &req, show)
	set.Flags().StringVar(&req.InstanceID, "instance", "", "instance id (default: the whole account)")
	set.Flags().StringVar(&req.Agent, "agent", "", "agent slug (with --soft: an agent budget only alerts)")
	set.Flags().StringVar(&req.Monthly, "monthly", "", "cap per calendar month in currency units (required)")
	set.Flags().BoolVar(&req.Soft, "soft", false, "alert only, never refuse")
	_ = set.MarkFlagRequired("monthly")
	list := accountGetCommand(f, "list --account ID", "List an account's budgets with this month's use", "budgets", show)
	cmd.AddCommand(set, list)
	return cmd
}

func adjustmentCommand(f *adminFlags) *cobra.Command {
	var acct string
	var req adminapi.AdjustmentRequest
	cmd := &cobra.Command{
		Use:   "adjust-usage --account ID --corrects ENTRY_ID --amount -1.50 --reason TEXT [--idempotency-key K]",
		Short: "Correct a usage ledger entry by appending an adjustment (negative refunds); the ledger is never edited",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if strings.TrimSpace(req.Reason) == "" {
				return fmt.Errorf("--reason must say why: it goes on the ledger entry, the usage exports and the statement")
			}
			if req.IdempotencyKey == "" {
				req.IdempotencyKey = newIdempotencyKey()
			}
			// The answer's entry is billing's ledger entry (admin.Adjustment).
			var out struct {
				Entry    billing.UsageEntry `json:"entry"`
				Replayed bool               `json:"replayed"`
			}
			if err := f.do(cmd, http.MethodPost, accountPath(acct, "usage/adjustments"), req, &out); err != nil {
				return err
			}
			return emit(cmd, out, out.Entry.ID)
		},
	}
	cmd.Flags().StringVar(&acct, "account", "", "account id (required)")
	cmd.Flags().StringVar(&req.Corrects, "corrects", "", "the id of the entry to correct, e.g. ws_…:final (required)")
	cmd.Flags().StringVar(&req.Amount, "amount", "", "signed correction in currency units (required)")
	cmd.Flags().StringVar(&req.Reason, "reason", "", "why (required; kept with your operator name on the ledger entry, the usage exports and the statement)")
	cmd.Flags().StringVar(&req.IdempotencyKey, "idempotency-key", "", "a retry with the same key appends once (default: random)")
	for _, fl := range []string{"account", "corrects", "amount", "reason"} {
		_ = cmd.MarkFlagRequired(fl)
	}
	return cmd
}

// newIdempotencyKey returns a fresh key for an operator write the user gave
// none for: a retry of the same command is then a new write.
func newIdempotencyKey() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
