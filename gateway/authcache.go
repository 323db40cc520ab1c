package gateway

import (
	"context"
	"log/slog"
	"time"

	"github.com/sandgate/sandgate/store"
)

// subscribe keeps the invalidation subscription up until ctx ends,
// resubscribing after a failure. While it is down, the caches are bypassed.
func subscribe(ctx context.Context, db *store.DB, log *slog.Logger, caches ...Cache) {
	setLive := func(live bool) {
		for _, c := range caches {
			c.SetLive(live)
		}
	}
	invalidate := func() {
		for _, c := range caches {
			c.Invalidate()
		}
	}
	for ctx.Err() == nil {
		err := db.Subscribe(ctx, func() { setLive(true) }, invalidate)
		setLive(false)
		if ctx.Err() != nil {
			return
		}
		log.Warn("cache invalidation subscription lost; bypassing caches", slog.Any("err", err))
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
