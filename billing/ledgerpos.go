package billing

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Positioned is a usage ledger entry with its stream id, the position a
// reader resumes from. Err is set, and Entry zero, when the message at
// StreamID does not decode: a reader that must not stop at it (the
// Stripe sync) sets it aside and moves on.
type Positioned struct {
	StreamID string
	Entry    UsageEntry
	Err      error
}

// ScanAfter returns up to n entries of acct's usage ledger after the
// stream id afterID ("" for the start), in ledger (stream) order. Unlike
// [Ledger.Scan], which filters by TerminatedAt (not in stream order: an
// interim entry is filed under its period's start but appended an hour
// later), it walks positions, so a reader keeping the last StreamID it is
// done with resumes without missing an entry.
func (l *Ledger) ScanAfter(ctx context.Context, acct, afterID string, n int) ([]Positioned, error) {
	start := "-"
	if afterID != "" {
		start = "(" + afterID
	}
	return l.xrange(ctx, acct, start, "+", n)
}

// At returns the entry of acct's usage ledger at the stream id streamID;
// ok is false when there is none (never appended, or trimmed).
func (l *Ledger) At(ctx context.Context, acct, streamID string) (p Positioned, ok bool, err error) {
	ps, err := l.xrange(ctx, acct, streamID, streamID, 1)
	if err != nil || len(ps) == 0 {
		return Positioned{}, false, err
	}
	return ps[0], true, nil
}

func (l *Ledger) xrange(ctx context.Context, acct, start, end string, n int) ([]Positioned, error) {
	msgs, err := l.rdb.XRangeN(ctx, usageKey(acct), start, end, int64(n)).Result()
	if err != nil {
		return nil, fmt.Errorf("usage ledger: %w", err)
	}
	out := make([]Positioned, len(msgs))
	for i, m := range msgs {
		out[i] = position(m)
	}
	return out, nil
}

// position decodes one ledger message; an entry without an id does not
// decode either.
func position(m redis.XMessage) Positioned {
	p := Positioned{StreamID: m.ID}
	if err := decodeEntry(m, &p.Entry); err != nil {
		return Positioned{StreamID: m.ID, Err: err}
	}
	if p.Entry.ID == "" {
		return Positioned{StreamID: m.ID, Err: fmt.Errorf("usage ledger entry %s: no id", m.ID)}
	}
	return p
}
