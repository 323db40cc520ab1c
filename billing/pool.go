package billing

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
)

// The warm pools' cost (providers.PoolConfig): the time each pooled
// sandbox existed unclaimed, which is the operator's and billed to no
// tenant (a tenant's metering starts when its create takes the sandbox).
// Every broker process records its pools' time in one hash per UTC day,
// by hour, provider, size and image, so the record is shared by every
// broker on the store and outlives them; usage summaries show it as
// their own lines, priced at the rate card Config.PoolRateCard names.
// The key is poolKey (keys.go).

// PoolRetention is how long the pools' recorded time is kept after its
// day: as long as the monthly spending counters and the audit log, so a
// year of summaries is complete.
const PoolRetention = 400 * 24 * time.Hour

// PoolTotal is a running total of warm time: a provider's pooled
// sandboxes of one size and image, since the provider was opened
// (providers.PoolReady.Warm).
type PoolTotal struct {
	Provider, Size, Image string
	Warm                  time.Duration
}

// poolID is one provider, size and image.
type poolID struct{ provider, size, image string }

// poolBucket is one poolID in one UTC hour.
type poolBucket struct {
	poolID
	hour time.Time
}

// PoolMeter writes one broker process's pool time to the store. It turns
// running totals into increments, each filed under the UTC hour of the
// Record that saw it: what grew between two Records falls in the later
// one's hour. Its methods are safe for concurrent use.
type PoolMeter struct {
	rdb redis.UniversalClient

	mu   sync.Mutex
	seen map[poolID]int64     // whole milliseconds of each total already counted
	owed map[poolBucket]int64 // counted, not yet written (a failed write)
}

// PoolMeter returns a meter for this process's pools, with nothing
// counted: the totals it is given start when the providers opened.
func (b *Billing) PoolMeter() *PoolMeter {
	return &PoolMeter{rdb: b.rdb, seen: map[poolID]int64{}, owed: map[poolBucket]int64{}}
}

// Record counts what totals grew by since the last Record and writes it,
// with whatever an earlier failed write left, to the hour of now. A total
// that went down (the clock stepped back) counts nothing until it passes
// its highest value again. On error the increments are kept for the next
// Record; a write whose reply was lost may then be counted twice (at most
// one period's growth).
func (m *PoolMeter) Record(ctx context.Context, now time.Time, totals []PoolTotal) error {
	hour := now.UTC().Truncate(time.Hour)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, t := range totals {
		id := poolID{t.Provider, t.Size, t.Image}
		ms := t.Warm.Milliseconds()
		if d := ms - m.seen[id]; d > 0 {
			m.owed[poolBucket{id, hour}] += d
			m.seen[id] = ms
		}
	}
	if len(m.owed) == 0 {
		return nil
	}
	pipe := m.rdb.TxPipeline()
	days := map[time.Time]bool{}
	for b, ms := range m.owed {
		day := b.hour.Truncate(24 * time.Hour)
		pipe.HIncrBy(ctx, poolKey(day.Format("20060102")), poolField(b), ms)
		days[day] = true
	}
	for day := range days {
		pipe.PExpireAt(ctx, poolKey(day.Format("20060102")), day.Add(24*time.Hour+PoolRetention))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("record pool time: %w", err)
	}
	clear(m.owed)
	return nil
}

func poolField(b poolBucket) string {
	return fmt.Sprintf("%02d|%s|%s|%s", b.hour.Hour(), b.provider, b.size, b.image)
}

// PoolLine is the warm pools' time of one provider, size and image over
// a range, and its price.
type PoolLine struct {
	Provider, Size, Image string
	// Seconds is the warm time, summed in milliseconds and rounded up to
	// whole seconds.
	Seconds int64
	// RateCard and Currency are the card that priced the line; both ""
	// when no pool rate card is configured (or it does not exist), and
	// AmountMicros is then 0.
	RateCard string
	Currency string
	// AmountMicros is the warm time priced at the size's rate of the card
	// version in force at each hour's start (its first version for hours
	// before it), rounded up to a whole micro-unit.
	AmountMicros int64
}

