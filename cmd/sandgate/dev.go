package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/broker"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/token"
)

// devState is what `sandgate dev` keeps between runs in DATA_DIR/dev.json
// (mode 0600), so the printed token keeps working after a restart.
type devState struct {
	AccountID  string `json:"account_id"`
	InstanceID string `json:"instance_id"`
	LeaseID    string `json:"lease_id"`
	Token      string `json:"token"`
	AdminToken string `json:"admin_token"`
	// FinanceToken is an operator token of role finance, for the README's
	// finance section and the console's finance view.
	FinanceToken string `json:"finance_token"`
}

// operatorPrefix starts dev operator tokens, so scanners tell them apart
// from client tokens.
const operatorPrefix = "sgo_"

func devCommand() *cobra.Command {
	var listen, adminListen, dataDir, provider string
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a broker with zero set-up: embedded store, local provider, self-signed TLS",
		Long: `dev runs a complete broker for trying sandgate: an embedded in-memory
Redis-protocol store (nothing survives a restart but the token), the local
bubblewrap provider, and a self-signed CA. It bootstraps one account,
instance and token, an admin and a finance operator token, and prints
them, also writing DATA_DIR/dev.env.
With --provider KIND the instance runs on that provider instead, its
credentials and endpoint read from the vendor's own environment variables
(see the README); the local provider is configured beside it.
It is not for production and never for money.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDev(cmd.Context(), listen, adminListen, dataDir, provider)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8443", "address of the broker's HTTPS listener")
	cmd.Flags().StringVar(&adminListen, "admin-listen", "127.0.0.1:8444", "address of the operator API (loopback)")
	cmd.Flags().StringVar(&dataDir, "data-dir", ".sandgate", "directory for certificates, dev state and workspaces")
	cmd.Flags().StringVar(&provider, "provider", "local", "provider kind of the dev instance (its settings come from the vendor's environment variables)")
	return cmd
}

func runDev(ctx context.Context, listen, adminListen, dataDir, provider string) error {
	dataDir, err := filepath.Abs(dataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return err
	}
	if !broker.IsLoopback(adminListen) {
		return fmt.Errorf("--admin-listen %q must be a loopback address", adminListen)
	}
	cfg, err := broker.DevConfig(dataDir, provider)
	if err != nil {
		return err
	}
	log, closeLog, err := broker.NewLogger("info", "json")
	if err != nil {
		return err
	}
	defer closeLog()
	broker.RouteRedisLogs(log)
	clock := sandgate.SystemClock{}
	cert, caPath, err := broker.DevCerts(dataDir, clock.Now())
	if err != nil {
		return err
	}
	st, err := loadDevState(filepath.Join(dataDir, "dev.json"))
	if err != nil {
		return err
	}

	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		return fmt.Errorf("embedded store: %w", err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	// The embedded store starts empty, so sandboxes of an earlier run have
	// no record: remove them rather than leave them running unaccounted.
	if err := os.RemoveAll(filepath.Join(dataDir, "local")); err != nil {
		return err
	}
	if err := bootstrapDev(ctx, store.New(rdb, store.Config{}), &st, provider, clock); err != nil {
		return err
	}
	if err := saveDevState(filepath.Join(dataDir, "dev.json"), st); err != nil {
		return err
	}

	cfg.Operators = []broker.OperatorConfig{{Name: "dev", Role: "admin", Token: sandgate.Secret(st.AdminToken)},
		{Name: "dev-finance", Role: "finance", Token: sandgate.Secret(st.FinanceToken)}}
	opts := broker.Options{Redis: rdb, Log: log, Version: readBuildInfo().Version, TLS: broker.ServerTLS(cert)}
	if opts.Public, err = net.Listen("tcp", listen); err != nil {
		return err
	}
	if opts.Admin, err = net.Listen("tcp", adminListen); err != nil {
		opts.Public.Close()
		return err
	}
	env := devEnv(opts.Public.Addr().String(), opts.Admin.Addr().String(), caPath, st)
	if err := os.WriteFile(filepath.Join(dataDir, "dev.env"), []byte(env), 0o600); err != nil {
		return err
	}
	fmt.Print(env)
	return run(ctx, *cfg, opts)
}

func devEnv(public, adminAddr, caPath string, st devState) string {
	var b strings.Builder
	fmt.Fprintf(&b, "BROKER_URL=https://%s\n", public)
	fmt.Fprintf(&b, "BROKER_CA=%s\n", caPath)
	fmt.Fprintf(&b, "BROKER_TOKEN=%s\n", st.Token)
	fmt.Fprintf(&b, "SANDGATE_ADMIN_URL=http://%s\n", adminAddr)
	fmt.Fprintf(&b, "SANDGATE_ADMIN_TOKEN=%s\n", st.AdminToken)
	fmt.Fprintf(&b, "FINANCE_TOKEN=%s\n", st.FinanceToken)
	fmt.Fprintf(&b, "# try: curl --cacert \"$BROKER_CA\" -H \"Authorization: Bearer $BROKER_TOKEN\" \"$BROKER_URL/v1/lease\"\n")
	return b.String()
}

func loadDevState(path string) (devState, error) {
	var st devState
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return devState{}, fmt.Errorf("%s: %w (delete it to start afresh)", path, err)
	}
	return st, nil
}

func saveDevState(path string, st devState) error {
	b, _ := json.MarshalIndent(st, "", "  ")
	return os.WriteFile(path, b, 0o600)
}

// bootstrapDev creates the dev account, instance and token, reusing the
// ids and tokens of an earlier run when st has them.
func bootstrapDev(ctx context.Context, db *store.DB, st *devState, provider string, clock sandgate.Clock) error {
	now := clock.Now()
	if st.AccountID == "" || !token.Valid(st.Token, token.Prefix) || !token.Valid(st.AdminToken, operatorPrefix) {
		*st = devState{
			AccountID:  sandgate.NewID(sandgate.PrefixAccount),
			InstanceID: sandgate.NewID(sandgate.PrefixInstance),
			LeaseID:    sandgate.NewID(sandgate.PrefixLease),
			Token:      token.New(token.Prefix).Reveal(),
			AdminToken: token.New(operatorPrefix).Reveal(),
		}
	}
	if !token.Valid(st.FinanceToken, operatorPrefix) {
		st.FinanceToken = token.New(operatorPrefix).Reveal() // dev.json of a run before finance tokens
	}
	if err := db.CreateAccount(ctx, sandgate.Account{ID: st.AccountID, Name: "dev", CreatedAt: now}); err != nil {
		return fmt.Errorf("bootstrap account: %w", err)
	}
	// The local provider reaches domains through the broker's egress
	// proxy: ceiling null, any valid domain up to max_egress_domains.
	// Another provider kind gets no egress at all, the one ceiling every
	// provider can enforce.
	scope := sandgate.Scope{EgressCeiling: []string{}, Limits: sandgate.DefaultLimits}
	if provider == "local" {
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
// starts funded with devFunds, so acquires work at once and every
// workspace shows up in the usage ledger with a price.
const devFunds = "100.00"

// devPrices are the dev rate card's prices per second, in USD.
var devPrices = map[string]string{"small": "0.000010", "standard": "0.000020", "large": "0.000040", "xlarge": "0.000080"}

func bootstrapDevBilling(ctx context.Context, b *billing.Billing, acct string, now time.Time) error {
	prices := map[string]int64{}
	for size, p := range devPrices {
		v, err := billing.ParseAmount(p)
		if err != nil {
			return err
		}
		prices[size] = v
	}
	if _, err := b.CreateRateCard(ctx, "dev", prices, now); err != nil {
		return fmt.Errorf("bootstrap rate card: %w", err)
	}
	if err := b.SetSettings(ctx, billing.Settings{AccountID: acct, RateCard: "dev", Currency: "USD"}); err != nil {
		return fmt.Errorf("bootstrap billing: %w", err)
	}
	amt, _ := billing.ParseAmount(devFunds)
	_, _, err := b.Adjust(ctx, acct, billing.FundsEntry{Key: "dev-bootstrap", Kind: billing.KindCredit,
		AmountMicros: amt, Reason: "sandgate dev: opening funds", Actor: "sandgate dev", At: now})
	if err != nil {
		return fmt.Errorf("bootstrap funds: %w", err)
	}
	return nil
}
