package billing

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/store"
)

// AccrualPeriod is the fixed interval usage accrues at: periods are cut at
// every whole UTC hour, so a workspace spanning midnight UTC or a month
// boundary is split there too. A period's entry has the deterministic id
// "<workspace_id>:<period start, unix seconds>" (the hour, not the
// workspace's start, for the first one); the last period of a workspace
// is its final entry "<workspace_id>:final".
const AccrualPeriod = time.Hour

// AccrualGrace is how far behind now accrual stays: a period is accrued
// only once it ended at least this long ago, so a workspace whose end is
// being recorded by another broker (whose clock may be a little behind) is
// never charged for a period past its recorded end.
const AccrualGrace = time.Minute

// period is one ledger entry's slice of a workspace's metered time.
type period struct {
	id       string
	from, to time.Time
	secs     int64
	final    bool
}

// periods cuts a workspace's metered time, from start to end, at every
// whole UTC hour; the last period is final. Seconds add up exactly: a
// period's seconds are the cumulative metered seconds (rounded up, see
// [MeteredSeconds]) at its end minus those at its start, so the sum over
// all periods is MeteredSeconds(start, end). With limit non-zero it
// returns only the complete periods that end before limit, none final.
func periods(ws string, start, end, limit time.Time) []period {
	if start.IsZero() || !end.After(start) {
		if !limit.IsZero() {
			return nil
		}
		return []period{{id: FinalID(ws), from: start, to: end, final: true}}
	}
	var out []period
	for h := start.Truncate(AccrualPeriod); ; h = h.Add(AccrualPeriod) {
		from, next := h, h.Add(AccrualPeriod)
		if from.Before(start) {
			from = start
		}
		if !limit.IsZero() && !next.Before(limit) {
			return out
		}
		if !next.Before(end) {
			return append(out, period{id: FinalID(ws), from: from, to: end, final: true,
				secs: MeteredSeconds(start, end) - MeteredSeconds(start, from)})
		}
		out = append(out, period{id: PeriodID(ws, h), from: from, to: next,
			secs: MeteredSeconds(start, next) - MeteredSeconds(start, from)})
	}
}

// PeriodID is the ledger entry id of a workspace's interim (provisional)
// usage for the accrual period starting at h (a whole UTC hour).
func PeriodID(workspaceID string, h time.Time) string {
	return workspaceID + ":" + strconv.FormatInt(h.Unix(), 10)
}

// entries are w's ledger entries for ps. An interim entry's started_at and
// ended_at are its period's bounds and its terminated_at (what exports,
// statements and budget months file it under) is its period's start; the
// final entry's terminated_at is the workspace's.
func (b *Billing) entries(w sandgate.Workspace, ps []period) ([]UsageEntry, error) {
	cur := w.Price.Currency
	if cur == "" {
		cur = NoCurrency
	}
	out := make([]UsageEntry, 0, len(ps))
	for _, p := range ps {
		amt, err := Amount(w.Price.UnitMicros, p.secs)
		if err != nil {
			return nil, err
		}
		e := UsageEntry{
			ID: p.id, Kind: KindUsage, Final: p.final,
			AccountID: w.AccountID, InstanceID: w.InstanceID, WorkspaceID: w.ID,
			Agent: w.Agent, RunID: w.RunID, Size: w.Size, Image: w.Image, Provider: cmp.Or(w.Provider, b.cfg.Provider),
			RateCard: w.Price.RateCard, RateCardVersion: w.Price.RateCardVersion, Currency: cur,
			UnitPriceMicros: w.Price.UnitMicros, Seconds: p.secs, AmountMicros: amt,
			StartedAt: p.from, EndedAt: p.to, TerminatedAt: p.from,
		}
		if p.final {
			e.TerminatedAt, e.TerminationReason = w.TerminatedAt, string(w.TerminationReason)
			e.EgressBytesOut, e.EgressBytesIn = w.EgressBytesOut, w.EgressBytesIn
		}
		out = append(out, e.normalized())
	}
	return out, nil
}

