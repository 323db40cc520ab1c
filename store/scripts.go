package store

import "github.com/redis/go-redis/v9"

// confirmScript records a create the provider confirmed: the workspace
// becomes running and its slot's deadline becomes expires_at. It refuses
// when the workspace is no longer starting (released meanwhile) or its
// pending slot was pruned; the caller then terminates the sandbox. Either
// way the Idempotency-Key's record is marked done: the key names this
// workspace from now on, so a replay answers it (terminated, if refused)
// instead of idempotency_in_progress until the key's TTL. A key that names
// another workspace is left alone: this create's key was freed (the
// reaper failed it) and a retry claimed it for a workspace of its own.
//
// A record still starting in its slot needs no read of the key: only an
// end of the record (FailCreate, FreePendingKey, FreeKeyOf, Abort) frees
// a key its admission claimed, so the key still names this workspace. The
// key is read and decoded only on the way to a refusal or a resend.
//
// KEYS[1] live ZSET, KEYS[2] workspace HASH, KEYS[3] idempotency STRING, KEYS[4] account open ZSET
// ARGV[1] workspace id, ARGV[2] expires_at (unix ms), ARGV[3] provider ref,
// ARGV[4] started (unix ms), ARGV[5] idempotency record (JSON), ARGV[6] idempotency TTL (ms)
// Returns {1} confirmed (the record is the caller's with these changes;
// also when it is running with this provider ref and start already: this
// confirm, run before and its reply lost, then resent) or {0, record}
// refused, record the workspace HASH as HGETALL answers it
// (empty when there is none), so the Acquire's answer costs no further
// round trip.
var confirmScript = redis.NewScript(`
local cur = redis.call('HMGET', KEYS[2], 'state', 'provider_ref', 'started_ms')
-- The slot's new deadline, only if the slot is still there (XX): CH
-- answers 0 when it is absent, and also when the deadline was already
-- expires_at, which only ZSCORE tells apart.
if cur[1] == 'starting' and (redis.call('ZADD', KEYS[1], 'XX', 'CH', ARGV[2], ARGV[1]) == 1 or redis.call('ZSCORE', KEYS[1], ARGV[1])) then
  redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[6])
  redis.call('HSET', KEYS[2], 'state', 'running', 'provider_ref', ARGV[3], 'started_ms', ARGV[4], 'activity_ms', ARGV[4])
  redis.call('ZADD', KEYS[4], ARGV[2], ARGV[1])
  return {1}
end
local idem = redis.call('GET', KEYS[3])
if not idem or cjson.decode(idem).ws == ARGV[1] then
  redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[6])
end
if cur[1] == 'running' and cur[2] == ARGV[3] and cur[3] == ARGV[4] then
  return {1} -- this confirm, run before (a resent command)
end
return {0, redis.call('HGETALL', KEYS[2])}
`)

// abortScript removes every trace of an Acquire whose create failed before
// anything ran: the record, the slot, the index entries and the claimed
// key, so a retry with the same key re-evaluates (spec §Idempotency).
//
// KEYS[1] live ZSET, KEYS[2] workspace HASH, KEYS[3] idempotency STRING, KEYS[4] index ZSET,
// KEYS[5] account open ZSET, KEYS[6] account velocity ZSET, KEYS[7] live index ZSET
// ARGV[1] workspace id
// Returns 1.
var abortScript = redis.NewScript(`
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
redis.call('DEL', KEYS[3])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('ZREM', KEYS[7], ARGV[1])
return 1
`)

