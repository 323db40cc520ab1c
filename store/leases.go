package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
)

func isNil(err error) bool { return errors.Is(err, redis.Nil) }

// Auth is what a token resolves to: its lease and the instance it
// authenticates, and the stop and pause state that applies to it.
type Auth struct {
	Lease    sandgate.Lease
	Instance sandgate.Instance
	Controls Controls
}

// AuthByTokenHash resolves a token's hash. Returns ErrNotFound for an
// unknown token. The caller checks the lease's state.
func (db *DB) AuthByTokenHash(ctx context.Context, hash string) (Auth, error) {
	var a Auth
	if err := db.getJSON(ctx, tokenKey(hash), &a.Lease); err != nil {
		return Auth{}, err
	}
	// The instance and its controls come in one round trip: two in all.
	pipe := db.rdb.Pipeline()
	inst := pipe.Get(ctx, instanceKey(a.Lease.AccountID, a.Lease.InstanceID))
	controls := queueControls(ctx, pipe, a.Lease.AccountID, a.Lease.InstanceID)
	if _, err := pipe.Exec(ctx); err != nil && !isNil(err) {
		return Auth{}, err
	}
	b, err := inst.Bytes()
	if isNil(err) {
		return Auth{}, fmt.Errorf("instance of lease %s: %w", a.Lease.ID, ErrNotFound)
	}
	if err != nil {
		return Auth{}, err
	}
	if err := jsonUnmarshal(b, &a.Instance); err != nil {
		return Auth{}, err
	}
	if a.Controls, err = controls(); err != nil {
		return Auth{}, err
	}
	return a, nil
}

