package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/token"
)

// operatorTokenCommand is `sandgate operator-token`: it mints an operator
// token for `serve` locally (no broker is asked) and prints the config
// entry that grants it, with only the token's SHA-256 in it.
func operatorTokenCommand() *cobra.Command {
	var name, role string
	cmd := &cobra.Command{
		Use:   "operator-token --name NAME --role admin|operator|finance",
		Short: "Mint an operator token for serve; prints the token, and the operators: entry to add to the config on stderr",
		Long: `operator-token makes a new random operator token (sgo_ + 256 bits + a
checksum, like client tokens) without asking any broker. It prints the token
alone on stdout (give it to the operator; it is shown once) and, on stderr,
the entry to add under operators: in the config. The entry holds only the
token's SHA-256, so the config file never holds the token; the audit log
then names the operator by name alone. To have the actor carry the token's
prefix too, put the token in an environment variable and use token_env.`,
		Example: `  sandgate operator-token --name alice --role admin > alice.token
  sandgate operator-token --name books --role finance -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch adminapi.Role(role) {
			case adminapi.RoleAdmin, adminapi.RoleOperator, adminapi.RoleFinance:
			default:
				return fmt.Errorf("--role %q: want admin, operator or finance", role)
			}
			if name == "" {
				return fmt.Errorf("--name is required")
			}
			tok := token.New(operatorPrefix)
			hash := token.Hash(tok)
			out := struct {
				Name        string `json:"name"`
				Role        string `json:"role"`
				Token       string `json:"token"`
				TokenSHA256 string `json:"token_sha256"`
			}{name, role, tok.Reveal(), hash}
			if err := emit(cmd, out, tok.Reveal()); err != nil {
				return err
			}
			if o, _ := outputOf(cmd); !o.text() {
				return nil
			}
			_, err := fmt.Fprintf(cmd.ErrOrStderr(), "# add under operators: in the config:\n  - name: %s\n    role: %s\n    token_sha256: %q\n", name, role, hash)
			return err
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "the operator's name, as the audit log shows it (required)")
	cmd.Flags().StringVar(&role, "role", "", "admin, operator or finance (required)")
	return cmd
}