// terminateScript starts a workspace's termination: it becomes
// terminating with a reason, and its slot is freed at once.
//
// With a condition it starts only when the condition holds at now, read
// in the same script: "expired" (running, at or past expires_at) or "idle"
// (running, an idle timeout behind both its last activity and busy_ms), so
// an exec that touches the workspace meanwhile always wins over the reaper.
//
// With ARGV[5] set (a release) the record must belong to that instance,
// else it reads as absent and nothing changes; and the record as the
// script read it is returned too, so that a release needs no other read
// (the caller applies this script's changes to it: BeginRelease).
//
// Without ARGV[5], with ARGV[6] set (the sandbox the caller holds: an
// Acquire ending what it created) a record that is not terminated and
// names no sandbox yet keeps that one, whether this call starts the
// termination or one had begun: whoever finishes the end later (a retry,
// the reaper) asks the provider to end that sandbox, instead of recording
// an end nobody asked for while the sandbox runs on.
//
// KEYS[1] live ZSET, KEYS[2] workspace HASH, KEYS[3] account open ZSET
// ARGV[1] workspace id, ARGV[2] termination reason, ARGV[3] now (unix ms),
// ARGV[4] condition ("", "expired" or "idle"), ARGV[5] owning instance id or "",
// ARGV[6] provider ref or ""
// A release (ARGV[5] set, reason released, no condition) of a record at
// or past its expires_at is recorded with reason expired.
// Returns {0, ""} no record, {1, state} already terminating or terminated,
// {2, previous state} termination started, {3, state} condition not met;
// each followed by the record's provider ref as it left it (the caller's
// copy may predate the confirm), or, with ARGV[5], by the record as read
// before any change (HGETALL's list; none for 0).
var terminateScript = redis.NewScript(`
-- A release reads the whole record once, up front, and answers it as read.
local rec, st, inst, ref, expires
if ARGV[5] ~= '' then
  rec = redis.call('HGETALL', KEYS[2])
  for i = 1, #rec, 2 do
    if rec[i] == 'state' then st = rec[i + 1] elseif rec[i] == 'instance' then inst = rec[i + 1]
    elseif rec[i] == 'expires_ms' then expires = tonumber(rec[i + 1]) end
  end
else
  local f = redis.call('HMGET', KEYS[2], 'state', 'instance', 'provider_ref')
  st, inst, ref = f[1], f[2], f[3]
end
local function out(code, st)
  if rec and code ~= 0 then return {code, st, rec} end
  return {code, st, ref or ''}
end
if not st then return {0, ''} end
if ARGV[5] ~= '' and inst ~= ARGV[5] then return {0, ''} end
if ARGV[6] ~= '' and not rec and st ~= 'terminated' and (ref or '') == '' then
  redis.call('HSET', KEYS[2], 'provider_ref', ARGV[6])
  ref = ARGV[6]
end
if st == 'terminated' or st == 'terminating' then return out(1, st) end
local now = tonumber(ARGV[3])
if ARGV[4] == 'expired' then
  if st ~= 'running' or tonumber(redis.call('HGET', KEYS[2], 'expires_ms') or '0') > now then return out(3, st) end
elseif ARGV[4] == 'idle' then
  local f = redis.call('HMGET', KEYS[2], 'idle_ms', 'activity_ms', 'busy_ms')
  local idle, last = tonumber(f[1]) or 0, math.max(tonumber(f[2]) or 0, tonumber(f[3]) or 0)
  if st ~= 'running' or idle <= 0 or last + idle > now then return out(3, st) end
end
local reason = ARGV[2]
if rec and reason == 'released' and ARGV[4] == '' and expires and expires > 0 and expires <= now then
  reason = 'expired' -- released at or past its deadline: it ends because it expired
end
redis.call('HSET', KEYS[2], 'state', 'terminating', 'reason', reason, 'terminating_ms', ARGV[3])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return out(2, st)
`)

// finishScript records a termination the provider confirmed and starts the
// record's retention clock.
//
// KEYS[1] workspace HASH, KEYS[2] live index ZSET
// ARGV[1] workspace id, ARGV[2] terminated (unix ms), ARGV[3] retention
// (ms), ARGV[4] an egress counter ("" for none), ARGV[5] and ARGV[6] the
// bytes out and in counted under it
// Returns 1 finished, 0 not terminating.
var finishScript = redis.NewScript(FinishLua + `
if finish_workspace(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]) then return 1 end
return 0
`)

