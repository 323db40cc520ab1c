package main

import (
	"context"
	"net"
	"os"

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
			return run(cmd.Context(), *cfg, opts)
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "path of the YAML config file")
	cmd.Flags().BoolVar(&check, "check", false, "validate the config and exit without serving")
	return cmd
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
