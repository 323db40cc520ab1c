package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
)

// failCreateScript ends a create whose outcome nobody confirmed (its
// gateway died between the provider call and Confirm): a still starting
// workspace becomes terminating with reason failed, its slot and open
// reservation are freed, and its Idempotency-Key, still in progress, is
// freed so a replay re-evaluates (docs/protocol-notes.md). A key that is
// done (Confirm ran meanwhile and refused) keeps naming the workspace.
// The sandbox the provider lists for it, if any (ARGV[3]), is stored with
// the terminating state, so a later pass asks the provider to end it when
// this one could not.
//
// KEYS[1] live ZSET, KEYS[2] workspace HASH, KEYS[3] account open ZSET, KEYS[4] idempotency STRING
// ARGV[1] workspace id, ARGV[2] now (unix ms), ARGV[3] provider ref or ""
// Returns 1 failed, 0 not starting.
var failCreateScript = redis.NewScript(`
if redis.call('HGET', KEYS[2], 'state') ~= 'starting' then return 0 end
redis.call('HSET', KEYS[2], 'state', 'terminating', 'reason', 'failed', 'terminating_ms', ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[2], 'provider_ref', ARGV[3]) end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
local v = redis.call('GET', KEYS[4])
if v then
  local ok, rec = pcall(cjson.decode, v)
  if ok and rec.st == 'in_progress' then redis.call('DEL', KEYS[4]) end
end
return 1
`)

// freePendingKeyScript frees an Idempotency-Key still in progress for
// the workspace ARGV[1] (see DB.FreePendingKey); a key that is done, or
// names another workspace, is left alone.
//
// KEYS[1] idempotency STRING
// ARGV[1] workspace id
// Returns 1 freed, 0 left.
var freePendingKeyScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local ok, rec = pcall(cjson.decode, v)
if ok and rec.st == 'in_progress' and rec.ws == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// freeSlotScript frees a slot or reservation whose workspace no longer
// needs one: its record is gone, terminating or terminated.
//
// KEYS[1] live or open ZSET, KEYS[2] workspace HASH
// ARGV[1] workspace id
// Returns 1 freed, 0 kept (starting or running).
var freeSlotScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[2], 'state')
if st == 'starting' or st == 'running' then return 0 end
return redis.call('ZREM', KEYS[1], ARGV[1])
`)

// markBusyLua is a Lua function over a workspace's record and its busy
// ZSET: member keeps the workspace busy until deadline (unix ms), and now
// counts as activity. Spliced into the scripts that start an exec.
const markBusyLua = `
local function mark_busy(ws, busy, member, now, deadline)
  redis.call('ZADD', busy, deadline, member)
  if redis.call('PTTL', busy) < 0 then redis.call('PEXPIREAT', busy, deadline + 86400000) end
  local top = redis.call('ZREVRANGE', busy, 0, 0, 'WITHSCORES')
  redis.call('HSET', ws, 'activity_ms', now, 'busy_ms', top[2])
end
`

// execBusyScript records an exec's start (ARGV[3] = "start") or end: an
// exec in flight keeps the workspace busy until its deadline, exactly as a
// durable command does, and both ends count as activity.
//
// KEYS[1] workspace HASH, KEYS[2] workspace busy ZSET
// ARGV[1] member, ARGV[2] now (unix ms), ARGV[3] start or end, ARGV[4] deadline (unix ms)
// Returns 1, or 0 when there is no record.
var execBusyScript = redis.NewScript(markBusyLua + `
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[3] == 'start' then
  mark_busy(KEYS[1], KEYS[2], ARGV[1], ARGV[2], tonumber(ARGV[4]))
  return 1
