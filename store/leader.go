package store

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// leaderScript takes or renews the reaper's leader lease. The holder
// renews it (its TTL starts again); anyone else takes it only when it is
// free, and a taking increments the fencing counter, whose value is the
// new holder's token.
//
// KEYS[1] leader STRING, KEYS[2] fence counter STRING
// ARGV[1] owner, ARGV[2] TTL (ms)
// Returns the holder's fencing token, or 0 when another owner holds the lease.
var leaderScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
if cur then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return redis.call('INCR', KEYS[2])
`)

// releaseLeaderScript gives the lease up, only when owner holds it.
//
// KEYS[1] leader STRING
// ARGV[1] owner
// Returns 1 released, 0 not the holder.
var releaseLeaderScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
`)

// AcquireLeader takes or renews the reaper's leader lease for owner for
// ttl. It returns the holder's fencing token (it grows with every change
// of holder) and whether owner holds the lease now.
func (db *DB) AcquireLeader(ctx context.Context, owner string, ttl time.Duration) (int64, bool, error) {
	n, err := leaderScript.Run(ctx, db.rdb, []string{reaperLeaderKey(), reaperFenceKey()}, owner, ttl.Milliseconds()).Int64()
	if err != nil {
		return 0, false, fmt.Errorf("leader: %w", err)
	}
	return n, n > 0, nil
}

// ReleaseLeader gives the lease up if owner holds it, so another process
// takes over at once rather than after the TTL.
func (db *DB) ReleaseLeader(ctx context.Context, owner string) error {
	if err := releaseLeaderScript.Run(ctx, db.rdb, []string{reaperLeaderKey()}, owner).Err(); err != nil {
		return fmt.Errorf("release leader: %w", err)
	}
	return nil
}

// LeaderFence returns the current fencing token (0 before any leader).
func (db *DB) LeaderFence(ctx context.Context) (int64, error) {
	n, err := db.rdb.Get(ctx, reaperFenceKey()).Int64()
	if isNil(err) {
		return 0, nil
	}
	return n, err
}
