// Package tick runs a piece of work on a fixed period until its context
// ends: the broker's background loops (the reaper and its lease, health
// checks, egress bookkeeping, keepalives) share one ticker loop.
package tick

import (
	"context"
	"time"
)

// Every calls f every d until ctx ends or f returns false; the first call
// comes d after Every is called.
func Every(ctx context.Context, d time.Duration, f func() bool) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !f() {
			return
		}
	}
}

// NowAndEvery calls f at once and then every d, until ctx ends.
func NowAndEvery(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		f()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sleep waits d, or until ctx ends: nil when d passed, the context's
// cause when it ended first. A d of 0 or less only reports whether ctx
// has ended.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return context.Cause(ctx)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