end
redis.call('ZREM', KEYS[2], ARGV[1])
local top = redis.call('ZREVRANGE', KEYS[2], 0, 0, 'WITHSCORES')
redis.call('HSET', KEYS[1], 'activity_ms', ARGV[2], 'busy_ms', top[2] or '0')
return 1
`)

// execStartScript is an exec's first round trip: it reads the fields of
// the workspace record an exec needs and, when the record can take the
// exec now (running, of the caller's instance, before expires_at), marks
// the exec busy as execBusyScript's start does (mark_busy), with the deadline
// the exec's timeout gets once clamped to expires_at, plus 30 s.
//
// KEYS[1] workspace HASH, KEYS[2] workspace busy ZSET
// ARGV[1] member, ARGV[2] now (unix ms), ARGV[3] timeout (ms, already
// clamped to the scope), ARGV[4] the caller's instance
// Returns {marked (1 or 0), id, instance, state, expires_ms, provider,
// provider_ref} as read, or {0} when there is no record.
var execStartScript = redis.NewScript(markBusyLua + `
local f = redis.call('HMGET', KEYS[1], 'id', 'instance', 'state', 'expires_ms', 'provider', 'provider_ref')
if not f[1] then return {0} end
local now, exp = tonumber(ARGV[2]), tonumber(f[4] or '0') or 0
if f[3] ~= 'running' or f[2] ~= ARGV[4] or now >= exp then
  table.insert(f, 1, 0)
  return f
