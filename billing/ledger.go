package billing

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Entry kinds of the usage ledger.
const (
	KindUsage      = "usage"      // a workspace's metered use
	KindAdjustment = "adjustment" // an operator's correction of an earlier entry
)

// UsageEntry is one entry of an account's usage ledger: the stream
// sg:{A}:usage, one field "e" holding this JSON. The JSON names are a
// contract with usage exports; never rename one.
//
// A workspace's usage is cut into accrual periods at every whole UTC hour
// (see [AccrualPeriod]). While it runs, each complete period gets an
// interim entry "<workspace_id>:<period start, unix s>" (Final false:
// provisional, the workspace has not ended); when its end is confirmed
// (whatever ended it), settlement writes the periods not yet accrued, the
// last one "<workspace_id>:final" (Final true). Each id is written exactly
// once; nothing is ever edited: a correction is a new adjustment entry
// whose Corrects names the entry it corrects. The Seconds of a
// workspace's usage entries add up to its metered_seconds. Amounts are
// int64 micro-units of Currency; AmountMicros = UnitPriceMicros × Seconds,
// exact (see [Amount]). Times are UTC with millisecond precision.
type UsageEntry struct {
	ID                string    `json:"id"`    // "<workspace_id>:final", "<workspace_id>:<unix s>" (interim), or "adj:<hash>" for an adjustment
	Kind              string    `json:"kind"`  // KindUsage or KindAdjustment
	Final             bool      `json:"final"` // true: the workspace had ended; false: an interim (provisional) entry of a workspace still running
	AccountID         string    `json:"account_id"`
	InstanceID        string    `json:"instance_id"`
	WorkspaceID       string    `json:"workspace_id"`
	Agent             string    `json:"agent"`
	RunID             string    `json:"run_id"`
	Size              string    `json:"size"`
	Image             string    `json:"image"`
	Provider          string    `json:"provider"`
	RateCard          string    `json:"rate_card"`         // "" when the workspace was admitted without one (price 0)
	RateCardVersion   int       `json:"rate_card_version"` // 0 without a rate card
	Currency          string    `json:"currency"`          // ISO 4217
	UnitPriceMicros   int64     `json:"unit_price_micros"` // per second, the price the workspace was admitted at
	Seconds           int64     `json:"seconds"`           // this entry's share of metered_seconds
	AmountMicros      int64     `json:"amount_micros"`     // charged; negative for an adjustment that refunds
	StartedAt         time.Time `json:"started_at"`        // the period's start: the provider's confirmed start, or a whole UTC hour (zero if it never started)
	EndedAt           time.Time `json:"ended_at"`          // the period's end: a whole UTC hour, or the provider's confirmed end
	TerminatedAt      time.Time `json:"terminated_at"`     // what exports, statements and budget months file it under: the termination for a final entry, the period's start for an interim one
	TerminationReason string    `json:"termination_reason"`
	Corrects          string    `json:"corrects"` // for an adjustment, the id of the entry it corrects
	// EgressBytesOut and EgressBytesIn are the bytes the workspace moved
	// through the broker's egress proxy (out: to destinations), on its
	// final entry; 0 on interim entries and adjustments, and for traffic
	// the proxy never saw (a vendor's own egress).
	EgressBytesOut int64 `json:"egress_bytes_out"`
	EgressBytesIn  int64 `json:"egress_bytes_in"`
	// Reason and Actor are, on an adjustment, why the operator made it
	// and who did (the audit log's actor, name:prefix); "" on usage
	// entries.
	Reason string `json:"reason,omitempty"`
	Actor  string `json:"actor,omitempty"`
}

// FinalID is the ledger entry id of a workspace's final usage.
func FinalID(workspaceID string) string { return workspaceID + ":final" }

// Ledger reads and appends an account's usage ledger.
type Ledger struct {
	rdb redis.UniversalClient
}

// NewLedger returns a Ledger over rdb.
func NewLedger(rdb redis.UniversalClient) *Ledger { return &Ledger{rdb: rdb} }

// scanPage is how many entries one XRANGE reads.
const scanPage = 500

