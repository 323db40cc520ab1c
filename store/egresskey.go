package store

import (
	"context"
	"crypto/rand"
	"fmt"
)

// EgressKey returns the store's egress credential key, made on first use:
// 32 random bytes that the first gateway to ask sets (SETNX) and every
// other one reads, so that all of them derive and check the same vendor
// guests' credentials (egress.Config.CredentialKey). It is a secret: never
// log it.
func (db *DB) EgressKey(ctx context.Context) ([]byte, error) {
	fresh := make([]byte, 32)
	if _, err := rand.Read(fresh); err != nil {
		return nil, fmt.Errorf("egress key: %w", err)
	}
	if err := db.rdb.SetNX(ctx, egressKeyKey(), fresh, 0).Err(); err != nil {
		return nil, fmt.Errorf("egress key: %w", err)
	}
	key, err := db.rdb.Get(ctx, egressKeyKey()).Bytes()
	if err != nil {
		return nil, fmt.Errorf("egress key: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("egress key: %s holds %d bytes, not 32", egressKeyKey(), len(key))
	}
	return key, nil
}