// egressLua defines the Lua function add_counted(key, counter, out, inb):
// the record key's egress bytes grow by what counter, one egress proxy's
// count of the workspace, has counted beyond what the record already holds
// of it (its egress_counted_out:<counter> and egress_counted_in:<counter>
// fields): out and inb are the counter's totals, never deltas, so that a
// count sent twice (a retried pipeline, a reply lost after the write) is
// added once. A counter is never reused (egress.Proxy), so its totals only
// grow. Numbers are formatted with %d: Lua would print a large double in
// exponent form, which HINCRBY refuses.
const egressLua = `
local function add_counted(key, counter, out, inb)
  if counter == '' then return end
  local fo, fi = 'egress_counted_out:' .. counter, 'egress_counted_in:' .. counter
  local seen = redis.call('HMGET', key, fo, fi)
  local so, si = tonumber(seen[1]) or 0, tonumber(seen[2]) or 0
  out, inb = tonumber(out), tonumber(inb)
  if out > so then
    redis.call('HINCRBY', key, 'egress_out', string.format('%d', out - so))
    redis.call('HSET', key, fo, string.format('%d', out))
  end
  if inb > si then
    redis.call('HINCRBY', key, 'egress_in', string.format('%d', inb - si))
    redis.call('HSET', key, fi, string.format('%d', inb))
  end
end
`

// FinishLua defines the Lua function finish_workspace(key, index, id, at,
// retention, counter, eout, ein): the provider-confirmed end of the
// terminating workspace id whose record is key (state terminated,
// terminated_ms at, retention in ms starts, the egress bytes this process
// counted under counter, totals eout and ein, added as add_counted adds
// them: so that a release records them without a round trip of their own;
// and it leaves its instance's live index, index); it returns false,
// changing nothing, when the record is not terminating. It is the one
// definition of that transition: finishScript runs it, and billing's
// settle-at-finish script (billing.Billing.FinishAndSettle) splices it in
// so that a release records its end and settles in one step. Bind its
// arguments with [DB.FinishArgs].
const FinishLua = egressLua + `
local function finish_workspace(key, index, id, at, retention, counter, eout, ein)
  if redis.call('HGET', key, 'state') ~= 'terminating' then return false end
  redis.call('HSET', key, 'state', 'terminated', 'terminated_ms', at)
  add_counted(key, counter, eout, ein)
  redis.call('PEXPIRE', key, retention)
  redis.call('ZREM', index, id)
  return true
end
`

// addEgressScript adds egress bytes counted by a broker's proxy to a
// workspace's record while it is starting or running (add_counted: the
// counter's totals, so a retry adds nothing twice). A terminating one is
// left to its end, which adds what the process ending it counted
// (FinishLua) in the same way.
//
// KEYS[1] workspace HASH
// ARGV[1] the counter, ARGV[2] bytes out, ARGV[3] bytes in (its totals)
// Returns 1 added, 0 terminating (not added), -1 ended or no record.
var addEgressScript = redis.NewScript(egressLua + `
local st = redis.call('HGET', KEYS[1], 'state')
if st == 'starting' or st == 'running' then
  add_counted(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
  return 1
end
if st == 'terminating' then return 0 end
return -1
`)

// indexLiveScript adds to an instance's live index each of the given
// workspaces whose record exists and is not terminated, at its creation
// time, reading the record in the same script: so an entry is never added
// for a workspace that has ended. It builds the live index from the full
// index for records written before the live index existed, and adds a
// workspace that a broker without it admitted (DB.LiveWorkspaces finds
// those by their slot).
//
// KEYS[1] live index ZSET, KEYS[2..] workspace HASHes
// ARGV[i] the workspace id of KEYS[i+1]
// Returns how many it added.
var indexLiveScript = redis.NewScript(`
local n = 0
for i = 2, #KEYS do
  local f = redis.call('HMGET', KEYS[i], 'state', 'created_ms')
  if f[1] and f[1] ~= 'terminated' then
    n = n + redis.call('ZADD', KEYS[1], 'NX', tonumber(f[2]) or 0, ARGV[i - 1])
  end
end
return n
`)

