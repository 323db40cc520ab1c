package broker

import (
	"context"
	"log/slog"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/tick"
	"github.com/sandgate/sandgate/providers"
)

// PoolRecordInterval is how often a running broker writes its warm
// pools' time to Redis: a broker killed without Close loses at most this
// much of each warm sandbox's time, and a take shows in usage summaries
// within it.
const PoolRecordInterval = 30 * time.Second

// recordPools runs RecordPool every PoolRecordInterval until ctx ends.
func (b *Broker) recordPools(ctx context.Context) {
	tick.Every(ctx, PoolRecordInterval, func() bool {
		rctx, cancel := context.WithTimeout(ctx, egressKeepTimeout)
		defer cancel()
		if err := b.RecordPool(rctx); err != nil {
			b.log.Warn("warm pools' time not recorded; kept for the next try", slog.Any(sandgate.KeyError, err))
		}
		return true
	})
}

// RecordPool writes to Redis what this broker's warm pools' time grew by
// since the last call (billing.PoolMeter): Run calls it every
// PoolRecordInterval and Close once more, after the providers closed
// their pools.
func (b *Broker) RecordPool(ctx context.Context) error {
	var totals []billing.PoolTotal
	for _, e := range b.rawProvs.All() {
		p, ok := e.Provider.(providers.Pooler)
		if !ok {
			continue
		}
		for _, r := range p.PoolStats().Ready {
			totals = append(totals, billing.PoolTotal{Provider: e.Name, Size: r.Size, Image: r.Image, Warm: r.Warm})
		}
	}
	return b.poolMeter.Record(ctx, b.clock.Now(), totals)
}
