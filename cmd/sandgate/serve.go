package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/spf13/cobra"
)

func serveCommand() *cobra.Command {
	var configPath string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the broker (TLS only) against Redis",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(configPath, os.Getenv)
			if err != nil {
				return err
			}
			log, closeLog, err := newLogger(cfg.Log.Level, cfg.Log.Format)
			if err != nil {
				return err
			}
			defer closeLog()
			routeRedisLogs(log)
			ops, err := cfg.operatorTokens(os.Getenv)
			if err != nil {
				return err
			}
			b := &broker{cfg: cfg, log: log, operators: ops}
			switch {
			case cfg.TLS.CertFile != "" && cfg.TLS.KeyFile != "":
				cert, err := tls.LoadX509KeyPair(cfg.TLS.CertFile, cfg.TLS.KeyFile)
				if err != nil {
					return fmt.Errorf("tls: %w", err)
				}
				b.tls = serverTLS(cert)
			case cfg.TLS.CertFile != "" || cfg.TLS.KeyFile != "":
				return errors.New("tls: set both cert_file and key_file")
			case len(cfg.TLS.TrustedProxies) == 0:
				return errors.New("sandgate refuses plaintext: set tls.cert_file and tls.key_file, or tls.trusted_proxies for a TLS-terminating proxy")
			}
			if !isLoopback(cfg.AdminListen) {
				return fmt.Errorf("admin_listen %q is not a loopback address; the operator API serves plain HTTP and must stay on loopback (put a TLS proxy in front to expose it)", cfg.AdminListen)
			}
			if b.rdb, err = newRedis(cfg); err != nil {
				return err
			}
			defer b.rdb.Close()
			if b.public, err = net.Listen("tcp", cfg.Listen); err != nil {
				return err
			}
			if b.admin, err = net.Listen("tcp", cfg.AdminListen); err != nil {
				b.public.Close()
				return err
			}
			return b.run(cmd.Context())
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "path of the YAML config file")
	return cmd
}
