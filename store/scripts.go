package store

import "github.com/redis/go-redis/v9"

// confirmScript records a create the provider confirmed: the workspace
// becomes running and its slot's deadline becomes expires_at. It refuses
// when the workspace is no longer starting (released meanwhile) or its
// pending slot was pruned; the caller then terminates the sandbox. Either
// way the Idempotency-Key's record is marked done: the key names this
// workspace from now on, so a replay answers it (terminated, if refused)
// instead of idempotency_in_progress until the key's TTL.
//
// KEYS[1] live ZSET, KEYS[2] workspace HASH, KEYS[3] idempotency STRING, KEYS[4] account open ZSET
// ARGV[1] workspace id, ARGV[2] expires_at (unix ms), ARGV[3] provider ref,
// ARGV[4] started (unix ms), ARGV[5] idempotency record (JSON), ARGV[6] idempotency TTL (ms)
// Returns 1 confirmed, 0 refused.
var confirmScript = redis.NewScript(`
redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[6])
if redis.call('HGET', KEYS[2], 'state') ~= 'starting' then return 0 end
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('HSET', KEYS[2], 'state', 'running', 'provider_ref', ARGV[3], 'started_ms', ARGV[4], 'activity_ms', ARGV[4])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[2], ARGV[1])
return 1
`)

// abortScript removes every trace of an Acquire whose create failed before
// anything ran: the record, the slot, the index entry and the claimed key,
// so a retry with the same key re-evaluates (spec §Idempotency).
//
// KEYS[1] live ZSET, KEYS[2] workspace HASH, KEYS[3] idempotency STRING, KEYS[4] index ZSET,
// KEYS[5] account open ZSET, KEYS[6] account velocity ZSET
// ARGV[1] workspace id
// Returns 1.
var abortScript = redis.NewScript(`
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
redis.call('DEL', KEYS[3])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
return 1
`)

// terminateScript starts a workspace's termination: it becomes
// terminating with a reason, and its slot is freed at once.
//
// KEYS[1] live ZSET, KEYS[2] workspace HASH, KEYS[3] account open ZSET
// ARGV[1] workspace id, ARGV[2] termination reason, ARGV[3] now (unix ms)
// Returns {0} no record, {1, state} already terminating or terminated,
// {2, previous state} termination started.
var terminateScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[2], 'state')
if not st then return {0, ''} end
if st == 'terminated' or st == 'terminating' then return {1, st} end
redis.call('HSET', KEYS[2], 'state', 'terminating', 'reason', ARGV[2], 'terminating_ms', ARGV[3])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return {2, st}
`)

// finishScript records a termination the provider confirmed and starts the
// record's retention clock.
//
// KEYS[1] workspace HASH
// ARGV[1] terminated (unix ms), ARGV[2] retention (ms)
// Returns 1 finished, 0 not terminating.
var finishScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'state') ~= 'terminating' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'terminated', 'terminated_ms', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// auditScript appends one operator audit entry. The entry's id is the
// event's time, or the newest entry's when that is later (a gateway whose
// clock is behind), so ids stay ordered and a time range is an id range.
// Entries older than the retention are trimmed approximately (MINID ~).
// It touches one global key.
//
// KEYS[1] audit STREAM
// ARGV[1] event time (unix ms), ARGV[2] oldest id to keep (unix ms), ARGV[3] the event (JSON)
// Returns the new entry's id.
var auditScript = redis.NewScript(`
local t = tonumber(ARGV[1])
local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #top > 0 then
  local last = tonumber(string.match(top[1][1], '^(%d+)-'))
  if last and last > t then t = last end
end
return redis.call('XADD', KEYS[1], 'MINID', '~', ARGV[2], string.format('%d', t) .. '-*', 'e', ARGV[3])
`)
