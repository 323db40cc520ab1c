package broker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/token"
)

// DevState is what `sandgate dev` keeps between runs in DATA_DIR/dev.json
// (mode 0600), so the printed token keeps working after a restart.
type DevState struct {
	AccountID  string `json:"account_id"`
	InstanceID string `json:"instance_id"`
	LeaseID    string `json:"lease_id"`
	Token      string `json:"token"`
	AdminToken string `json:"admin_token"`
	// FinanceToken is an operator token of role finance, for the README's
	// finance section and the console's finance view.
	FinanceToken string `json:"finance_token"`
}

// OperatorPrefix starts operator tokens the broker's tools make, so
// scanners tell them apart from client tokens.
const OperatorPrefix = "sgo_"

// BootstrapDev creates the dev account, instance and token in rdb,
// reusing the ids and tokens of an earlier run when st has them, and
// prices and funds the account (DevFunds, DevPrices). anyEgress gives the
// instance egress ceiling null: its provider enforces domain allowlists
// through the broker's egress proxy.
func BootstrapDev(ctx context.Context, rdb redis.UniversalClient, st *DevState, provider string, anyEgress bool, clock sandgate.Clock) error {
	db := store.New(store.Config{}, rdb)
	now := clock.Now()
	if st.AccountID == "" || !token.Valid(st.Token, token.Prefix) || !token.Valid(st.AdminToken, OperatorPrefix) {
		*st = DevState{
			AccountID:  sandgate.NewID(sandgate.PrefixAccount),
			InstanceID: sandgate.NewID(sandgate.PrefixInstance),
			LeaseID:    sandgate.NewID(sandgate.PrefixLease),
			Token:      token.New(token.Prefix).Reveal(),
			AdminToken: token.New(OperatorPrefix).Reveal(),
		}
	}
	if !token.Valid(st.FinanceToken, OperatorPrefix) {
		st.FinanceToken = token.New(OperatorPrefix).Reveal() // dev.json of a run before finance tokens
	}
	if err := db.CreateAccount(ctx, sandgate.Account{ID: st.AccountID, Name: "dev", CreatedAt: now}); err != nil {
		return fmt.Errorf("bootstrap account: %w", err)
	}
	// A provider that reaches domains through the broker's egress proxy
	// gets ceiling null: any valid domain up to max_egress_domains.
	// Another gets no egress at all, the one ceiling every provider can
	// enforce.
	scope := sandgate.Scope{EgressCeiling: []string{}, Limits: sandgate.DefaultLimits}
	if anyEgress {
		scope.EgressCeiling = nil
	}
	in := sandgate.Instance{ID: st.InstanceID, AccountID: st.AccountID, Name: "dev", Provider: provider, Scope: scope, CreatedAt: now}
	if err := db.PutInstance(ctx, in); err != nil {
		return fmt.Errorf("bootstrap instance: %w", err)
	}
	tok := sandgate.Secret(st.Token)
	l := sandgate.Lease{ID: st.LeaseID, TokenHash: token.Hash(tok), TokenPrefix: token.DisplayPrefix(tok),
		InstanceID: st.InstanceID, AccountID: st.AccountID, IssuedAt: now}
	if err := db.IssueLease(ctx, l, false, now, 0); err != nil {
		return fmt.Errorf("bootstrap token: %w", err)
	}
	return bootstrapDevBilling(ctx, billing.New(billing.Config{}, billing.Deps{DB: db}), st.AccountID, now)
}

// Dev billing: the dev account is prepaid in USD on rate card "dev" and
// starts funded with DevFunds, so acquires work at once and every
// workspace shows up in the usage ledger with a price.
const DevFunds = "100.00"

// DevPrices returns the dev rate card's prices per second, in USD, by size.
func DevPrices() map[string]string {
	return map[string]string{"small": "0.000010", "standard": "0.000020", "large": "0.000040", "xlarge": "0.000080"}
}

func bootstrapDevBilling(ctx context.Context, b *billing.Billing, acct string, now time.Time) error {
	prices := map[string]int64{}
	for size, p := range DevPrices() {
		v, err := billing.ParseAmount(p)
		if err != nil {
			return err
		}
		prices[size] = v
	}
	_, err := b.CreateRateCard(ctx, "dev", "USD", prices, now)
	if errors.Is(err, billing.ErrCardCurrency) {
		// A dev store from before cards had currencies: the dev card was
		// always priced in USD (DevPrices), so this is no guess.
		if _, err = b.SetRateCardCurrency(ctx, "dev", "USD"); err == nil {
			_, err = b.CreateRateCard(ctx, "dev", "USD", prices, now)
		}
	}
	if err != nil {
		return fmt.Errorf("bootstrap rate card: %w", err)
	}
	if err := b.SetSettings(ctx, billing.Settings{AccountID: acct, RateCard: "dev", Currency: "USD"}); err != nil {
		return fmt.Errorf("bootstrap billing: %w", err)
	}
	amt, _ := billing.ParseAmount(DevFunds)
	_, _, err = b.Adjust(ctx, acct, billing.FundsEntry{Key: "dev-bootstrap", Kind: billing.KindCredit,
		AmountMicros: amt, Reason: "sandgate dev: opening funds", Actor: "sandgate dev", At: now})
	if err != nil {
		return fmt.Errorf("bootstrap funds: %w", err)
	}
	return nil
}

// DevAnyEgress reports whether dev's instance on provider gets egress
// ceiling null: the local provider, and a vendor kind whose guests reach
// the egress proxy (egress.vendor_listen).
func (c *Config) DevAnyEgress(provider string) bool {
	return provider == "local" || (VendorKind(provider) && c.Egress.VendorListen != "")
}

// DevGuestBinary makes sure a vendor provider of dev has its
// sandgate-guest agent. With neither guest_binary nor one beside the
// executable (`go run ./cmd/sandgate dev` runs from the build cache), and
// the working directory inside a checkout of sandgate, it builds the agent
// from that checkout into DATA_DIR/bin (static and stripped: it runs on
// guests of any distribution, and every Machine's config carries it) and sets guest_binary to it. Otherwise it leaves
// the path to the provider, whose Open names it when it is missing.
func (c *Config) DevGuestBinary(ctx context.Context, provider string) error {
	if !VendorKind(provider) || c.GuestBinary != "" {
		return nil
	}
	if _, err := os.Stat(c.guestBinary()); err == nil {
		return nil
	}
	root, ok := checkoutRoot()
	if !ok {
		return nil
	}
	out := filepath.Join(c.DataDir, "bin", providers.GuestBinaryName)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./cmd/sandgate-guest")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the sandgate-guest agent from the checkout at %s: %w\n%s", root, err, b)
	}
	c.GuestBinary = out
	return nil
}

// checkoutRoot finds the sandgate module's root at or above the working
// directory.
func checkoutRoot() (string, bool) {
	dir, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil {
			first, _, _ := strings.Cut(string(b), "\n")
			return dir, strings.TrimSpace(first) == "module github.com/sandgate/sandgate"
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}