// auditScript appends one operator audit entry. The entry's id is the
// event's time, or the newest entry's when that is later (a gateway whose
// clock is behind), so ids stay ordered and a time range is an id range.
// Entries older than the retention are trimmed approximately (MINID ~).
// It touches one global key, and the once ZSET beside it when given.
//
// KEYS[1] audit STREAM, KEYS[2] (optional) the once ZSET: names of events
// written once, scored by the entry's time
// ARGV[1] event time (unix ms), ARGV[2] oldest id to keep (unix ms), ARGV[3] the event (JSON),
// ARGV[4] (with KEYS[2]) the event's name
// Returns the new entry's id, or 0 for an event named once before.
// An event equal to the newest entry's (its time and request id included)
// is that entry sent again after its reply was lost: its id is returned
// and nothing appended.
var auditScript = redis.NewScript(`
local once = KEYS[2]
if once and redis.call('ZSCORE', once, ARGV[4]) then return 0 end
local t = tonumber(ARGV[1])
local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #top > 0 then
  if top[1][2][2] == ARGV[3] then return top[1][1] end
  local last = tonumber(string.match(top[1][1], '^(%d+)-'))
  if last and last > t then t = last end
end
local id = redis.call('XADD', KEYS[1], 'MINID', '~', ARGV[2], string.format('%d', t) .. '-*', 'e', ARGV[3])
if once then
  redis.call('ZADD', once, t, ARGV[4])
  redis.call('ZREMRANGEBYSCORE', once, '-inf', '(' .. ARGV[2])
end
return id
`)

// Result codes of the snapshot and command scripts, spliced into their
// sources so that Go and Lua share one definition.
const (
	resOK       = 0
	resReplay   = 1 // the Idempotency-Key or the identity was claimed before
	resQuota    = 2 // the instance is at max_snapshots
	resGone     = 3 // the workspace is no longer running
	resRefused  = 4 // the record is not in the state the change needs
	resAbsent   = 5 // no record
	resFinished = 6 // the command already has its result
	resBytes    = 7 // the instance's live snapshots are at (or would go past) max_snapshot_bytes
)

// liveSnapshotBytesLua is a Lua function over an instance's quota ZSET and
// its sizes HASH: the bytes of the snapshots that count at now (members
// scored past now), leaving out the snapshot skip.
const liveSnapshotBytesLua = `
local function live_bytes(quota, sizes, now, skip)
  local total = 0
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', quota, '(' .. now, '+inf')) do
    if id ~= skip then total = total + (tonumber(redis.call('HGET', sizes, id)) or 0) end
  end
  return total
end
`

// beginSnapshotScript claims a snapshot's Idempotency-Key and a quota
// slot, and writes the record as creating. A replay or a full quota
// changes nothing. The byte quota is full when the live snapshots already
// hold max_snapshot_bytes; the new snapshot's own size is checked when it
// is confirmed.
//
// KEYS[1] idempotency STRING, KEYS[2] snapshot HASH, KEYS[3] instance quota ZSET, KEYS[4] account expiry ZSET,
// KEYS[5] instance sizes HASH
// ARGV[1] now (unix ms), ARGV[2] max_snapshots, ARGV[3] pending deadline (unix ms), ARGV[4] snapshot id,
// ARGV[5] idempotency record (JSON), ARGV[6] idempotency TTL (ms), ARGV[7] max_snapshot_bytes (0: none),
// ARGV[8..] record field/value pairs
// Returns {resOK}, {resReplay, record JSON}, {resQuota} or {resBytes}.
var beginSnapshotScript = redis.NewScript(liveSnapshotBytesLua + `
local v = redis.call('GET', KEYS[1])
if v then return {` + itoa(resReplay) + `, v} end
if redis.call('ZCOUNT', KEYS[3], '(' .. ARGV[1], '+inf') >= tonumber(ARGV[2]) then return {` + itoa(resQuota) + `} end
local max_bytes = tonumber(ARGV[7])
if max_bytes > 0 and live_bytes(KEYS[3], KEYS[5], ARGV[1], '') >= max_bytes then return {` + itoa(resBytes) + `} end
redis.call('HSET', KEYS[2], unpack(ARGV, 8))
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4])
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[4])
redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[6])
return {` + itoa(resOK) + `}
`)