// Accrue writes the interim usage entries of every running workspace of
// acct for each complete accrual period (ended before now − AccrualGrace,
// and never past expires_at) not yet in the ledger, charging each against
// the workspace's hold as settlement would. It is idempotent by entry id,
// so any number of brokers may run it; a workspace no longer running is
// left to settlement. It returns how many entries it wrote.
func (b *Billing) Accrue(ctx context.Context, acct string, now time.Time) (int, error) {
	ws, err := b.unsettled(ctx, acct, now)
	if err != nil {
		return 0, fmt.Errorf("accrue %s: %w", acct, err)
	}
	n := 0
	for _, w := range ws {
		if w.State != sandgate.WorkspaceRunning || w.StartedAt.IsZero() {
			continue
		}
		limit := now.Add(-AccrualGrace)
		if !w.ExpiresAt.IsZero() && w.ExpiresAt.Before(limit) {
			limit = w.ExpiresAt
		}
		ps := periods(w.ID, w.StartedAt, limit, limit)
		if len(ps) == 0 {
			continue
		}
		es, err := b.entries(w, ps)
		if err != nil {
			return n, fmt.Errorf("accrue %s: %w", w.ID, err)
		}
		k, err := b.charge(ctx, w, es, false)
		if err != nil {
			return n, fmt.Errorf("accrue %s: %w", w.ID, err)
		}
		n += k
	}
	return n, nil
}

// unsettled returns the account's workspaces that may still have usage
// to write: the live ones, and every one with a hold (every priced
// workspace has one until it is settled: its id finds it even if no
// instance index lists it).
func (b *Billing) unsettled(ctx context.Context, acct string, now time.Time) ([]sandgate.Workspace, error) {
	ws, err := b.db.LiveWorkspaces(ctx, acct, "", now)
	if err != nil {
		return nil, err
	}
	held, err := b.rdb.HKeys(ctx, holdsKey(acct)).Result()
	if err != nil {
		return nil, err
	}
	seen := make(map[string]bool, len(ws))
	for _, w := range ws {
		seen[w.ID] = true
	}
	for _, id := range held {
		if seen[id] {
			continue
		}
		w, err := b.db.Workspace(ctx, acct, id)
		if errors.Is(err, store.ErrNotFound) {
			continue // a dangling hold: Run's repair releases it
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", id, err)
		}
		ws = append(ws, w)
	}
	return ws, nil
}

// UsageFiledBefore reports whether every usage entry the account files
// before t is in the ledger at now: each running workspace's accrual
// periods that end by t are written, and no workspace that ended before
// t still waits for its settlement. A statement is complete only then
// ([BuildStatement]).
func (b *Billing) UsageFiledBefore(ctx context.Context, acct string, t, now time.Time) (bool, error) {
	ws, err := b.unsettled(ctx, acct, now)
	if err != nil {
		return false, fmt.Errorf("usage filed %s: %w", acct, err)
	}
	for _, w := range ws {
		if w.StartedAt.IsZero() || !w.StartedAt.Before(t) {
			continue
		}
		switch {
		case w.State == sandgate.WorkspaceRunning:
			if !w.ExpiresAt.IsZero() && !w.ExpiresAt.After(t) {
				return false, nil // its end is due before t and not recorded yet
			}
		case !w.TerminatedAt.IsZero() && w.TerminatedAt.Before(t):
			return false, nil // its final entry, filed before t, is not in yet
		}
		// The interim periods that end by t (the end is only a bound
		// past them: none of them is the final one): accrued while it ran,
		// or, once it stopped running, filed only by its settlement.
		ps := periods(w.ID, w.StartedAt, t.Add(AccrualPeriod), t.Add(time.Nanosecond))
		if len(ps) == 0 {
			continue
		}
		in, err := b.rdb.SIsMember(ctx, usageIDsKey(acct), ps[len(ps)-1].id).Result()
		if err != nil {
			return false, fmt.Errorf("usage filed %s: %w", acct, err)
		}
		if !in {
			return false, nil
		}
	}
	return true, nil
}

