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

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/broker"
)

// operatorPrefix starts the operator tokens this binary makes.
const operatorPrefix = broker.OperatorPrefix

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
(see the README); the local provider is configured beside it. Fly Machines
and Fly Sprites reach domains through the broker's egress proxy on a
loopback port dev picks, and run the sandgate-guest agent found beside
sandgate (built from the checkout into DATA_DIR/bin under go run).
The SANDGATE_* overrides serve reads apply too; a flag wins over its own.
It is not for production and never for money.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The SANDGATE_* overrides serve honours apply to dev too; a
			// flag given on the command line wins over its override.
			for flag, env := range map[string]string{"listen": "SANDGATE_LISTEN", "admin-listen": "SANDGATE_ADMIN_LISTEN", "data-dir": "SANDGATE_DATA_DIR"} {
				if v := os.Getenv(env); v != "" && !cmd.Flags().Changed(flag) {
					_ = cmd.Flags().Set(flag, v)
				}
			}
			show := func(v devVars, env string) error { return emit(cmd, v, strings.TrimSuffix(env, "\n")) }
			return runDev(cmd.Context(), listen, adminListen, dataDir, provider, show)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8443", "address of the broker's HTTPS listener")
	cmd.Flags().StringVar(&adminListen, "admin-listen", "127.0.0.1:8444", "address of the operator API (loopback)")
	cmd.Flags().StringVar(&dataDir, "data-dir", ".sandgate", "directory for certificates, dev state and workspaces")
	cmd.Flags().StringVar(&provider, "provider", "local", "provider kind of the dev instance (its settings come from the vendor's environment variables)")
	return cmd
}

// runDev runs the dev broker, calling show with what it prints (and
// writes to dev.env) once it listens.
func runDev(ctx context.Context, listen, adminListen, dataDir, provider string, show func(devVars, string) error) error {
	dataDir, err := filepath.Abs(dataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return err
	}
	if !broker.IsLoopback(adminListen) {
		return usageErr(fmt.Errorf("--admin-listen %q must be a loopback address", adminListen))
	}
	// A second dev on this directory would remove the first one's
	// workspaces (below): refuse it, naming the holder.
	release, err := broker.LockDataDir(dataDir)
	if err != nil {
		return err
	}
	defer release()
	cfg, err := broker.DevConfig(dataDir, provider, os.Getenv)
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
	if cfg.Egress.VendorListen != "" && cfg.Egress.VendorURL == "" && cfg.Egress.VendorCAFile == "" {
		// dev's own vendor listener serves dev's certificate.
		cfg.Egress.VendorCAFile = caPath
	}
	if err := cfg.DevGuestBinary(ctx, provider); err != nil {
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
	if err := broker.BootstrapDev(ctx, rdb, &st, provider, cfg.DevAnyEgress(provider), clock); err != nil {
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
	vars := devVars{BrokerURL: "https://" + opts.Public.Addr().String(), BrokerCA: caPath, BrokerToken: st.Token,
		AdminURL: "http://" + opts.Admin.Addr().String(), AdminToken: st.AdminToken, FinanceToken: st.FinanceToken}
	env := vars.env()
	if err := os.WriteFile(filepath.Join(dataDir, "dev.env"), []byte(env), 0o600); err != nil {
		return err
	}
	if err := show(vars, env); err != nil {
		return err
	}
	return run(ctx, *cfg, opts)
}

// devVars are what dev prints and writes to dev.env, named as there.
type devVars struct {
	BrokerURL    string `json:"BROKER_URL"`
	BrokerCA     string `json:"BROKER_CA"`
	BrokerToken  string `json:"BROKER_TOKEN"`
	AdminURL     string `json:"SANDGATE_ADMIN_URL"`
	AdminToken   string `json:"SANDGATE_ADMIN_TOKEN"`
	FinanceToken string `json:"FINANCE_TOKEN"`
}

// env is v as dev.env's lines.
func (v devVars) env() string {
	var b strings.Builder
	fmt.Fprintf(&b, "BROKER_URL=%s\n", v.BrokerURL)
	fmt.Fprintf(&b, "BROKER_CA=%s\n", v.BrokerCA)
	fmt.Fprintf(&b, "BROKER_TOKEN=%s\n", v.BrokerToken)
	fmt.Fprintf(&b, "SANDGATE_ADMIN_URL=%s\n", v.AdminURL)
	fmt.Fprintf(&b, "SANDGATE_ADMIN_TOKEN=%s\n", v.AdminToken)
	fmt.Fprintf(&b, "FINANCE_TOKEN=%s\n", v.FinanceToken)
	fmt.Fprintf(&b, "# try: curl --cacert \"$BROKER_CA\" -H \"Authorization: Bearer $BROKER_TOKEN\" \"$BROKER_URL/v1/lease\"\n")
	return b.String()
}

func loadDevState(path string) (broker.DevState, error) {
	var st broker.DevState
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return broker.DevState{}, fmt.Errorf("%s: %w (delete it to start afresh)", path, err)
	}
	return st, nil
}

func saveDevState(path string, st broker.DevState) error {
	b, _ := json.MarshalIndent(st, "", "  ")
	return os.WriteFile(path, b, 0o600)
}