// Scan calls fn, in ledger order, for every entry of acct whose
// TerminatedAt is in [from, to); a zero from or to leaves that side open.
// It pages the stream 500 entries at a time. A reader reads and decodes
// the next pages while fn is called for the entries of this one, so memory
// is constant (scanPages pages, whose buffers are reused) and Redis's
// latency and the decoding overlap the work of fn. An entry's stream id is
// never earlier than its TerminatedAt (see appendScript), so the walk
// starts at from. fn's error stops the walk and is returned.
func (l *Ledger) Scan(ctx context.Context, acct string, from, to time.Time, fn func(UsageEntry) error) error {
	start := "-"
	if !from.IsZero() {
		start = strconv.FormatInt(from.UnixMilli(), 10)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the reader when fn fails
	type page struct {
		entries []UsageEntry
		err     error
	}
	pages := make(chan page, 1)
	// free holds the pages fn is done with; the reader fills them again.
	free := make(chan []UsageEntry, scanPages)
	for range scanPages {
		free <- make([]UsageEntry, 0, scanPage)
	}
	go func() {
		defer close(pages)
		for {
			var buf []UsageEntry
			select {
			case buf = <-free:
			case <-ctx.Done():
				return
			}
			msgs, err := l.rdb.XRangeN(ctx, usageKey(acct), start, "+", scanPage).Result()
			if err != nil {
				err = fmt.Errorf("usage ledger: %w", err)
			}
			buf = buf[:0]
			for _, m := range msgs {
				if err != nil {
					break
				}
				var e UsageEntry
				if err = decodeEntry(m, &e); err != nil {
					break
				}
				if !from.IsZero() && e.TerminatedAt.Before(from) || !to.IsZero() && !e.TerminatedAt.Before(to) {
					continue
				}
				buf = append(buf, e)
			}
			select {
			case pages <- page{buf, err}:
			case <-ctx.Done():
				return
			}
			if err != nil || len(msgs) < scanPage {
				return
			}
			start = "(" + msgs[len(msgs)-1].ID
		}
	}()
	for p := range pages {
		for i := range p.entries {
			if err := fn(p.entries[i]); err != nil {
				return err
			}
		}
		if p.err != nil {
			// The entries before a bad one are called, as before the
			// decoding moved to the reader.
			return p.err
		}
		clear(p.entries) // drop the page's strings before it waits in free
		free <- p.entries
	}
	return ctx.Err()
}

// scanPages is how many pages a Scan holds at most: one fn works on, one
// waiting for it, one the reader fills.
const scanPages = 3

func decodeEntry(m redis.XMessage, e *UsageEntry) error {
	s, _ := m.Values["e"].(string)
	if err := decodeEntryJSON(s, e); err != nil {
		return fmt.Errorf("usage ledger entry %s: %w", m.ID, err)
	}
	return nil
}

// Append writes e to its account's ledger unless an entry with its ID is
// already there. It reports whether it wrote. It moves no money: settlement
// appends in the same script that settles (see [Funds.Settle]); Append is
// for tests and tools.
func (l *Ledger) Append(ctx context.Context, e UsageEntry) (bool, error) {
	e = e.normalized()
	b, err := json.Marshal(e)
	if err != nil {
		return false, err
	}
	n, err := appendScript.Run(ctx, l.rdb, []string{usageKey(e.AccountID), usageIDsKey(e.AccountID)},
		e.ID, string(b), e.TerminatedAt.UnixMilli()).Int()
	if err != nil {
		return false, fmt.Errorf("usage ledger append: %w", err)
	}
	return n == 1, nil
}

func (e UsageEntry) normalized() UsageEntry {
	utc := func(t time.Time) time.Time {
		if t.IsZero() {
			return time.Time{}
		}
		return t.UTC().Truncate(time.Millisecond)
	}
	e.StartedAt, e.EndedAt, e.TerminatedAt = utc(e.StartedAt), utc(e.EndedAt), utc(e.TerminatedAt)
	return e
}

// appendLua appends one ledger entry, idempotent by entry id. Its stream
// id's time is the entry's terminated_at, or the newest entry's when that
// is later, so ids stay ordered and no entry's id is earlier than its
// terminated_at. It is shared by appendScript and the settle script.
//
// Uses: ukey usage STREAM, idskey ids SET, eid entry id, ej entry JSON,
// tms terminated_at (unix ms), claimed true when the caller already added
// eid to idskey (it found it absent). Evaluates to 1 appended, 0 already
// there.
const appendLua = `
local function append_usage(ukey, idskey, eid, ej, tms, claimed)
  if not claimed and redis.call('SADD', idskey, eid) == 0 then return 0 end
  local t = tonumber(tms)
  -- Entries mostly come in time order: try the entry's own time first,
  -- and read the newest id only when the stream is already past it.
  local r = redis.pcall('XADD', ukey, tostring(t) .. '-*', 'e', ej)
  if type(r) == 'table' and r.err then
    local last = redis.call('XREVRANGE', ukey, '+', '-', 'COUNT', 1)
    local lms = last[1] and tonumber(string.match(last[1][1], '^(%d+)-'))
    if not lms or lms < t then
      -- Not the stream's order that refused it: raise what pcall met.
      redis.call('XADD', ukey, tostring(t) .. '-*', 'e', ej)
      return 1
    end
    redis.call('XADD', ukey, tostring(lms) .. '-*', 'e', ej)
  end
  return 1
end
`

// appendScript appends one usage ledger entry unless its id is there.
//
// KEYS[1] usage STREAM, KEYS[2] usage ids SET
// ARGV[1] entry id, ARGV[2] entry JSON, ARGV[3] terminated_at (unix ms)
// Returns 1 appended, 0 already there.
var appendScript = redis.NewScript(appendLua + `
return append_usage(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
`)

var zeroTime time.Time
