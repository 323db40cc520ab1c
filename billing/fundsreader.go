package billing

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Billing implements [FundsReader] for monthly statements from its
// journals: the funds ledger (credits and debits, by their time) and the
// usage ledger (charges, by terminated_at, when they settle).

// BalanceAt implements FundsReader: credits − debits posted before t minus
// usage terminated before t.
func (b *Billing) BalanceAt(ctx context.Context, acct string, t time.Time) (int64, string, error) {
	s, err := b.Settings(ctx, acct)
	if err != nil {
		return 0, "", err
	}
	var bal int64
	err = b.fundsEntries(ctx, acct, func(_ string, e FundsEntry) error {
		if e.At.Before(t) {
			bal += signed(e)
		}
		return nil
	})
	if err != nil {
		return 0, "", err
	}
	err = b.ledger.Scan(ctx, acct, zeroTime, t, func(u UsageEntry) error {
		bal -= u.AmountMicros
		return nil
	})
	return bal, s.Currency, err
}

// Credits implements FundsReader: credits and debits (negative) posted in
// [from, to), oldest first; ID is the funds ledger entry id, Note the
// operator's reason.
func (b *Billing) Credits(ctx context.Context, acct string, from, to time.Time) ([]Credit, error) {
	var out []Credit
	err := b.fundsEntries(ctx, acct, func(id string, e FundsEntry) error {
		if !e.At.Before(from) && e.At.Before(to) {
			out = append(out, Credit{ID: id, Kind: e.Kind, At: e.At, AmountMicros: signed(e), Note: e.Reason})
		}
		return nil
	})
	return out, err
}

// HoldsAt implements FundsReader with the holds open now of workspaces
// created before t. Holds of workspaces settled since are not journaled:
// for a past instant it under-reports them.
func (b *Billing) HoldsAt(ctx context.Context, acct string, t time.Time) ([]Hold, error) {
	m, err := b.rdb.HGetAll(ctx, holdsKey(acct)).Result()
	if err != nil {
		return nil, err
	}
	var out []Hold
	for id, v := range m {
		n, _ := strconv.ParseInt(v, 10, 64)
		w, err := b.db.Workspace(ctx, acct, id)
		if err != nil || !w.CreatedAt.Before(t) {
			continue
		}
		out = append(out, Hold{WorkspaceID: id, InstanceID: w.InstanceID, Size: w.Size, Since: w.CreatedAt, AmountMicros: n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Since.Before(out[j].Since) })
	return out, nil
}

func signed(e FundsEntry) int64 {
	if e.Kind == KindDebit {
		return -e.AmountMicros
	}
	return e.AmountMicros
}

// fundsEntries pages the funds ledger in order.
func (b *Billing) fundsEntries(ctx context.Context, acct string, fn func(id string, e FundsEntry) error) error {
	for start := "-"; ; {
		msgs, err := b.rdb.XRangeN(ctx, fundsLedgerKey(acct), start, "+", scanPage).Result()
		if err != nil && err != redis.Nil {
			return err
		}
		for _, m := range msgs {
			var e FundsEntry
			s, _ := m.Values["e"].(string)
			if err := json.Unmarshal([]byte(s), &e); err != nil {
				return fmt.Errorf("funds ledger entry %s: %w", m.ID, err)
			}
			if err := fn(m.ID, e); err != nil {
				return err
			}
		}
		if len(msgs) < scanPage {
			return nil
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
}

// Interface guard.
var _ FundsReader = (*Billing)(nil)
