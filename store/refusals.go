package store

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Refusals by protocol code, counted in time buckets so that any process
// can read them back over a window: the gateway adds what it refused
// (CountRefusals), the operator API reads the sums (RefusalCounts). Each
// bucket is a HASH code → count, kept a little longer than the longest
// window it serves.

// Bucket widths and how long their keys live.
const (
	refusalMinute    = time.Minute
	refusalHour      = time.Hour
	refusalMinuteTTL = 2 * time.Hour
	refusalHourTTL   = 8 * 24 * time.Hour
)

// bucket returns the key of the bucket of width w starting at start,
// broker wide (acct "") or of one account (hours only).
func bucket(acct string, w time.Duration, start int64) string {
	if acct != "" {
		return accountRefusalsKey(acct, start)
	}
	if w == refusalMinute {
		return refusalsKey("m", start)
	}
	return refusalsKey("h", start)
}

// Refusal is one refused request to count: its protocol code, when it
// was answered, and the account of its token ("" when it had none).
type Refusal struct {
	Code    string
	At      time.Time
	Account string
}

// CountRefusals adds rs to their buckets: the broker's minute and hour
// buckets, and the hour bucket of each refusal's account.
func (db *DB) CountRefusals(ctx context.Context, rs []Refusal) error {
	type cell struct {
		key  string
		code string
		ttl  time.Duration
	}
	n := map[cell]int64{}
	for _, r := range rs {
		m, h := r.At.Truncate(refusalMinute).Unix(), r.At.Truncate(refusalHour).Unix()
		n[cell{bucket("", refusalMinute, m), r.Code, refusalMinuteTTL}]++
		n[cell{bucket("", refusalHour, h), r.Code, refusalHourTTL}]++
		if r.Account != "" {
			n[cell{bucket(r.Account, refusalHour, h), r.Code, refusalHourTTL}]++
		}
	}
	if len(n) == 0 {
		return nil
	}
	// One command per key at a time: keys of different accounts lie in
	// different cluster slots, and the pipeline is not a transaction.
	_, err := db.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for c, v := range n {
			p.HIncrBy(ctx, c.key, c.code, v)
			p.Expire(ctx, c.key, c.ttl)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: count refusals: %w", err)
	}
	return nil
}

// RefusalCounts returns the refusals by code of the buckets that cover
// the window ending at now (of acct, or broker wide when acct is ""), and
// the start of the oldest bucket read. A window of up to an hour is read
// in minutes, a longer one in whole hours (so it begins at the start of
// its first hour). An account's refusals are kept in hours only.
func (db *DB) RefusalCounts(ctx context.Context, acct string, window time.Duration, now time.Time) (map[string]int64, time.Time, error) {
	w := refusalHour
	if window <= time.Hour && acct == "" {
		w = refusalMinute
	}
	first := now.Add(-window).Truncate(w)
	if acct == "" && w == refusalMinute {
		first = now.Add(-window + w).Truncate(w) // the current minute is the window's last
	}
	var cmds []*redis.MapStringStringCmd
	_, err := db.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for t := first; !t.After(now); t = t.Add(w) {
			cmds = append(cmds, p.HGetAll(ctx, bucket(acct, w, t.Unix())))
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return nil, time.Time{}, fmt.Errorf("store: read refusals: %w", err)
	}
	out := map[string]int64{}
	for _, c := range cmds {
		for code, v := range c.Val() {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				continue
			}
			out[code] += n
		}
	}
	maps.DeleteFunc(out, func(_ string, n int64) bool { return n <= 0 })
	return out, first, nil
}
