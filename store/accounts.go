package store

import (
	"context"
	"fmt"
	"slices"

	"github.com/sandgate/sandgate"
)

// CreateAccount stores a new account. An account stored already is
// ErrExists, unless it is a, byte for byte (its creation time included):
// this call's own SETNX, sent again after its reply was lost, which then
// goes on to list it.
func (db *DB) CreateAccount(ctx context.Context, a sandgate.Account) error {
	v := mustJSON(a)
	ok, err := db.rdb.SetNX(ctx, accountKey(a.ID), v, 0).Result()
	if err != nil {
		return fmt.Errorf("create account: %w", err)
	}
	if !ok {
		if cur, err := db.rdb.Get(ctx, accountKey(a.ID)).Result(); err != nil || cur != v {
			return ErrExists
		}
	}
	return db.rdb.SAdd(ctx, accountsKey(), a.ID).Err()
}

// Account returns one account. Returns ErrNotFound.
func (db *DB) Account(ctx context.Context, id string) (sandgate.Account, error) {
	var a sandgate.Account
	err := db.getJSON(ctx, accountKey(id), &a)
	return a, err
}

// Accounts returns every account, sorted by id.
func (db *DB) Accounts(ctx context.Context) ([]sandgate.Account, error) {
	ids, err := db.rdb.SMembers(ctx, accountsKey()).Result()
	if err != nil {
		return nil, err
	}
	slices.Sort(ids)
	out := make([]sandgate.Account, 0, len(ids))
	for _, id := range ids {
		a, err := db.Account(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("account %s: %w", id, err)
		}
		out = append(out, a)
	}
	return out, nil
}

// PutInstance stores an instance, new or updated, and invalidates auth caches.
func (db *DB) PutInstance(ctx context.Context, in sandgate.Instance) error {
	// The record and the account's set share the account's slot and
	// change together; the global id index is another slot (a separate
	// write on Redis Cluster), written after, so an instance found by id
	// always has its record. A failure between leaves a record not yet
	// found by id; the operator's retry writes the index.
	pipe := db.rdb.TxPipeline()
	pipe.Set(ctx, instanceKey(in.AccountID, in.ID), mustJSON(in), 0)
	pipe.SAdd(ctx, instancesKey(in.AccountID), in.ID)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("put instance: %w", err)
	}
	if err := db.rdb.Set(ctx, instanceIndexKey(in.ID), in.AccountID, 0).Err(); err != nil {
		return fmt.Errorf("put instance: %w", err)
	}
	return db.publishInvalidate(ctx)
}

// Instance returns one instance by id. Returns ErrNotFound.
func (db *DB) Instance(ctx context.Context, id string) (sandgate.Instance, error) {
	acct, err := db.rdb.Get(ctx, instanceIndexKey(id)).Result()
	if err != nil {
		if isNil(err) {
			return sandgate.Instance{}, ErrNotFound
		}
		return sandgate.Instance{}, err
	}
	return db.InstanceOf(ctx, acct, id)
}

// InstanceOf returns one instance of a known account. Returns ErrNotFound.
func (db *DB) InstanceOf(ctx context.Context, acct, id string) (sandgate.Instance, error) {
	var in sandgate.Instance
	err := db.getJSON(ctx, instanceKey(acct, id), &in)
	return in, err
}

// Instances returns an account's instances, sorted by id.
func (db *DB) Instances(ctx context.Context, acct string) ([]sandgate.Instance, error) {
	ids, err := db.rdb.SMembers(ctx, instancesKey(acct)).Result()
	if err != nil {
		return nil, err
	}
	slices.Sort(ids)
	out := make([]sandgate.Instance, 0, len(ids))
	for _, id := range ids {
		in, err := db.InstanceOf(ctx, acct, id)
		if err != nil {
			return nil, fmt.Errorf("instance %s: %w", id, err)
		}
		out = append(out, in)
	}
	return out, nil
}