// confirmSnapshotScript records contents the provider stored: the
// snapshot becomes live until expires_at, its size counts against the
// byte quota, and its key is done. When it is no longer creating (the
// reaper expired its pending slot, and will delete the contents) it
// refuses and frees the key, so a retry re-evaluates. When its size would
// take the live snapshots past max_snapshot_bytes it changes nothing and
// answers resBytes: the caller deletes the contents and aborts.
//
// KEYS[1] idempotency STRING, KEYS[2] snapshot HASH, KEYS[3] instance quota ZSET, KEYS[4] account expiry ZSET,
// KEYS[5] instance sizes HASH
// ARGV[1] snapshot id, ARGV[2] expires_at (unix ms), ARGV[3] provider ref, ARGV[4] dir,
// ARGV[5] idempotency record (JSON), ARGV[6] idempotency TTL (ms), ARGV[7] size (bytes),
// ARGV[8] max_snapshot_bytes (0: none), ARGV[9] now (unix ms)
// Returns resOK, resRefused or resBytes. A snapshot already live with this
// provider ref and expiry is this confirm's own, run before (a command
// resent after its reply was lost): resOK, changing nothing.
var confirmSnapshotScript = redis.NewScript(liveSnapshotBytesLua + `
local cur = redis.call('HMGET', KEYS[2], 'state', 'provider_ref', 'expires_ms')
if cur[1] == 'live' and cur[2] == ARGV[3] and cur[3] == ARGV[2] then
  return ` + itoa(resOK) + ` -- this confirm, run before (a resent command)
end
if cur[1] ~= 'creating' then
  redis.call('DEL', KEYS[1])
  return ` + itoa(resRefused) + `
end
local max_bytes = tonumber(ARGV[8])
if max_bytes > 0 and live_bytes(KEYS[3], KEYS[5], ARGV[9], ARGV[1]) + tonumber(ARGV[7]) > max_bytes then
  return ` + itoa(resBytes) + `
end
redis.call('HSET', KEYS[2], 'state', 'live', 'provider_ref', ARGV[3], 'dir', ARGV[4], 'expires_ms', ARGV[2], 'bytes', ARGV[7])
redis.call('HSET', KEYS[5], ARGV[1], ARGV[7])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[6])
return ` + itoa(resOK) + `
`)

// abortSnapshotScript removes a snapshot whose provider call failed and
// stored nothing: record, quota slot, expiry entry and key, so a retry
// with the same key re-evaluates (spec §Idempotency).
//
// KEYS[1] idempotency STRING, KEYS[2] snapshot HASH, KEYS[3] instance quota ZSET, KEYS[4] account expiry ZSET,
// KEYS[5] instance sizes HASH
// ARGV[1] snapshot id
// Returns resOK, or resRefused when it is no longer creating (the key is freed all the same).
var abortSnapshotScript = redis.NewScript(`
redis.call('DEL', KEYS[1])
if redis.call('HGET', KEYS[2], 'state') ~= 'creating' then return ` + itoa(resRefused) + ` end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
return ` + itoa(resOK) + `
`)

