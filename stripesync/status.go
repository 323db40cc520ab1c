package stripesync

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// DeadLetter is a ledger entry the sync gave up on: Stripe refused it
// DeadAfter rounds in a row with a 4xx, or it cannot be a meter event (a
// negative value). The cursor has moved past it; [Syncer.Retry] sends it
// again.
type DeadLetter struct {
	EntryID    string    `json:"entry_id"`   // the usage ledger entry id
	StreamID   string    `json:"stream_id"`  // its usage ledger stream id
	Identifier string    `json:"identifier"` // the meter event identifier it is sent under
	Status     int       `json:"status"`     // Stripe's HTTP status; 0 when never sent
	Error      string    `json:"error"`      // the last error, redacted
	Attempts   int       `json:"attempts"`   // failed rounds
	At         time.Time `json:"at"`         // when it was dead-lettered
}

// Status is an account's sync state, for operators.
type Status struct {
	Account     Account // zero when not configured
	Enabled     bool    // the account has settings
	Cursor      string  // the usage ledger stream id the sync is past; "" none yet
	Pending     int     // entries after the cursor still to send (counted up to StatusScanLimit)
	PendingMore bool    // more than StatusScanLimit entries wait
	// OldestPending is the earliest terminated_at among the pending
	// entries counted; Lag is the time since then (0 when none).
	OldestPending time.Time
	Lag           time.Duration
	Sent          int64 // events sent, ever
	Failures      int64 // failed attempts, ever
	DeadLettered  int64 // entries dead-lettered, ever
	LastError     string
	LastErrorAt   time.Time
	LastSentAt    time.Time
	DeadLetters   []DeadLetter // the current dead letters, oldest first
	Requeued      []DeadLetter // dead letters requeued by Retry, not yet sent
}

// StatusScanLimit bounds how many pending entries Status reads.
const StatusScanLimit = 10000

// Status reports acct's sync: its settings, how far behind it is, its
// counters and last error, and its dead letters. An account never
// configured reads as a zero Status with Enabled false, not an error.
func (s *Syncer) Status(ctx context.Context, acct string) (Status, error) {
	var st Status
	a, err := s.Account(ctx, acct)
	switch {
	case err == nil:
		st.Account, st.Enabled = a, true
	case !errors.Is(err, ErrNotConfigured):
		return Status{}, err
	}
	cursor, err := s.rdb.Get(ctx, cursorKey(acct)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return Status{}, fmt.Errorf("stripesync: status: %w", err)
	}
	st.Cursor = cursor
	r := &round{s: s, acct: acct, a: a}
	for st.Pending < StatusScanLimit {
		recs, err := s.readAfter(ctx, acct, cursor, min(500, StatusScanLimit-st.Pending+1))
		if err != nil {
			return Status{}, err
		}
		for _, rec := range recs {
			cursor = rec.streamID
			if _, skip, _ := r.plan(rec); skip && st.Enabled {
				continue
			}
			if st.Pending == StatusScanLimit {
				st.PendingMore = true
				break
			}
			st.Pending++
			if st.OldestPending.IsZero() || rec.e.TerminatedAt.Before(st.OldestPending) {
				st.OldestPending = rec.e.TerminatedAt
			}
		}
		if len(recs) == 0 || st.PendingMore {
			break
		}
	}
	if !st.OldestPending.IsZero() {
		st.Lag = max(0, s.deps.Clock.Now().Sub(st.OldestPending))
	}
	h, err := s.rdb.HGetAll(ctx, stateKey(acct)).Result()
	if err != nil {
		return Status{}, fmt.Errorf("stripesync: status: %w", err)
	}
	num := func(k string) int64 { n, _ := strconv.ParseInt(h[k], 10, 64); return n }
	st.Sent, st.Failures, st.DeadLettered = num("sent"), num("failures"), num("dead_lettered")
	st.LastError, st.LastErrorAt, st.LastSentAt = h["last_error"], msTime(h["last_error_at"]), msTime(h["last_sent_at"])
	if st.DeadLetters, err = s.letters(ctx, deadKey(acct)); err != nil {
		return Status{}, err
	}
	if st.Requeued, err = s.letters(ctx, retryKey(acct)); err != nil {
		return Status{}, err
	}
	return st, nil
}

func (s *Syncer) letters(ctx context.Context, key string) ([]DeadLetter, error) {
	m, err := s.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("stripesync: dead letters: %w", err)
	}
	out := make([]DeadLetter, 0, len(m))
	for _, js := range m {
		var dl DeadLetter
		if err := json.Unmarshal([]byte(js), &dl); err != nil {
			return nil, fmt.Errorf("stripesync: dead letter: %w", err)
		}
		out = append(out, dl)
	}
	slices.SortFunc(out, func(a, b DeadLetter) int {
		return cmp.Or(a.At.Compare(b.At), cmp.Compare(a.StreamID, b.StreamID))
	})
	return out, nil
}

// Retry requeues acct's dead letters entryIDs (none: all of them); the
// next round sends them before the entries after the cursor. It returns
// how many it requeued; an id that is not a dead letter is ignored.
func (s *Syncer) Retry(ctx context.Context, acct string, entryIDs ...string) (int, error) {
	args := make([]any, len(entryIDs))
	for i, id := range entryIDs {
		args[i] = id
	}
	n, err := retryScript.Run(ctx, s.rdb, []string{deadKey(acct), retryKey(acct)}, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("stripesync: retry: %w", err)
	}
	return n, nil
}