// Leases returns every lease issued to an instance.
func (db *DB) Leases(ctx context.Context, acct, inst string) ([]sandgate.Lease, error) {
	hashes, err := db.rdb.SMembers(ctx, leasesKey(acct, inst)).Result()
	if err != nil {
		return nil, err
	}
	out := make([]sandgate.Lease, 0, len(hashes))
	for _, h := range hashes {
		var l sandgate.Lease
		if err := db.getJSON(ctx, tokenKey(h), &l); err != nil {
			if errors.Is(err, ErrNotFound) {
				continue
			}
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// IssueLease stores a new lease. With supersede, every other lease of the
// instance that is still active becomes superseded at now, with a grace
// period ending at now+grace. Auth caches are invalidated before it returns.
func (db *DB) IssueLease(ctx context.Context, l sandgate.Lease, supersede bool, now time.Time, grace time.Duration) error {
	if supersede {
		if err := db.updateLeases(ctx, l.AccountID, l.InstanceID, func(old *sandgate.Lease) bool {
			if old.StateAt(now) != sandgate.LeaseActive {
				return false
			}
			old.SupersededAt = now
			old.GraceUntil = now.Add(grace)
			return true
		}); err != nil {
			return err
		}
	}
	// Three keys in three hash slots (the token and lease indexes are
	// global), so on Redis Cluster no transaction can span them: they are
	// written in an order in which a failure part-way is harmless. The
	// instance's set and the lease index come first, so that a token
	// that exists is always found by RevokeLeases and by its lease id; a
	// failure before the token is written leaves index entries to a
	// token nobody holds, which every reader skips.
	if err := db.rdb.SAdd(ctx, leasesKey(l.AccountID, l.InstanceID), l.TokenHash).Err(); err != nil {
		return fmt.Errorf("issue lease: %w", err)
	}
	if err := db.rdb.Set(ctx, leaseIndexKey(l.ID), l.TokenHash, 0).Err(); err != nil {
		return fmt.Errorf("issue lease: %w", err)
	}
	if err := db.rdb.Set(ctx, tokenKey(l.TokenHash), mustJSON(l), 0).Err(); err != nil {
		return fmt.Errorf("issue lease: %w", err)
	}
	return db.publishInvalidate(ctx)
}

// RevokeLeases revokes every lease of an instance at now and returns how
// many it revoked.
func (db *DB) RevokeLeases(ctx context.Context, acct, inst string, now time.Time) (int, error) {
	n := 0
	err := db.updateLeases(ctx, acct, inst, func(l *sandgate.Lease) bool {
		if !l.RevokedAt.IsZero() {
			return false
		}
		l.RevokedAt = now
		n++
		return true
	})
	return n, err
}

// LeaseByID returns the lease with the given id. Returns ErrNotFound when
// there is none. A lease issued before the lease index existed is found by
// walking every instance's leases once, and then indexed.
func (db *DB) LeaseByID(ctx context.Context, id string) (sandgate.Lease, error) {
	hash, err := db.rdb.Get(ctx, leaseIndexKey(id)).Result()
	switch {
	case err == nil:
		var l sandgate.Lease
		if err := db.getJSON(ctx, tokenKey(hash), &l); err != nil {
			return sandgate.Lease{}, err
		}
		return l, nil
	case !isNil(err):
		return sandgate.Lease{}, err
	}
	accts, err := db.rdb.SMembers(ctx, accountsKey()).Result()
	if err != nil {
		return sandgate.Lease{}, err
	}
	for _, a := range accts {
		insts, err := db.rdb.SMembers(ctx, instancesKey(a)).Result()
		if err != nil {
			return sandgate.Lease{}, err
		}
		for _, i := range insts {
			ls, err := db.Leases(ctx, a, i)
			if err != nil {
				return sandgate.Lease{}, err
			}
			for _, l := range ls {
				if l.ID == id {
					if err := db.rdb.Set(ctx, leaseIndexKey(id), l.TokenHash, 0).Err(); err != nil {
						return sandgate.Lease{}, err
					}
					return l, nil
				}
			}
		}
	}
	return sandgate.Lease{}, fmt.Errorf("lease %s: %w", id, ErrNotFound)
}

// RevokeLease revokes the one lease l (of its instance) at now, leaving
// the instance's other leases as they are, and reports whether it revoked
// it (false when it already was). Auth caches are invalidated before it
// returns, as for RevokeLeases.
func (db *DB) RevokeLease(ctx context.Context, l sandgate.Lease, now time.Time) (bool, error) {
	revoked := false
	err := db.updateLeases(ctx, l.AccountID, l.InstanceID, func(cur *sandgate.Lease) bool {
		if cur.ID != l.ID || !cur.RevokedAt.IsZero() {
			return false
		}
		cur.RevokedAt = now
		revoked = true
		return true
	})
	return revoked, err
}

// EndGrace ends the grace period of every superseded lease of an instance
// at now, and returns how many it ended.
func (db *DB) EndGrace(ctx context.Context, acct, inst string, now time.Time) (int, error) {
	n := 0
	err := db.updateLeases(ctx, acct, inst, func(l *sandgate.Lease) bool {
		if l.StateAt(now) != sandgate.LeaseSuperseded {
			return false
		}
		l.GraceUntil = now
		n++
		return true
	})
	return n, err
}

// updateLeases applies fn to each lease of an instance, writes the ones it
// changed, and invalidates auth caches. Token changes are operator actions,
// rare and serialized by the operator API, so a read-modify-write per lease
// under WATCH is enough.
func (db *DB) updateLeases(ctx context.Context, acct, inst string, fn func(*sandgate.Lease) bool) error {
	hashes, err := db.rdb.SMembers(ctx, leasesKey(acct, inst)).Result()
	if err != nil {
		return err
	}
	for _, h := range hashes {
		key := tokenKey(h)
		err := db.rdb.Watch(ctx, func(tx *redis.Tx) error {
			b, err := tx.Get(ctx, key).Bytes()
			if isNil(err) {
				return nil
			}
			if err != nil {
				return err
			}
			var l sandgate.Lease
			if err := jsonUnmarshal(b, &l); err != nil {
				return err
			}
			if !fn(&l) {
				return nil
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, key, mustJSON(l), 0)
				return nil
			})
			return err
		}, key)
		if err != nil {
			return fmt.Errorf("update lease: %w", err)
		}
	}
	return db.publishInvalidate(ctx)
}
