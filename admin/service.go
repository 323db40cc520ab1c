package admin

import (
	"context"
	"log/slog"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/saga"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/termination"
)

// service carries out the operator actions, with no HTTP in it: each
// action that takes more than one call of the store, the terminator or
// billing is one method here, which a handler calls once between decoding
// the request and encoding the answer. Methods that change something
// also return the change, for the audit log.
type service struct {
	cfg   Config
	db    *store.DB
	clock sandgate.Clock
	log   *slog.Logger
	provs *providers.Set
	term  *termination.Terminator
	bill  *billing.Billing
	// stripe is the Stripe sync; nil when the broker runs none.
	stripe StripeSync
	// saga runs operators' exec and file calls; nil when the broker runs none.
	saga *saga.Saga
	// images is the broker's image store; nil when it has none.
	images Images
}

// change is what an operator action changed, as the audit log records
// it. A zero field leaves the audit note's as it was.
type change struct {
	target        string // "broker", "account:ID", "instance:ID", …
	before, after any    // the changed object before and after (never a token)
	swept         *termination.Result
}

// storeErr is storeFailed for an error of the store, nil for none.
func storeErr(err error) error {
	if err == nil {
		return nil
	}
	return storeFailed(err)
}

// accountIDs returns acct alone once it is known to exist, or every
// account's id, sorted, when acct is "". Returns NotFound.
func (v *service) accountIDs(ctx context.Context, acct string) ([]string, error) {
	if acct != "" {
		if err := v.account(ctx, acct); err != nil {
			return nil, err
		}
		return []string{acct}, nil
	}
	as, err := v.db.Accounts(ctx)
	if err != nil {
		return nil, storeFailed(err)
	}
	ids := make([]string, 0, len(as))
	for _, a := range as {
		ids = append(ids, a.ID)
	}
	return ids, nil
}