// deleteSnapshotScript starts a snapshot's deletion (by the client, or at
// its expiry): it stops counting against the quota, cannot be restored any
// more, and is queued for the provider to delete its contents.
//
// KEYS[1] snapshot HASH, KEYS[2] instance quota ZSET, KEYS[3] account expiry ZSET, KEYS[4] account gc ZSET,
// KEYS[5] instance sizes HASH
// ARGV[1] snapshot id, ARGV[2] now (unix ms), ARGV[3] reason (deleted or expired),
// ARGV[4] 1 to act only when the snapshot is due (its score in KEYS[3] at or before now)
// Returns {resOK, previous state}, {resRefused, state} (already deleting or
// deleted, or not due) or {resAbsent, ""}.
var deleteSnapshotScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return {` + itoa(resAbsent) + `, ''} end
if st ~= 'creating' and st ~= 'live' then return {` + itoa(resRefused) + `, st} end
if ARGV[4] == '1' then
  local due = redis.call('ZSCORE', KEYS[3], ARGV[1])
  if due and tonumber(due) > tonumber(ARGV[2]) then return {` + itoa(resRefused) + `, st} end
end
redis.call('HSET', KEYS[1], 'state', 'deleting', 'deleted_ms', ARGV[2], 'reason', ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[2], ARGV[1])
return {` + itoa(resOK) + `, st}
`)

// purgeSnapshotScript records the provider-confirmed deletion of a
// snapshot's contents: only a tombstone is left, without the directory or
// the provider's reference, so the id answers 410 rather than 404 until
// the tombstone expires.
//
// KEYS[1] snapshot HASH, KEYS[2] account gc ZSET
// ARGV[1] snapshot id, ARGV[2] tombstone TTL (ms)
// Returns resOK, or resRefused when the snapshot is not deleting.
var purgeSnapshotScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'state') ~= 'deleting' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return ` + itoa(resRefused) + `
end
redis.call('HSET', KEYS[1], 'state', 'deleted')
redis.call('HDEL', KEYS[1], 'dir', 'provider_ref')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[1])
return ` + itoa(resOK) + `
`)

// claimCommandScript claims a durable command's identity, atomically
// across every gateway process: a second claim of the same identity finds
// the record, whatever state it is in (a cancel before any claim leaves a
// canceled record, which fences the identity). A claim also counts as
// activity and keeps the workspace busy until the command's deadline.
//
// KEYS[1] command HASH, KEYS[2] workspace HASH, KEYS[3] workspace busy ZSET
// ARGV[1] now (unix ms), ARGV[2] dispatch deadline (unix ms), ARGV[3] command deadline (unix ms),
// ARGV[4] command key, ARGV[5] workspace id, ARGV[6] records expire at (unix ms),
// ARGV[7] the claim's nonce, new for each call
// Returns {resOK}, {resReplay, state} or {resGone, workspace state}. A
// record still starting under this call's nonce is its own claim, run
// before and its reply lost (a resent command): resOK.
var claimCommandScript = redis.NewScript(`
local cur = redis.call('HMGET', KEYS[1], 'state', 'claim')
if cur[1] == 'starting' and cur[2] == ARGV[7] then return {` + itoa(resOK) + `} end
if cur[1] then return {` + itoa(resReplay) + `, cur[1]} end
local ws = redis.call('HGET', KEYS[2], 'state')
if ws ~= 'running' then return {` + itoa(resGone) + `, ws or ''} end
redis.call('HSET', KEYS[1], 'ws', ARGV[5], 'key', ARGV[4], 'state', 'starting', 'launched', '0', 'canceled', '0',
  'claimed_ms', ARGV[1], 'dispatch_ms', ARGV[2], 'deadline_ms', ARGV[3], 'claim', ARGV[7])
redis.call('PEXPIREAT', KEYS[1], ARGV[6])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4])
redis.call('PEXPIREAT', KEYS[3], ARGV[6])
local top = redis.call('ZREVRANGE', KEYS[3], 0, 0, 'WITHSCORES')
redis.call('HSET', KEYS[2], 'activity_ms', ARGV[1], 'busy_ms', top[2] or '0')
return {` + itoa(resOK) + `}
`)

