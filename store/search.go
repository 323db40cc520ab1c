package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
)

// AccountIDByName returns the id of the account that claimed name
// (compared by [AccountNameKey]), or ErrNotFound. Accounts created before
// names were claimed hold no claim and are not found here.
func (db *DB) AccountIDByName(ctx context.Context, name string) (string, error) {
	id, err := db.rdb.HGet(ctx, accountNamesKey(), AccountNameKey(name)).Result()
	if isNil(err) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("account by name: %w", err)
	}
	return id, nil
}

// InstancesOf returns the instances of every account of accts, in one
// round trip per step instead of one per instance, grouped by account in
// the order of accts and sorted by id within each.
func (db *DB) InstancesOf(ctx context.Context, accts []string) ([]sandgate.Instance, error) {
	if len(accts) == 0 {
		return nil, nil
	}
	pipe := db.rdb.Pipeline()
	sets := make([]*redis.StringSliceCmd, len(accts))
	for i, a := range accts {
		sets[i] = pipe.SMembers(ctx, instancesKey(a))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("instances: %w", err)
	}
	pipe = db.rdb.Pipeline()
	var recs []*redis.StringCmd
	for i, a := range accts {
		ids := sets[i].Val()
		slices.Sort(ids)
		for _, id := range ids {
			recs = append(recs, pipe.Get(ctx, instanceKey(a, id)))
		}
	}
	if len(recs) == 0 {
		return nil, nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !isNil(err) {
		return nil, fmt.Errorf("instances: %w", err)
	}
	out := make([]sandgate.Instance, 0, len(recs))
	for _, r := range recs {
		b, err := r.Bytes()
		if isNil(err) {
			continue // removed between the two reads
		}
		if err != nil {
			return nil, fmt.Errorf("instances: %w", err)
		}
		var in sandgate.Instance
		if err := json.Unmarshal(b, &in); err != nil {
			return nil, fmt.Errorf("instance record: %w", err)
		}
		out = append(out, in)
	}
	return out, nil
}
