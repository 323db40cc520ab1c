package main

import (
	"cmp"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/conformance"
)

// conformanceCommand is `sandgate conformance`: the protocol's client
// checklist against a running broker, one line per check.
func conformanceCommand() *cobra.Command {
	var (
		cfg           conformance.Config
		token, caFile string
		output        string
		quiet         bool
		allowed, deny string
		endpoint      string
	)
	cmd := &cobra.Command{
		Use:   "conformance",
		Short: "Run the protocol v1 client checklist against a running broker",
		Long: `Run the protocol v1 client checklist against a running broker (sandgate or
any other implementation): lease, acquire, status, exec, files, a durable
command and its cancel, a snapshot and a warm start from it, egress to an
allowed domain and the refusal of another (with --allowed-domain), release,
and the codes of bad requests (no token, a bad token, bad JSON, an unknown
field, no Idempotency-Key, no egress, an unknown workspace or snapshot).
One workspace at a time; nothing is left behind.

Prints one line per check: "ok  NAME  12ms", "FAIL NAME: why" or
"skip NAME: why". Exits 1 when a check failed, 3 when the broker refused
the lease (the token), 4 when it could not be reached or answered 5xx. The URL, token and CA default to BROKER_URL, BROKER_TOKEN and
BROKER_CA, which 'sandgate dev' writes to .sandgate/dev.env. The egress
checks run curl inside the workspace.`,
		Example: `  set -a; . .sandgate/dev.env; set +a
  sandgate conformance
  sandgate conformance --url https://broker.example.com --token "$TOKEN" --allowed-domain github.com -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "" && output != "json" && output != "table" {
				return usageErr(fmt.Errorf("--output %q: want table or json", output))
			}
			cfg.URL = cmp.Or(endpoint, os.Getenv("BROKER_URL"))
			tok := cmp.Or(token, os.Getenv("BROKER_TOKEN"))
			if cfg.URL == "" || tok == "" {
				return usageErr(errors.New("--url and --token (or BROKER_URL and BROKER_TOKEN) are required"))
			}
			cfg.Token = sandgate.Secret(strings.TrimSpace(tok))
			if ca := cmp.Or(caFile, os.Getenv("BROKER_CA")); ca != "" {
				pem, err := os.ReadFile(ca)
				if err != nil {
					return usageErr(fmt.Errorf("--ca: %w", err))
				}
				cfg.RootCAs = x509.NewCertPool()
				if !cfg.RootCAs.AppendCertsFromPEM(pem) {
					return usageErr(fmt.Errorf("--ca %s: no PEM certificate", ca))
				}
			}
			cfg.AllowedDomain, cfg.DeniedDomain = allowed, deny
			if deny != "" && allowed == "" {
				return usageErr(errors.New("--denied-domain needs --allowed-domain: a refusal proves nothing without a fetch that passes"))
			}
			out := cmd.OutOrStdout()
			var report func(conformance.Result)
			if output != "json" {
				report = func(r conformance.Result) { printResult(out, r, quiet) }
			}
			results, err := conformance.Run(cmd.Context(), cfg, report)
			if err != nil {
				return usageErr(err)
			}
			if output == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(results); err != nil {
					return err
				}
			}
			var failed []string
			for _, r := range results {
				if !r.OK && !r.Skipped {
					failed = append(failed, r.Name)
				}
			}
			switch {
			case conformance.Unavailable(results):
				return &exitError{code: exitUnavailable, err: fmt.Errorf("conformance: the broker at %s is unavailable: %s", cfg.URL, results[0].Error)}
			case results[0].Status >= 400:
				return &exitError{code: exitRefused, err: fmt.Errorf("conformance: the broker refused the token: %s", results[0].Error)}
			case len(failed) > 0:
				return &exitError{code: exitFailure, err: fmt.Errorf("conformance: %d of %d checks failed: %s", len(failed), len(results), strings.Join(failed, ", "))}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&endpoint, "url", "", "the broker's base URL, https (default $BROKER_URL)")
	fl.StringVar(&token, "token", "", "an instance token (default $BROKER_TOKEN; the variable keeps it out of ps)")
	fl.StringVar(&caFile, "ca", "", "a PEM file of the CA that signed the broker's certificate (default $BROKER_CA; none: the system roots)")
	fl.StringVar(&allowed, "allowed-domain", "", "a domain (optionally :port) the workspace may reach; enables the egress checks")
	fl.StringVar(&deny, "denied-domain", "", "a domain the workspace must not reach (default example.com)")
	fl.StringVarP(&output, "output", "o", "", "output format: table (default) or json")
	fl.BoolVarP(&quiet, "quiet", "q", false, "print only failed checks")
	return cmd
}

// printResult writes one check's line.
func printResult(w io.Writer, r conformance.Result, quiet bool) {
	switch {
	case r.OK:
		if !quiet {
			fmt.Fprintf(w, "ok    %-30s %dms\n", r.Name, r.DurationMS)
		}
	case r.Skipped:
		if !quiet {
			fmt.Fprintf(w, "skip  %s: %s\n", r.Name, r.Error)
		}
	default:
		fmt.Fprintf(w, "FAIL  %s: %s\n", r.Name, r.Error)
	}
}
