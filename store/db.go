package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Errors the store returns. Callers decide what they mean on the wire.
var (
	ErrNotFound = errors.New("store: not found")
	ErrExists   = errors.New("store: already exists")
)

// Config configures a DB. A zero field means the default noted beside it.
type Config struct {
	// IdempotencyTTL is how long a claimed Idempotency-Key is kept. 0 means 7 days.
	IdempotencyTTL time.Duration
	// Retention is how long a terminated workspace's record is kept. 0 means 7 days.
	Retention time.Duration
	// PendingTimeout bounds a create: a slot still pending after it is
	// freed. 0 means 2 minutes.
	PendingTimeout time.Duration
	// SnapshotTombstone is how long a deleted snapshot's tombstone is
	// kept, so its id answers 410 snapshot_gone rather than 404. 0 means
	// 90 days.
	SnapshotTombstone time.Duration
}

func (c *Config) setDefaults() {
	if c.IdempotencyTTL == 0 {
		c.IdempotencyTTL = 7 * 24 * time.Hour
	}
	if c.Retention == 0 {
		c.Retention = 7 * 24 * time.Hour
	}
	if c.PendingTimeout == 0 {
		c.PendingTimeout = 2 * time.Minute
	}
	if c.SnapshotTombstone == 0 {
		c.SnapshotTombstone = 90 * 24 * time.Hour
	}
}

// DB is sandgate's state in Redis. It is safe for concurrent use.
type DB struct {
	rdb redis.UniversalClient
	cfg Config
	// indexed holds the instances (account id + "/" + instance id) whose
	// live index this process has built from the full index
	// (ensureLiveIndex): once per process and instance.
	indexed sync.Map
}

// New returns a DB over rdb, configured by cfg. It does not take
// ownership of rdb.
func New(cfg Config, rdb redis.UniversalClient) *DB {
	cfg.setDefaults()
	return &DB{rdb: rdb, cfg: cfg}
}

// Config returns the effective configuration.
func (db *DB) Config() Config { return db.cfg }

// Redis returns the underlying client: the packages that own keys of
// their own in the same Redis (billing's, admission's; see README.md) are
// built over it, and health checks and benchmarks use it. Keys the store
// owns are reached only through the store's methods, or handed out by it
// (AdmissionKeys, FinishArgs).
func (db *DB) Redis() redis.UniversalClient { return db.rdb }

// Ping checks that Redis answers.
func (db *DB) Ping(ctx context.Context) error { return db.rdb.Ping(ctx).Err() }

func (db *DB) getJSON(ctx context.Context, key string, v any) error {
	b, err := db.rdb.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return ErrNotFound
	}
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("store: marshal %T: %v", v, err)) // only our own plain structs reach here
	}
	return string(b)
}

// Invalidate announces a change to state that another package caches in
// process (billing's settings and rate cards) on the same channel as
// token, instance and control changes, and waits like they do until every
// gateway confirmed it dropped its caches.
func (db *DB) Invalidate(ctx context.Context) error { return db.publishInvalidate(ctx) }

// invalidateAckTimeout bounds how long a change waits for the gateways to
// confirm that they dropped their auth caches.
const invalidateAckTimeout = 2 * time.Second

// publishInvalidate announces that tokens or instances changed, so every
// gateway drops its auth cache, and waits until every gateway that received
// the announcement has confirmed it (see Subscribe), so that a revocation
// holds on every gateway once the operator's call returns (spec
// §Credential: revocation is immediate). The wait is bounded and best
// effort: the change is already stored, and a gateway that never confirms
// still drops a cached token within its cache's maximum age.
func (db *DB) publishInvalidate(ctx context.Context) error {
	nonce := randomNonce()
	n, err := db.rdb.Publish(ctx, InvalidateChannel, nonce).Result()
	if err != nil || n == 0 {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, invalidateAckTimeout)
	defer cancel()
	for {
		acked, err := db.rdb.SCard(ctx, invalidateAckKey(nonce)).Result()
		if (err == nil && acked >= n) || err != nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Millisecond):
		}
	}
}

// Subscribe calls onReady once the subscription to invalidations is
// confirmed, then fn for every invalidation, until ctx ends. It returns
// when ctx ends or the subscription fails; the caller must treat any cache
// as stale from the moment Subscribe returns.
func (db *DB) Subscribe(ctx context.Context, onReady, fn func()) error {
	sub := db.rdb.Subscribe(ctx, InvalidateChannel)
	defer sub.Close()
	// go-redis does not interrupt a blocked receive when ctx ends; closing
	// the subscription does, so that Subscribe returns as documented.
	defer context.AfterFunc(ctx, func() { sub.Close() })()
	if _, err := sub.Receive(ctx); err != nil {
		return err
	}
	onReady()
	// The subscription's own name in the publisher's count: a set member,
	// not a counter, so that a confirmation sent twice (a resent command,
	// or a PUBLISH resent and received twice) counts once.
	me := randomNonce()
	for {
		msg, err := sub.ReceiveMessage(ctx)
		if err != nil {
			return err
		}
		fn()
		// Confirm to the publisher that this cache is dropped.
		if validNonce(msg.Payload) {
			key := invalidateAckKey(msg.Payload)
			pipe := db.rdb.Pipeline()
			pipe.SAdd(ctx, key, me)
			pipe.Expire(ctx, key, time.Minute)
			_, _ = pipe.Exec(ctx) // unconfirmed, the publisher stops waiting at its timeout
		}
	}
}

// randomNonce is 32 lowercase hex digits, random: an invalidation's
// nonce, or a subscription's name in its confirmations.
func randomNonce() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// validNonce reports whether s is a nonce of publishInvalidate (32
// lowercase hex digits), so that no other message creates a key.
func validNonce(s string) bool {
	if len(s) != 32 {
		return false
	}
	for _, r := range s {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return false
		}
	}
	return true
}

func ms(t time.Time) int64 { return t.UnixMilli() }

func fromMS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMilli(v).UTC()
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
