package store

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// RegisterBroker records that a gateway with broker id id runs on the
// store.
func (db *DB) RegisterBroker(ctx context.Context, id string, now time.Time) error {
	if err := db.rdb.HSet(ctx, brokersKey(), id, strconv.FormatInt(now.UnixMilli(), 10)).Err(); err != nil {
		return fmt.Errorf("register broker: %w", err)
	}
	return nil
}

// Brokers returns the broker ids of every gateway that registered on the
// store (RegisterBroker).
func (db *DB) Brokers(ctx context.Context) ([]string, error) {
	ids, err := db.rdb.HKeys(ctx, brokersKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("brokers: %w", err)
	}
	return ids, nil
}