end
mark_busy(KEYS[1], KEYS[2], ARGV[1], ARGV[2], math.min(now + tonumber(ARGV[3]), exp) + 30000)
table.insert(f, 1, 1)
return f
`)

// ExecBegin is an exec's workspace read and busy mark in one round trip:
// it returns workspace id of account acct and, when that record is
// running, belongs to instance inst and is before its expires_at at now,
// marks the exec named member busy (marked true) until its deadline, now
// plus timeout clamped to expires_at, plus 30 s, and touches its
// activity, as ExecStarted does. ErrNotFound when there is no record.
//
// The workspace holds only what an exec needs: ID, AccountID,
// InstanceID, State, ExpiresAt, Provider and ProviderRef (read the whole
// record with Workspace for anything else).
//
// queue, when not nil, may queue more commands (such as a rate check's
// borrow) to share the round trip. When it does, the whole record is read
// on their pipeline and nothing is marked: the caller checks their answers
// first and marks the exec with ExecStarted. When it returns an error (a
// refusal decided without Redis), ExecBegin sends nothing and returns it.
func (db *DB) ExecBegin(ctx context.Context, acct, inst, id, member string, timeout time.Duration, now time.Time, queue func(redis.Pipeliner) error) (w sandgate.Workspace, marked bool, err error) {
	if queue != nil {
		pipe := db.rdb.Pipeline()
		if err := queue(pipe); err != nil {
			return sandgate.Workspace{}, false, err
		}
		if pipe.Len() > 0 {
			w, err := db.workspaceOn(ctx, pipe, acct, id)
			return w, false, err
		}
	}
	res, err := execStartScript.Run(ctx, db.rdb, []string{workspaceKey(acct, id), busyKey(acct, id)},
		execBusyPrefix+member, ms(now), timeout.Milliseconds(), inst).Slice()
	if err != nil {
		return sandgate.Workspace{}, false, err
	}
	if len(res) != 7 {
		return sandgate.Workspace{}, false, ErrNotFound
	}
	f := func(i int) string { v, _ := res[i].(string); return v }
	exp, _ := strconv.ParseInt(f(4), 10, 64)
	w = sandgate.Workspace{ID: f(1), AccountID: acct, InstanceID: f(2), State: sandgate.WorkspaceState(f(3)),
		ExpiresAt: fromMS(exp), Provider: f(5), ProviderRef: f(6)}
	if w.ID == "" || w.State == "" {
		return sandgate.Workspace{}, false, fmt.Errorf("store: workspace record without id or state")
	}
	n, _ := res[0].(int64)
	return w, n == 1, nil
}

// FailCreate ends a starting workspace whose create was never confirmed,
// with reason failed (see failCreateScript), and stores w.ProviderRef, the
// sandbox found for it ("" for none). It returns false when the workspace
// is no longer starting.
func (db *DB) FailCreate(ctx context.Context, w sandgate.Workspace, now time.Time) (bool, error) {
	idem, err := db.acquireKeyOf(ctx, w.AccountID, w.InstanceID, w.ID)
	if err != nil {
		return false, err
	}
	if idem == "" {
		idem = workspaceKey(w.AccountID, w.ID) + ":nokey" // a record from before keys were recorded
	}
	keys := []string{liveKey(w.AccountID, w.InstanceID), workspaceKey(w.AccountID, w.ID), openKey(w.AccountID), idem}
	n, err := failCreateScript.Run(ctx, db.rdb, keys, w.ID, ms(now), w.ProviderRef).Int()
	if err != nil {
		return false, fmt.Errorf("fail create: %w", err)
	}
	return n == 1, nil
}

// StaleSlot is a slot or reservation freed by FreeStaleSlots.
type StaleSlot struct {
	Kind        string // "live" (an instance's concurrency slot) or "open" (the account's reservation)
	AccountID   string
	InstanceID  string // empty for "open"
	WorkspaceID string
}

// FreeStaleSlots frees the account's concurrency slots (every instance)
// and open-workspace reservations whose workspace is gone, terminating or
// terminated, and returns what it freed. Slots of starting and running
// workspaces are kept, whatever their deadline.
func (db *DB) FreeStaleSlots(ctx context.Context, acct string) ([]StaleSlot, error) {
	insts, err := db.rdb.SMembers(ctx, instancesKey(acct)).Result()
	if err != nil {
		return nil, err
	}
	type set struct{ key, kind, inst string }
	sets := []set{{openKey(acct), "open", ""}}
	for _, i := range insts {
		sets = append(sets, set{liveKey(acct, i), "live", i})
	}
	var out []StaleSlot
	for _, s := range sets {
		ids, err := db.rdb.ZRange(ctx, s.key, 0, -1).Result()
		if err != nil {
			return out, err
		}
		for _, id := range ids {
			n, err := freeSlotScript.Run(ctx, db.rdb, []string{s.key, workspaceKey(acct, id)}, id).Int()
			if err != nil {
				return out, fmt.Errorf("free slot: %w", err)
			}
			if n == 1 {
				out = append(out, StaleSlot{Kind: s.kind, AccountID: acct, InstanceID: s.inst, WorkspaceID: id})
			}
		}
	}
	return out, nil
}

// SlotCounts returns how many members an instance's live ZSET and the
// account's open ZSET hold, whatever their deadline (for tests and checks).
func (db *DB) SlotCounts(ctx context.Context, acct, inst string) (live, open int64, err error) {
	if live, err = db.rdb.ZCard(ctx, liveKey(acct, inst)).Result(); err != nil {
		return 0, 0, err
	}
	open, err = db.rdb.ZCard(ctx, openKey(acct)).Result()
	return live, open, err
}

// execBusyPrefix starts the busy set's members that are execs; the others
// are durable commands' keys (hex, so never with a colon).
const execBusyPrefix = "exec:"

// ExecStarted marks the workspace busy until deadline while the exec
// named member runs, and touches its activity.
func (db *DB) ExecStarted(ctx context.Context, w sandgate.Workspace, member string, deadline, now time.Time) error {
	return execBusyScript.Run(ctx, db.rdb, []string{workspaceKey(w.AccountID, w.ID), busyKey(w.AccountID, w.ID)},
		execBusyPrefix+member, ms(now), "start", ms(deadline)).Err()
}

// ExecEnded ends ExecStarted's mark and touches the workspace's activity.
func (db *DB) ExecEnded(ctx context.Context, w sandgate.Workspace, member string, now time.Time) error {
	return execBusyScript.Run(ctx, db.rdb, []string{workspaceKey(w.AccountID, w.ID), busyKey(w.AccountID, w.ID)},
		execBusyPrefix+member, ms(now), "end", 0).Err()
}

// InstanceAccount returns the account of an instance id, "" when unknown.
func (db *DB) InstanceAccount(ctx context.Context, inst string) (string, error) {
	a, err := db.rdb.Get(ctx, instanceIndexKey(inst)).Result()
	if isNil(err) {
		return "", nil
	}
	return a, err
}

// MarkRevoked records that the instance's workspaces created before at are
// to end with reason lease_revoked; the reaper keeps ending them.
func (db *DB) MarkRevoked(ctx context.Context, acct, inst string, at time.Time) error {
	return db.rdb.HSet(ctx, revokedKey(acct), inst, ms(at)).Err()
}

// Revoked returns the account's instances marked by MarkRevoked, with the
// revocation's time.
func (db *DB) Revoked(ctx context.Context, acct string) (map[string]time.Time, error) {
	m, err := db.rdb.HGetAll(ctx, revokedKey(acct)).Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string]time.Time, len(m))
	for inst, v := range m {
		var n int64
		fmt.Sscan(v, &n)
		out[inst] = fromMS(n)
	}
	return out, nil
}