// PoolUsage returns the pools' lines of the whole UTC hours that start in
// [from, to), one per provider, size and image, sorted; size "" means
// every size. Hours past PoolRetention have no record.
func (b *Billing) PoolUsage(ctx context.Context, from, to time.Time, size string) ([]PoolLine, error) {
	now := b.clock.Now().UTC()
	from, to = from.UTC(), to.UTC()
	if oldest := now.Add(-PoolRetention - 24*time.Hour); from.Before(oldest) {
		from = oldest
	}
	if latest := now.Add(24 * time.Hour); to.After(latest) {
		to = latest
	}
	var days []time.Time
	for d := from.Truncate(24 * time.Hour); d.Before(to); d = d.Add(24 * time.Hour) {
		days = append(days, d)
	}
	if len(days) == 0 {
		return []PoolLine{}, nil
	}
	pipe := b.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(days))
	for i, d := range days {
		cmds[i] = pipe.HGetAll(ctx, poolKey(d.Format("20060102")))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("read pool time: %w", err)
	}
	card, versions := b.poolCard(ctx)
	type acc struct{ ms, priced int64 } // priced: Σ unit × ms, in micro-units × 1000
	sums := map[poolID]*acc{}
	for i, d := range days {
		for field, v := range cmds[i].Val() {
			parts := strings.SplitN(field, "|", 4)
			if len(parts) != 4 {
				continue
			}
			h, err1 := strconv.Atoi(parts[0])
			ms, err2 := strconv.ParseInt(v, 10, 64)
			hour := d.Add(time.Duration(h) * time.Hour)
			if err1 != nil || err2 != nil || hour.Before(from) || !hour.Before(to) || (size != "" && parts[2] != size) {
				continue
			}
			id := poolID{parts[1], parts[2], parts[3]}
			a := sums[id]
			if a == nil {
				a = &acc{}
				sums[id] = a
			}
			a.ms += ms
			if unit := inForce(versions, hour).Prices[id.size]; unit > 0 {
				p, err := Amount(unit, ms)
				if err == nil && a.priced > math.MaxInt64-p {
					err = ErrOverflow
				}
				if err != nil {
					return nil, fmt.Errorf("price pool time: %w", err)
				}
				a.priced += p
			}
		}
	}
	lines := make([]PoolLine, 0, len(sums))
	for id, a := range sums {
		l := PoolLine{Provider: id.provider, Size: id.size, Image: id.image, Seconds: (a.ms + 999) / 1000}
		if card != "" {
			l.RateCard, l.Currency, l.AmountMicros = card, versions[0].Currency, a.priced/1000
			if a.priced%1000 != 0 {
				l.AmountMicros++ // up, without a sum that could pass MaxInt64
			}
		}
		lines = append(lines, l)
	}
	slices.SortFunc(lines, func(x, y PoolLine) int {
		return cmp.Or(cmp.Compare(x.Provider, y.Provider), cmp.Compare(x.Size, y.Size), cmp.Compare(x.Image, y.Image))
	})
	return lines, nil
}

// poolCard returns the pool rate card's name and every version of it,
// oldest first; "" and none when no card is configured, or it is missing
// or has no currency (logged: the lines then go unpriced).
func (b *Billing) poolCard(ctx context.Context) (string, []RateCard) {
	name := b.cfg.PoolRateCard
	if name == "" {
		return "", nil
	}
	m, err := b.rdb.HGetAll(ctx, rateCardKey(name)).Result()
	var vs []RateCard
	for f, raw := range m {
		v, err := strconv.Atoi(f)
		if err != nil {
			continue // latest, latest_create, currency
		}
		var c RateCard
		if json.Unmarshal([]byte(raw), &c) == nil {
			c.Version, c.Currency = v, m["currency"]
			vs = append(vs, c)
		}
	}
	if err != nil || len(vs) == 0 || m["currency"] == "" {
		b.log.Warn("the pool rate card cannot price the warm pools; their lines go unpriced",
			slog.String("rate_card", name), slog.Any(sandgate.KeyError, err))
		return "", nil
	}
	slices.SortFunc(vs, func(x, y RateCard) int { return cmp.Compare(x.Version, y.Version) })
	return name, vs
}

// inForce returns the newest of versions (oldest first) created at or
// before t, or the oldest when none was; the zero card when there are
// none.
func inForce(versions []RateCard, t time.Time) RateCard {
	var c RateCard
	for i, v := range versions {
		if i == 0 || !v.CreatedAt.After(t) {
			c = v
		}
	}
	return c
}
