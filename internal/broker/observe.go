package broker

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/telemetry"
)

// observability is the process's tracing and metrics, built once by New.
type observability struct {
	tracing *telemetry.Tracing
	mp      *sdkmetric.MeterProvider
	meter   metric.Meter
	metrics http.Handler // GET /metrics
	log     *slog.Logger
}

// newObservability builds tracing from the OTEL_* variables (off when none
// is set), the Prometheus metrics of /metrics, and the span of every
// Redis call of rdb.
func newObservability(ctx context.Context, cfg *Config, rdb redis.UniversalClient, getenv func(string) string, version string, log *slog.Logger) (*observability, error) {
	tr, err := telemetry.NewTracing(ctx, getenv, version, cfg.BrokerID)
	if err != nil {
		return nil, err
	}
	mp, h, err := newMetrics(cfg.BrokerID)
	if err != nil {
		_ = tr.Shutdown(ctx)
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if tr.Enabled {
		rdb.AddHook(telemetry.RedisHook(tr.Provider))
		log.Info("tracing on", slog.String("exporter", tr.Exporter))
	}
	return &observability{tracing: tr, mp: mp, meter: mp.Meter(telemetry.ScopeName), metrics: h, log: log}, nil
}

// transport wraps a vendor client's HTTP transport with tracing
// (providers.Env.Transport).
func (o *observability) transport(base http.RoundTripper) http.RoundTripper {
	if !o.tracing.Enabled {
		return base
	}
	return telemetry.Transport(o.tracing.Provider, base)
}

// shutdown flushes the spans still buffered and stops the exporters.
func (o *observability) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := o.tracing.Shutdown(ctx); err != nil {
		o.log.Warn("spans not flushed", slog.Any(sandgate.KeyError, err))
	}
	_ = o.mp.Shutdown(ctx)
}
