package adminapi

import "github.com/sandgate/sandgate"

// Role is what an operator token may do.
type Role string

// Roles, from most to least powerful.
const (
	RoleAdmin    Role = "admin"    // everything
	RoleOperator Role = "operator" // stop, pause, revoke, read
	RoleFinance  Role = "finance"  // read usage and balances only
)

// OperatorToken is one configured operator credential. Only its SHA-256
// and, when known, its first characters are kept.
type OperatorToken struct {
	Name string
	Role Role
	Hash string // hex SHA-256 of the token
	// Prefix is the token's first characters (TokenPrefix), recorded with
	// Name as the actor of its actions. Empty when the configuration has
	// only the token's hash: the actor is then Name alone.
	Prefix string
}

// Actor is how the token is named in the audit log and in the controls it
// sets: "name:prefix", or the name alone without a prefix.
func (t OperatorToken) Actor() string {
	if t.Prefix == "" {
		return t.Name
	}
	return t.Name + ":" + t.Prefix
}

// TokenPrefix returns the first 8 characters of an operator token, the
// OperatorToken's Prefix. A token shorter than 16 characters gets none,
// since 8 of its characters would give too much of it away.
func TokenPrefix(s sandgate.Secret) string {
	r := []rune(s.Reveal())
	if len(r) < 16 {
		return ""
	}
	return string(r[:8])
}
