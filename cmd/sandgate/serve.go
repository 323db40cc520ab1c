package main

import (
	"context"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate/internal/broker"
)

func serveCommand() *cobra.Command {
	var configPath string
	var check bool
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the broker (TLS only) against Redis",
		Long: `serve runs the broker of the YAML config file (--config), with its
environment overrides (SANDGATE_ and the YAML path).
On SIGHUP it reads the config file again and reloads the TLS certificate
and key (renewed in place) and the operator tokens, dropping no
connection; a pair or token that does not load keeps what was in force
and is logged and counted (sandgate_config_reloads_total{result="failed"}).
Every other setting takes a restart.
With --check it validates everything serve checks before it serves, and
needs no network: the YAML (unknown keys refused), the overrides, the
defaults against the sizes, every provider's settings and the variables
its kind requires, the TLS files and the pair's match, the Redis CA file
and the operators' token variables. It prints "config OK" and exits 0,
or names each problem by its YAML path and exits 1.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := broker.LoadConfig(configPath, os.Getenv)
			if err == nil {
				err = cfg.Check(os.Getenv)
			}
			if err != nil {
				return err
			}
			log, closeLog, err := broker.NewLogger(cfg.Log.Level, cfg.Log.Format)
			if err != nil {
				return err
			}
			defer closeLog()
			if check {
				return emit(cmd, struct {
					Config string `json:"config"`
					OK     bool   `json:"ok"`
				}{configPath, true}, "config OK: "+configPath)
			}
			broker.RouteRedisLogs(log)
			opts := broker.Options{Log: log, Version: readBuildInfo().Version}
			if opts.TLS, err = cfg.ServeTLS(); err != nil {
				return err
			}
			if opts.TLS != nil {
				if opts.Certs, err = broker.LoadCertFiles(cfg.TLS.CertFile, cfg.TLS.KeyFile); err != nil {
					return err
				}
				opts.Certs.Apply(opts.TLS)
			}
			if opts.Redis, err = broker.NewRedis(cfg); err != nil {
				return err
			}
			defer opts.Redis.Close()
			if opts.Public, err = net.Listen("tcp", cfg.Listen); err != nil {
				return err
			}
			if opts.Admin, err = net.Listen("tcp", cfg.AdminListen); err != nil {
				opts.Public.Close()
				return err
			}
			return serve(cmd.Context(), configPath, *cfg, opts)
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "path of the YAML config file")
	cmd.Flags().BoolVar(&check, "check", false, "validate the config and exit without serving")
	return cmd
}

// serve is run with SIGHUP reloading the config file's certificate and
// operator tokens (broker.Broker.Reload) while the broker serves.
func serve(ctx context.Context, configPath string, cfg broker.Config, opts broker.Options) error {
	// Caught from the start: SIGHUP's default would end the process, and
	// one sent while the broker starts is applied once it runs.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	b, err := broker.New(ctx, cfg, opts)
	if err != nil {
		return err
	}
	defer b.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-done:
				return
			case <-hup:
			}
			// Reload logs and counts its own failure.
			_ = b.Reload(ctx, func() (*broker.Config, error) { return broker.LoadConfig(configPath, os.Getenv) })
		}
	}()
	return b.Run(ctx)
}

// run builds the broker and serves until ctx ends.
func run(ctx context.Context, cfg broker.Config, opts broker.Options) error {
	b, err := broker.New(ctx, cfg, opts)
	if err != nil {
		return err
	}
	defer b.Close()
	return b.Run(ctx)
}
