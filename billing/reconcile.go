package billing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/tick"
	"github.com/sandgate/sandgate/store"
)

// Report is the reconciliation of one account: its stored funds against
// what its ledgers say they must be.
type Report struct {
	AccountID string  `json:"account_id"`
	Stored    Balance `json:"stored"`
	// Billing is the account's billing state (StateConfigured, StateFree
	// or StateNotConfigured), so finance sees every account that costs
	// nothing and every one that cannot acquire.
	Billing string `json:"billing"`
	// Expected counters, recomputed: credits and debits from the funds
	// ledger, settled from the usage ledger, holds from the open holds.
	ExpectedCredits int64 `json:"expected_credits_micros"`
	ExpectedDebits  int64 `json:"expected_debits_micros"`
	ExpectedSettled int64 `json:"expected_settled_micros"`
	ExpectedBalance int64 `json:"expected_balance_micros"`
	ExpectedHolds   int64 `json:"expected_holds_micros"`
	OpenHolds       int   `json:"open_holds"`
	UsageEntries    int   `json:"usage_entries"`
	// Drift lists every disagreement; empty when the account reconciles.
	Drift []string `json:"drift"`
}

// Reconcile recomputes an account's balance from its ledgers and compares
// it with the stored counters and open holds. An open hold whose
// workspace is terminated (its settlement failed) or gone is drift too.
func (b *Billing) Reconcile(ctx context.Context, acct string) (Report, error) {
	r := Report{AccountID: acct, Drift: []string{}}
	var err error
	if r.Stored, err = b.Balance(ctx, acct); err != nil {
		return r, err
	}
	st, err := b.Settings(ctx, acct)
	if err != nil {
		return r, err
	}
	r.Billing = st.State()
	err = b.fundsEntries(ctx, acct, func(_ string, e FundsEntry) error {
		if e.Kind == KindCredit {
			r.ExpectedCredits += e.AmountMicros
		} else {
			r.ExpectedDebits += e.AmountMicros
		}
		return nil
	})
	if err != nil {
		return r, err
	}
	seen := map[string]bool{}
	err = b.ledger.Scan(ctx, acct, zeroTime, zeroTime, func(e UsageEntry) error {
		r.UsageEntries++
		r.ExpectedSettled += e.AmountMicros
		if seen[e.ID] {
			r.Drift = append(r.Drift, "usage entry "+e.ID+" appears more than once")
		}
		seen[e.ID] = true
		return nil
	})
	if err != nil {
		return r, err
	}
	holds, err := b.rdb.HGetAll(ctx, holdsKey(acct)).Result()
	if err != nil {
		return r, err
	}
	for ws, v := range holds {
		n, _ := strconv.ParseInt(v, 10, 64)
		r.ExpectedHolds += n
		r.OpenHolds++
		w, err := b.db.Workspace(ctx, acct, ws)
		switch {
		case errors.Is(err, store.ErrNotFound):
			r.Drift = append(r.Drift, fmt.Sprintf("hold of %s on workspace %s, which has no record", FormatAmount(n), ws))
		case err != nil:
			return r, err
		case w.State == sandgate.WorkspaceTerminated:
			r.Drift = append(r.Drift, fmt.Sprintf("hold of %s on workspace %s, which is terminated but not settled", FormatAmount(n), ws))
		}
	}
	r.ExpectedBalance = r.ExpectedCredits - r.ExpectedDebits - r.ExpectedSettled
	cmp := func(name string, stored, want int64) {
		if stored != want {
			r.Drift = append(r.Drift, fmt.Sprintf("%s: stored %s, ledger says %s (drift %s)", name,
				FormatAmount(stored), FormatAmount(want), FormatAmount(stored-want)))
		}
	}
	cmp("credits", r.Stored.CreditsMicros, r.ExpectedCredits)
	cmp("debits", r.Stored.DebitsMicros, r.ExpectedDebits)
	cmp("settled", r.Stored.SettledMicros, r.ExpectedSettled)
	cmp("balance", r.Stored.BalanceMicros, r.ExpectedBalance)
	cmp("holds", r.Stored.HoldsMicros, r.ExpectedHolds)
	return r, nil
}

// SettleDangling repairs an account's open holds that lost their owner:
// a hold whose workspace is terminated (its settlement failed after the
// end was recorded) is settled; a hold whose workspace has no record (its
// create failed and the release of the hold did not run) is released
// uncharged. It returns how many holds it closed.
func (b *Billing) SettleDangling(ctx context.Context, acct string) (int, error) {
	ids, err := b.rdb.HKeys(ctx, holdsKey(acct)).Result()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		w, err := b.db.Workspace(ctx, acct, id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			// The hold's admission wrote the record in the same script, so
			// no record means it was aborted (or is past retention).
			err = b.releaseHold(ctx, acct, id)
		case err != nil:
		case w.State == sandgate.WorkspaceTerminated:
			err = b.Settle(ctx, w)
		default:
			continue
		}
		if err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// Run, every interval (0 means a minute) until ctx ends, accrues the
// interim usage of every account's running workspaces ([Billing.Accrue])
// and repairs its dangling holds. Every broker process may run it:
// accrual, settlement and release are idempotent by entry id.
func (b *Billing) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = time.Minute
	}
	tick.Every(ctx, interval, func() bool {
		b.repair(ctx)
		return true
	})
}

// repair is one round of Run over every account.
func (b *Billing) repair(ctx context.Context) {
	as, err := b.db.Accounts(ctx)
	if err != nil {
		b.log.Warn("billing repair: list accounts", slog.Any("err", err))
		return
	}
	for _, a := range as {
		if _, err := b.Accrue(ctx, a.ID, b.clock.Now().UTC()); err != nil {
			b.log.Warn("billing accrual", slog.String(sandgate.KeyAccountID, a.ID), slog.Any("err", err))
		}
		if n, err := b.SettleDangling(ctx, a.ID); err != nil {
			b.log.Warn("billing repair", slog.String(sandgate.KeyAccountID, a.ID), slog.Any("err", err))
		} else if n > 0 {
			b.log.Info("billing repair: closed dangling holds", slog.String(sandgate.KeyAccountID, a.ID), slog.Int("holds", n))
		}
	}
}

func isNil(err error) bool { return errors.Is(err, redis.Nil) }