// launchedCommandScript records a launch the provider confirmed: a
// starting command becomes running; a command canceled meanwhile stays
// canceled (the provider's fence or kill took care of it).
//
// KEYS[1] command HASH
// Returns the state after the call, empty when there is no record.
var launchedCommandScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return '' end
redis.call('HSET', KEYS[1], 'launched', '1')
if st == 'starting' then
  redis.call('HSET', KEYS[1], 'state', 'running')
  return 'running'
end
return st
`)

// unclaimCommandScript releases an identity whose command definitely did
// not start, so it may be claimed again; a record canceled meanwhile stays
// as the fence.
//
// KEYS[1] command HASH, KEYS[2] workspace HASH, KEYS[3] workspace busy ZSET
// ARGV[1] command key
// Returns resOK or resRefused (not starting).
var unclaimCommandScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'state') ~= 'starting' then return ` + itoa(resRefused) + ` end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[1])
local top = redis.call('ZREVRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('HSET', KEYS[2], 'busy_ms', top[2] or '0') end
return ` + itoa(resOK) + `
`)

// cancelCommandScript records a cancel. An identity never claimed gets a
// canceled record, so a later claim finds it and never launches; a
// starting or running command becomes canceled; a completed one keeps its
// result.
//
// KEYS[1] command HASH, KEYS[2] workspace HASH
// ARGV[1] now (unix ms), ARGV[2] records expire at (unix ms), ARGV[3] command key, ARGV[4] workspace id
// Returns {resAbsent, ""} (fenced before any claim), {resFinished, state}
// or {resOK, previous state, launched}.
var cancelCommandScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[1], 'state')
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('HSET', KEYS[2], 'activity_ms', ARGV[1]) end
if not st then
  redis.call('HSET', KEYS[1], 'ws', ARGV[4], 'key', ARGV[3], 'state', 'canceled', 'launched', '0', 'canceled', '1',
    'claimed_ms', ARGV[1], 'dispatch_ms', ARGV[1], 'deadline_ms', ARGV[1])
  redis.call('PEXPIREAT', KEYS[1], ARGV[2])
  return {` + itoa(resAbsent) + `, ''}
end
if st == 'completed' then return {` + itoa(resFinished) + `, st} end
redis.call('HSET', KEYS[1], 'state', 'canceled', 'canceled', '1')
return {` + itoa(resOK) + `, st, redis.call('HGET', KEYS[1], 'launched') or '0'}
`)

// finishCommandScript records a finished command's state and exit status
// as the provider reports it: completed wins over a cancel that came too
// late to kill it. The command stops keeping the workspace busy, and its
// end counts as activity (never moving the last activity back: a command
// found finished long after its end leaves later activity as it is).
//
// KEYS[1] command HASH, KEYS[2] workspace HASH, KEYS[3] workspace busy ZSET
// ARGV[1] state (completed or canceled), ARGV[2] exit code (empty for none), ARGV[3] timed out (0/1),
// ARGV[4] now (unix ms), ARGV[5] command key
// Returns the state after the call, empty when there is no record.
var finishCommandScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return '' end
if redis.call('HGET', KEYS[1], 'has_exit') == '1' or (st == 'completed' and ARGV[1] ~= 'completed') then return st end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'finished_ms', ARGV[4], 'timed_out', ARGV[3])
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'exit_code', ARGV[2], 'has_exit', '1') end
redis.call('ZREM', KEYS[3], ARGV[5])
if redis.call('EXISTS', KEYS[2]) == 1 then
  local top = redis.call('ZREVRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  local last = tonumber(redis.call('HGET', KEYS[2], 'activity_ms') or '0') or 0
  redis.call('HSET', KEYS[2], 'busy_ms', top[2] or '0', 'activity_ms', math.max(last, tonumber(ARGV[4])))
end
return ARGV[1]
`)