// charge runs chargeScript for w's entries es: accruing (settle false)
// only while w's record says running; settling, it also frees what is left
// of the hold, once (the last entry of es is the final one).
func (b *Billing) charge(ctx context.Context, w sandgate.Workspace, es []UsageEntry, settle bool) (int, error) {
	a := w.AccountID
	mode := "accrue"
	if settle {
		mode = "settle"
	}
	fk, _ := b.db.FinishArgs(w, time.Time{}, store.Egress{})
	keys, args, err := chargeBinding(w, fk[0], es, mode)
	if err != nil {
		return 0, err
	}
	res, err := chargeScript.Run(ctx, b.rdb, keys, args...).Int64Slice()
	if err != nil {
		return 0, err
	}
	if len(res) != 2 {
		return 0, fmt.Errorf("charge: unexpected script result %v", res)
	}
	n := int(res[0])
	if res[1] == 1 {
		b.FlushAlerts(ctx, a)
	}
	if n > 0 {
		b.countSettled(ctx, es, n)
	}
	return n, nil
}

// chargeBinding returns the KEYS and ARGV of chargeScript for w's
// entries es in mode, wsKey being w's record; extra arguments (the
// finish's) go between the mode's and the scopes.
func chargeBinding(w sandgate.Workspace, wsKey string, es []UsageEntry, mode string, extra ...any) ([]string, []any, error) {
	a := w.AccountID
	keys := make([]string, 0, 9+2*len(es)) // and the caller's one more
	keys = append(keys, fundsKey(a), holdsKey(a), usageKey(a), usageIDsKey(a),
		spendKey(a, month(w.CreatedAt)), budgetsKey(a), alertsKey(a), wsKey)
	sc := scopes(w.InstanceID, w.Agent)
	args := make([]any, 0, 3+len(extra)+len(sc)+5*len(es))
	args = append(args, w.ID, mode, len(sc))
	args = append(args, extra...)
	args = append(args, anys(sc)...)
	for _, e := range es {
		body, err := json.Marshal(e)
		if err != nil {
			return nil, nil, err
		}
		m := month(e.TerminatedAt)
		keys = append(keys, spendKey(a, m), alertedKey(a, m))
		args = append(args, e.ID, string(body), e.TerminatedAt.UnixMilli(), e.AmountMicros, m)
	}
	return keys, args, nil
}

// countSettled adds what the last n entries of es charged to
// MetricSettled: the script appends in order and skips only entries
// already in the ledger, which precede the new ones.
func (b *Billing) countSettled(ctx context.Context, es []UsageEntry, n int) {
	if b.settled == nil || n > len(es) {
		return
	}
	byCurrency := map[string]int64{}
	for _, e := range es[len(es)-n:] {
		byCurrency[e.Currency] += e.AmountMicros
	}
	for cur, amt := range byCurrency {
		if amt > 0 {
			b.settled.Add(ctx, amt, metric.WithAttributeSet(attribute.NewSet(attribute.String("currency", cur))))
		}
	}
}

// chargeScript appends a workspace's usage entries and charges each one
// not yet in the ledger: settled += amount, balance −= amount, the
// workspace's hold (and funds.holds, and the held budget counters of the
// hold's month) −= amount (at most what is left), the settled budget
// counters of the entry's month += amount, with threshold alerts. In
// "accrue" mode it does nothing unless the workspace's record is running;
// in "settle" mode it does nothing once the final entry (the last one) is
// in, and frees what is left of the hold.
//
// KEYS[1] funds HASH, KEYS[2] holds HASH, KEYS[3] usage STREAM, KEYS[4]
// usage ids SET, KEYS[5] spend HASH of the hold's month, KEYS[6] budgets
// HASH, KEYS[7] alerts LIST, KEYS[8] workspace HASH, then per entry i
// (from 0) KEYS[9+2i] spend HASH and KEYS[10+2i] alerted SET of its month
// ARGV[1] workspace id, ARGV[2] "accrue" or "settle", ARGV[3] number of
// budget scopes ns, ARGV[4..3+ns] the scopes, then per entry five: id,
// JSON, terminated_at (unix ms), amount (micros), month (YYYYMM)
// Returns {appended, queued}: how many entries it appended, and 1 when the
// account's alert queue holds alerts (the caller flushes them only then):
// queued by this run, by an earlier run of it whose answer was lost (sent
// again, it appends nothing), or left by a flush that failed.
var chargeScript = redis.NewScript(appendLua + budgetLua + "local off = 0\nlocal function charge()\n" + chargeLua + "end\nreturn charge()\n")

