package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate/internal/broker"
)

func serveCommand() *cobra.Command {
	var configPath string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the broker (TLS only) against Redis",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := broker.LoadConfig(configPath, os.Getenv)
			if err != nil {
				return err
			}
			log, closeLog, err := broker.NewLogger(cfg.Log.Level, cfg.Log.Format)
			if err != nil {
				return err
			}
			defer closeLog()
			broker.RouteRedisLogs(log)
			opts := broker.Options{Log: log, Version: readBuildInfo().Version}
			switch {
			case cfg.TLS.CertFile != "" && cfg.TLS.KeyFile != "":
				cert, err := tls.LoadX509KeyPair(cfg.TLS.CertFile, cfg.TLS.KeyFile)
				if err != nil {
					return fmt.Errorf("tls: %w", err)
				}
				opts.TLS = broker.ServerTLS(cert)
			case cfg.TLS.CertFile != "" || cfg.TLS.KeyFile != "":
				return errors.New("tls: set both cert_file and key_file")
			case len(cfg.TLS.TrustedProxies) == 0:
				return errors.New("sandgate refuses plaintext: set tls.cert_file and tls.key_file, or tls.trusted_proxies for a TLS-terminating proxy")
			}
			if !broker.IsLoopback(cfg.AdminListen) {
				return fmt.Errorf("admin_listen %q is not a loopback address; the operator API serves plain HTTP and must stay on loopback (put a TLS proxy in front to expose it)", cfg.AdminListen)
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
