package broker

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate/internal/tick"
	"github.com/sandgate/sandgate/providers"
)

// Health checking bounds.
const (
	// providerCheckEvery is the time between two checks of the providers
	// that accept new work.
	providerCheckEvery = 15 * time.Second
	// providerCheckTimeout bounds one provider's check.
	providerCheckTimeout = 10 * time.Second
	// redisCheckTimeout bounds the PING of one Readiness answer.
	redisCheckTimeout = time.Second
)

// health answers /livez and /readyz. Ready means Redis answers a PING,
// the process is not draining, and every provider that accepts new work
// passed its last check. It is safe for concurrent use.
type health struct {
	rdb      redis.UniversalClient
	provs    *providers.Set
	draining atomic.Bool

	mu     sync.Mutex
	failed map[string]bool // provider name → its last check failed or has not run
}

func newHealth(rdb redis.UniversalClient, provs *providers.Set) *health {
	h := &health{rdb: rdb, provs: provs, failed: map[string]bool{}}
	for _, e := range provs.All() {
		if e.AcceptNew {
			h.failed[e.Name] = true // not ready until its first check passes
		}
	}
	return h
}

// run checks the providers now and every providerCheckEvery until ctx ends.
func (h *health) run(ctx context.Context) {
	tick.NowAndEvery(ctx, providerCheckEvery, func() { h.checkProviders(ctx) })
}

func (h *health) checkProviders(ctx context.Context) {
	for _, e := range h.provs.All() {
		if !e.AcceptNew {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, providerCheckTimeout)
		var err error
		if c, ok := e.Provider.(providers.Checker); ok {
			err = c.Check(cctx)
		} else {
			_, err = e.Provider.List(cctx)
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		h.mu.Lock()
		h.failed[e.Name] = err != nil
		h.mu.Unlock()
	}
}

// drain makes the process not ready, the first step of a graceful
// shutdown.
func (h *health) drain() { h.draining.Store(true) }

// failing returns what keeps the process from being ready: "draining",
// "redis", "provider <name>"; none means ready.
func (h *health) failing(ctx context.Context) []string {
	out := []string{}
	if h.draining.Load() {
		out = append(out, "draining")
	}
	cctx, cancel := context.WithTimeout(ctx, redisCheckTimeout)
	defer cancel()
	if err := h.rdb.Ping(cctx).Err(); err != nil {
		out = append(out, "redis")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range h.provs.Names() {
		if h.failed[n] {
			out = append(out, "provider "+n)
		}
	}
	return out
}

// MetricReady is 1 while the process is ready (as /readyz answers 200)
// and 0 otherwise, read at every collection.
const MetricReady = "sandgate.ready"

// observe reports MetricReady through m at every collection.
func (h *health) observe(m metric.Meter) error {
	_, err := m.Int64ObservableGauge(MetricReady,
		metric.WithDescription("1 while the broker is ready (its /readyz answers 200), 0 otherwise."),
		metric.WithInt64Callback(func(ctx context.Context, o metric.Int64Observer) error {
			var v int64
			if len(h.failing(ctx)) == 0 {
				v = 1
			}
			o.Observe(v)
			return nil
		}))
	return err
}

// Readiness is the body of the operator listener's /readyz.
type Readiness struct {
	Ready   bool     `json:"ready"`
	Failing []string `json:"failing"`
}

// livez answers 200 while the process serves HTTP at all.
func livez(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

// readyz answers 200 when ready and 503 otherwise, naming what is failing.
func (h *health) readyz(w http.ResponseWriter, r *http.Request) {
	f := h.failing(r.Context())
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Type", "application/json")
	if len(f) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(Readiness{Ready: len(f) == 0, Failing: f})
}

// publicReadyz is /readyz of the public listener: no authentication and
// no details, for a load balancer.
func (h *health) publicReadyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if len(h.failing(r.Context())) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("unavailable\n"))
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

// withHealth serves GET /livez and GET /readyz (without details) on the
// public listener, and everything else with next, untouched (no mux: it
// would clean and redirect the paths the gateway answers itself).
func withHealth(next http.Handler, h *health) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			switch r.URL.Path {
			case "/livez":
				livez(w, r)
				return
			case "/readyz":
				h.publicReadyz(w, r)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