// chargeLua is the body of the function charge() of chargeScript and
// finishSettleScript, which returns {appended, queued}. It expects the
// local off: how many arguments sit between ARGV[3] and the scopes (0, or
// 6 for finish_workspace's).
const chargeLua = `
local function alerts_waiting()
  if redis.call('LLEN', KEYS[7]) > 0 then return 1 end
  return 0
end
local ws, mode, ns = ARGV[1], ARGV[2], tonumber(ARGV[3])
local s0, s1 = 4 + off, 3 + off + ns
local base = 4 + off + ns
local ne = (#ARGV - base + 1) / 5
if mode == 'accrue' then
  if redis.call('HGET', KEYS[8], 'state') ~= 'running' then return {0, alerts_waiting()} end
elseif ne > 0 and redis.call('SADD', KEYS[4], ARGV[base + (ne - 1) * 5]) == 0 then
  -- The final entry's id is claimed here, once: already there, the
  -- workspace is settled; claimed, the loop appends it without asking.
  return {0, alerts_waiting()}
end
local n, queued = 0, 0
-- What the loop learns, so that no command asks it twice: whether the
-- account has budgets (none: no scope can alert), and the hold left.
local budgets, hknown, hleft = nil, false, nil
for i = 0, ne - 1 do
  local a = base + i * 5
  local eid, amt = ARGV[a], tonumber(ARGV[a + 3])
  -- In settle mode the last entry was claimed above.
  if (mode ~= 'accrue' and i == ne - 1) or redis.call('SISMEMBER', KEYS[4], eid) == 0 then
    local hold = hleft
    if not hknown then hold = tonumber(redis.call('HGET', KEYS[2], ws)) end
    hknown, hleft = true, hold
    if hold then
      local take = math.min(amt, hold)
      if take > 0 then
        local neg = string.format('%d', -take)
        if hold - take > 0 then
          redis.call('HSET', KEYS[2], ws, string.format('%d', hold - take))
          hleft = hold - take
        else
          redis.call('HDEL', KEYS[2], ws)
          hleft = nil
        end
        redis.call('HINCRBY', KEYS[1], 'holds', neg)
        for s = s0, s1 do redis.call('HINCRBY', KEYS[5], ARGV[s] .. ':h', neg) end
      end
    end
    local spend, alerted = KEYS[9 + 2 * i], KEYS[10 + 2 * i]
    -- A zero amount (an unpriced workspace) adds nothing: its counters
    -- are left as they are (a missing one reads as 0), and only the
    -- alerts, which may be due from earlier spending, are checked.
    if amt ~= 0 then
      redis.call('HINCRBY', KEYS[1], 'settled', ARGV[a + 3])
      redis.call('HINCRBY', KEYS[1], 'balance', string.format('%d', -amt))
    end
    if budgets == nil then budgets = redis.call('EXISTS', KEYS[6]) == 1 end
    for s = s0, s1 do
      if amt ~= 0 then redis.call('HINCRBY', spend, ARGV[s] .. ':s', ARGV[a + 3]) end
      if budgets and budget_alerts(KEYS[6], spend, alerted, KEYS[7], ARGV[s], ARGV[a + 4], ARGV[a + 2]) then queued = 1 end
    end
    if amt ~= 0 then redis.call('PEXPIRE', spend, ` + spendTTL + `) end
    append_usage(KEYS[3], KEYS[4], eid, ARGV[a + 1], ARGV[a + 2], mode ~= 'accrue' and i == ne - 1)
    n = n + 1
  end
end
if mode == 'settle' then
  local hold = hleft
  if not hknown then hold = tonumber(redis.call('HGET', KEYS[2], ws)) end
  if hold then
    local neg = string.format('%d', -hold)
    redis.call('HDEL', KEYS[2], ws)
    redis.call('HINCRBY', KEYS[1], 'holds', neg)
    for s = s0, s1 do redis.call('HINCRBY', KEYS[5], ARGV[s] .. ':h', neg) end
  end
end
if queued == 0 then queued = alerts_waiting() end
return {n, queued}
`
