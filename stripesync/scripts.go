package stripesync

import "github.com/redis/go-redis/v9"

// Every script touches the keys of one account (one hash tag). The lease
// is the fence: a gateway whose lease ran out (it stalled, another took
// the account) moves no cursor and changes no dead letter.

// renewScript extends the lease if the caller still holds it.
//
// KEYS[1] lease STRING
// ARGV[1] owner, ARGV[2] TTL (ms)
// Returns 1 held and extended, 0 lost.
var renewScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// releaseScript deletes the lease if the caller holds it.
//
// KEYS[1] lease STRING
// ARGV[1] owner
// Returns 1 released, 0 not held.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
`)

// advanceScript moves the cursor past one ledger entry the caller is done
// with, extends its lease, and counts the outcome; a dead letter is
// stored with it, in the same step.
//
// KEYS[1] lease STRING, KEYS[2] cursor STRING, KEYS[3] state HASH,
// KEYS[4] dead HASH
// ARGV[1] owner, ARGV[2] the entry's stream id, ARGV[3] lease TTL (ms),
// ARGV[4] outcome: "sent", "skipped" or "dead", ARGV[5] now (unix ms),
// ARGV[6] entry id (for "dead"), ARGV[7] dead letter JSON (for "dead")
// Returns 1 moved, 0 lease lost (nothing written).
var advanceScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], ARGV[2])
if ARGV[4] == 'sent' then
  redis.call('HINCRBY', KEYS[3], 'sent', 1)
  redis.call('HSET', KEYS[3], 'last_sent_at', ARGV[5])
elseif ARGV[4] == 'dead' then
  redis.call('HSET', KEYS[4], ARGV[6], ARGV[7])
  redis.call('HINCRBY', KEYS[3], 'dead_lettered', 1)
end
redis.call('HDEL', KEYS[3], 'head_id', 'head_attempts')
return 1
`)

// failScript records a failed send: the counter, the last error and, for
// an entry's own failure (ARGV[4] not ""), how many rounds that entry at
// the cursor has failed.
//
// KEYS[1] state HASH
// ARGV[1] error text (redacted), ARGV[2] now (unix ms), ARGV[3] attempts
// to add to failures, ARGV[4] entry id or ""
// Returns the entry's failed rounds (0 when ARGV[4] is "").
var failScript = redis.NewScript(`
redis.call('HINCRBY', KEYS[1], 'failures', ARGV[3])
redis.call('HSET', KEYS[1], 'last_error', ARGV[1], 'last_error_at', ARGV[2])
if ARGV[4] == '' then return 0 end
if redis.call('HGET', KEYS[1], 'head_id') ~= ARGV[4] then
  redis.call('HSET', KEYS[1], 'head_id', ARGV[4], 'head_attempts', 0)
end
return redis.call('HINCRBY', KEYS[1], 'head_attempts', 1)
`)

// requeuedScript settles one requeued dead letter: removed from the retry
// hash when sent, or put back on the dead list with its new error.
//
// KEYS[1] lease STRING, KEYS[2] retry HASH, KEYS[3] dead HASH,
// KEYS[4] state HASH
// ARGV[1] owner, ARGV[2] entry id, ARGV[3] "sent", "skipped" or "dead",
// ARGV[4] dead letter JSON (for "dead"), ARGV[5] now (unix ms)
// Returns 1 done, 0 lease lost.
var requeuedScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[2], ARGV[2])
if ARGV[3] == 'sent' then
  redis.call('HINCRBY', KEYS[4], 'sent', 1)
  redis.call('HSET', KEYS[4], 'last_sent_at', ARGV[5])
elseif ARGV[3] == 'dead' then
  redis.call('HSET', KEYS[3], ARGV[2], ARGV[4])
end
return 1
`)

// retryScript moves dead letters to the retry hash; with no ids, all.
//
// KEYS[1] dead HASH, KEYS[2] retry HASH
// ARGV the entry ids (none: every dead letter)
// Returns how many moved.
var retryScript = redis.NewScript(`
local ids = ARGV
if #ids == 0 then ids = redis.call('HKEYS', KEYS[1]) end
local n = 0
for _, id in ipairs(ids) do
  local v = redis.call('HGET', KEYS[1], id)
  if v then
    redis.call('HSET', KEYS[2], id, v)
    redis.call('HDEL', KEYS[1], id)
    n = n + 1
  end
end
return n
`)
