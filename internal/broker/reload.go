package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate"
)

// MetricConfigReloads counts the broker's configuration reloads (SIGHUP),
// by result: ok, or failed (something did not load, and what was in
// force before it stays).
const MetricConfigReloads = "sandgate.config.reloads"

// reloads records MetricConfigReloads.
type reloads struct{ count metric.Int64Counter }

func newReloads(m metric.Meter) (reloads, error) {
	c, err := m.Int64Counter(MetricConfigReloads,
		metric.WithDescription("Configuration reloads (SIGHUP) by result: ok, or failed (the previous certificate and operator tokens stay)."))
	if err != nil {
		return reloads{}, err
	}
	// Both series exist from the start, so that an alert on failures sees
	// the first one as an increase.
	for _, r := range []string{"ok", "failed"} {
		c.Add(context.Background(), 0, metric.WithAttributes(attribute.String("result", r)))
	}
	return reloads{count: c}, nil
}

// Reload reads the configuration with load (the config file again, its
// environment overrides applied) and applies what of it can change while
// the broker serves: the
// public listener's TLS certificate and key (read again from their
// files, which may have been renewed in place), and the operator tokens
// (the operators: entries, their token_env variables read again through
// Options.Getenv). Connections stay open: those open keep the
// certificate of their handshake, and a request already authenticated
// finishes as it began. Each part that does not load keeps what was in
// force before it, and Reload returns why; a configuration that does not
// load changes nothing. Every other setting takes a restart.
func (b *Broker) Reload(ctx context.Context, load func() (*Config, error)) error {
	cfg, err := load()
	if err != nil {
		return b.reloaded(ctx, fmt.Errorf("the configuration does not load, nothing changed: %w", err))
	}
	var errs []error
	if b.certs != nil {
		if err := b.certs.Reload(cfg.TLS.CertFile, cfg.TLS.KeyFile); err != nil {
			errs = append(errs, fmt.Errorf("certificate not reloaded, the previous one stays: %w", err))
		}
	}
	if ops, err := cfg.OperatorTokens(b.getenv); err != nil {
		errs = append(errs, fmt.Errorf("operator tokens not reloaded, the previous ones stay: %w", err))
	} else {
		b.adm.SetTokens(ops)
	}
	return b.reloaded(ctx, errors.Join(errs...))
}

// reloaded logs and counts the end of a reload, err its failure, and
// returns err.
func (b *Broker) reloaded(ctx context.Context, err error) error {
	result := "ok"
	if err != nil {
		result = "failed"
		b.log.Error("configuration reload failed", slog.Any(sandgate.KeyError, err))
	} else {
		b.log.Info("configuration reloaded", slog.Bool("certificate", b.certs != nil))
	}
	b.reloads.count.Add(ctx, 1, metric.WithAttributes(attribute.String("result", result)))
	return err
}
