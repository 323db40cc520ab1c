package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
)

// NameTakenError is returned when an account name is another account's.
type NameTakenError struct {
	Name      string // as the new account asked for it
	AccountID string // the account that has it
}

func (e *NameTakenError) Error() string {
	return fmt.Sprintf("store: account name %q is taken by account %s", e.Name, e.AccountID)
}

// AccountNameKey is the form names are compared in: trimmed, lower-cased
// (Unicode simple folding), so "Acme" and " acme " are one name.
func AccountNameKey(name string) string { return strings.ToLower(strings.TrimSpace(name)) }

// CreateNamedAccount stores a new account whose name no other account
// has claimed (compared by [AccountNameKey]). The claim is one atomic
// HSETNX, so of two creates of one name at once exactly one succeeds; the
// other gets *NameTakenError naming the winner. The account's own id
// holding the name already is no conflict (a create sent again). A claim
// whose account could not be stored is released. Accounts created before
// names were claimed hold none, so names duplicated then stay as they are.
func (db *DB) CreateNamedAccount(ctx context.Context, a sandgate.Account) error {
	key := AccountNameKey(a.Name)
	owner, err := claimNameScript.Run(ctx, db.rdb, []string{accountNamesKey()}, key, a.ID).Text()
	if err != nil {
		return fmt.Errorf("create account: claim its name: %w", err)
	}
	if owner != a.ID {
		return &NameTakenError{Name: a.Name, AccountID: owner}
	}
	if err := db.CreateAccount(ctx, a); err != nil {
		// Released only if still ours; a failure here leaves a name
		// claimed by no account, which an operator can see with HGET.
		if rerr := releaseNameScript.Run(context.WithoutCancel(ctx), db.rdb, []string{accountNamesKey()}, key, a.ID).Err(); rerr != nil && !errors.Is(rerr, redis.Nil) {
			return errors.Join(err, fmt.Errorf("create account: release its name: %w", rerr))
		}
		return err
	}
	return nil
}

// claimNameScript claims a name for an account unless another has it.
//
// KEYS[1] account names HASH
// ARGV[1] name (AccountNameKey), ARGV[2] account id
// Returns the id of the account that holds the name now.
var claimNameScript = redis.NewScript(`
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
return redis.call('HGET', KEYS[1], ARGV[1])
`)

// releaseNameScript drops a name's claim if the account holds it.
//
// KEYS[1] account names HASH
// ARGV[1] name (AccountNameKey), ARGV[2] account id
// Returns 1 released, 0 not that account's.
var releaseNameScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
`)
