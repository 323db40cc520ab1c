package gateway

import (
	"context"
	"log/slog"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/store"
)

// Refusals are counted in Redis (store.CountRefusals) so that the
// operator console reads them by code over a window, whichever gateway
// process refused them and whenever. A request never waits for the count:
// observe queues the refusal without blocking, and Run writes the queue in
// batches. A refusal that finds the queue full, or whose batch cannot be
// written, goes uncounted (and is logged); the access log still has it.

// refusalQueue bounds the refusals waiting to be written.
const refusalQueue = 4096

// refusalBatch bounds the refusals written in one round trip.
const refusalBatch = 512

// queueRefusal queues one refused request for counting; it never blocks.
func (s *Server) queueRefusal(c *reqContext, code string, at time.Time) {
	r := store.Refusal{Code: code, At: at}
	if a := c.auth; a != nil {
		r.Account = a.Lease.AccountID
	}
	select {
	case s.refusals <- r:
	default:
		s.log.Warn("refusal not counted: queue full", slog.String(sandgate.KeyCode, code))
	}
}

// countRefusals writes queued refusals until ctx ends, then what is
// still queued.
func (s *Server) countRefusals(ctx context.Context) {
	batch := make([]store.Refusal, 0, refusalBatch)
	write := func() {
		for more := true; more && len(batch) < refusalBatch; {
			select {
			case r := <-s.refusals:
				batch = append(batch, r)
			default:
				more = false
			}
		}
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := s.saga.CountRefusals(wctx, batch); err != nil {
			s.log.Warn("refusals not counted", slog.Int("refusals", len(batch)), slog.Any(sandgate.KeyError, err))
		}
		batch = batch[:0]
	}
	for {
		select {
		case <-ctx.Done():
			for len(s.refusals) > 0 {
				write()
			}
			return
		case r := <-s.refusals:
			batch = append(batch, r)
			write()
		}
	}
}
