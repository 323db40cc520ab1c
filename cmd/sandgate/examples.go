package main

import "github.com/spf13/cobra"

// examples are the Examples: sections of the commands that do not set
// their own, by command path. TestEveryCommandHasExamples keeps every
// command covered.
var examples = map[string]string{
	"sandgate": `  sandgate dev
  sandgate admin workspace list
  sandgate usage summary --group-by day`,
	"sandgate admin": `  sandgate admin account create --name acme
  sandgate admin stop on --reason incident
  sandgate admin workspace kill ws_…`,
	"sandgate admin account":        `  ACCT=$(sandgate admin account create --name acme)`,
	"sandgate admin account create": `  ACCT=$(sandgate admin account create --name acme)`,
	"sandgate admin account list": `  sandgate admin account list
  sandgate admin account list -o json`,
	"sandgate admin audit": `  sandgate admin audit --from 2026-01-01T00:00:00Z --to 2026-02-01T00:00:00Z --out jan.jsonl
  sandgate admin audit | jq -c 'select(.outcome.status >= 400)'`,
	"sandgate admin billing":     `  sandgate admin billing set --account "$ACCT" --rate-card std --currency USD`,
	"sandgate admin billing get": `  sandgate admin billing get --account "$ACCT"`,
	"sandgate admin billing set": `  sandgate admin billing set --account "$ACCT" --rate-card std --currency USD
  sandgate admin billing set --account "$ACCT" --rate-card std --currency EUR --postpaid
  sandgate admin billing set --account "$ACCT" --free`,
	"sandgate admin budget":      `  sandgate admin budget set --account "$ACCT" --monthly 100.00`,
	"sandgate admin budget list": `  sandgate admin budget list --account "$ACCT"`,
	"sandgate admin budget set": `  sandgate admin budget set --account "$ACCT" --monthly 100.00
  sandgate admin budget set --account "$ACCT" --instance "$INST" --monthly 20.00 --soft
  sandgate admin budget set --account "$ACCT" --monthly 0   # removes it`,
	"sandgate admin funds":              `  sandgate admin funds credit --account "$ACCT" --amount 25.00 --reason "wire 123"`,
	"sandgate admin funds adjust-usage": `  sandgate admin funds adjust-usage --account "$ACCT" --corrects ws_…:final --amount -1.50 --reason "outage credit"`,
	"sandgate admin funds balance": `  sandgate admin funds balance --account "$ACCT"
  sandgate admin funds balance --account "$ACCT" -o json`,
	"sandgate admin funds credit": `  sandgate admin funds credit --account "$ACCT" --amount 25.00 --reason "wire 123" --idempotency-key wire-123`,
	"sandgate admin funds debit":  `  sandgate admin funds debit --account "$ACCT" --amount 5.00 --reason "refund 7"`,
	"sandgate admin instance":     `  INST=$(sandgate admin instance create --account "$ACCT" --max-concurrent 2)`,
	"sandgate admin instance create": `  INST=$(sandgate admin instance create --account "$ACCT" \
    --max-concurrent 2 --max-lifetime 1h --idle-timeout 15m --sizes small,standard --default-size small)`,
	"sandgate admin instance get": `  sandgate admin instance get "$INST"`,
	"sandgate admin instance list": `  sandgate admin instance list
  sandgate admin instance list --account "$ACCT"`,
	"sandgate admin instance providers":    `  sandgate admin instance providers`,
	"sandgate admin instance set-provider": `  sandgate admin instance set-provider "$INST" --provider local`,
	"sandgate admin limits":                `  sandgate admin limits set --account "$ACCT" --acquires-per-minute 60`,
	"sandgate admin limits get":            `  sandgate admin limits get --account "$ACCT"`,
	"sandgate admin limits set":            `  sandgate admin limits set --account "$ACCT" --acquires-per-minute 60 --max-open 20 --max-size standard`,
	"sandgate admin pause": `  sandgate admin pause --account "$ACCT" --reason payment
  sandgate admin pause --instance "$INST" --for 2h`,
	"sandgate admin rate-card":              `  sandgate admin rate-card create --name std --currency USD --small 0.000100 --standard 0.000200 --large 0.000400 --xlarge 0.000800`,
	"sandgate admin rate-card create":       `  sandgate admin rate-card create --name std --currency USD --small 0.000100 --standard 0.000200 --large 0.000400 --xlarge 0.000800`,
	"sandgate admin rate-card list":         `  sandgate admin rate-card list`,
	"sandgate admin rate-card set-currency": `  sandgate admin rate-card set-currency std --currency USD`,
	"sandgate admin resume": `  sandgate admin resume --account "$ACCT"
  sandgate admin resume --instance "$INST"`,
	"sandgate admin status": `  sandgate admin status
  sandgate admin status -o json`,
	"sandgate admin stop": `  sandgate admin stop on --reason incident --note "vendor outage"
  sandgate admin stop on --account "$ACCT" --reason abuse --for 2h
  sandgate admin stop off --account "$ACCT"
  sandgate admin stop off`,
	"sandgate admin token":           `  TOKEN=$(sandgate admin token issue --instance "$INST")`,
	"sandgate admin token end-grace": `  sandgate admin token end-grace --instance "$INST"`,
	"sandgate admin token issue": `  TOKEN=$(sandgate admin token issue --instance "$INST")
  sandgate admin token issue --instance "$INST" --ttl 720h`,
	"sandgate admin token list": `  sandgate admin token list --instance "$INST"`,
	"sandgate admin token revoke": `  sandgate admin token revoke --instance "$INST"
  sandgate admin token revoke --instance "$INST" --keep-workspaces`,
	"sandgate admin token rotate": `  NEW=$(sandgate admin token rotate --instance "$INST" --grace 1h)`,
	"sandgate dev": `  go run ./cmd/sandgate dev
  sandgate dev --listen 127.0.0.1:9443 --admin-listen 127.0.0.1:9444 --data-dir /tmp/sg`,
	"sandgate serve": `  sandgate serve --config /etc/sandgate/sandgate.yaml`,
	"sandgate version": `  sandgate version
  sandgate --version`,
	"sandgate usage": `  sandgate usage summary --group-by size
  sandgate usage export --format csv --out usage.csv`,
	"sandgate usage export": `  sandgate usage export --format csv --out usage-2026-10.csv --from 2026-10-01T00:00:00Z --to 2026-11-01T00:00:00Z
  sandgate usage export --format jsonl --account "$ACCT"`,
	"sandgate usage reconcile": `  sandgate usage reconcile
  sandgate usage reconcile --account "$ACCT" -o json`,
	"sandgate usage stripe": `  sandgate usage stripe status "$ACCT"
  sandgate usage stripe retry "$ACCT"`,
}

// addExamples sets the Examples: section of every command under root
// that has none from the examples table.
func addExamples(root *cobra.Command) {
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Example == "" {
			c.Example = examples[c.CommandPath()]
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
}
