package broker

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/stripesync"
)

// StripeConfig is the billing.stripe block: the Stripe Billing sync
// (package stripesync). It is opt-in: the sync runs, on every gateway,
// only when the variable secret_key_env names is set. The key itself is
// never in the file. A zero field means stripesync's default, noted
// beside it; each has its SANDGATE_BILLING_STRIPE_* override.
type StripeConfig struct {
	BaseURL        string        `yaml:"base_url"`        // "" means https://api.stripe.com
	SecretKeyEnv   string        `yaml:"secret_key_env"`  // default SANDGATE_STRIPE_SECRET_KEY
	BatchSize      int           `yaml:"batch_size"`      // entries per account per round; default 100
	Interval       time.Duration `yaml:"interval"`        // between passes over the accounts; default 1m
	LeaseTTL       time.Duration `yaml:"lease_ttl"`       // an account's sync lease; default 1m
	RequestTimeout time.Duration `yaml:"request_timeout"` // one call to Stripe; default 20s, below lease_ttl
	MaxAttempts    int           `yaml:"max_attempts"`    // tries of a 429/5xx/network failure per round; default 5
	BaseBackoff    time.Duration `yaml:"base_backoff"`    // first backoff, doubled; default 1s
	MaxBackoff     time.Duration `yaml:"max_backoff"`     // default 1m
	MaxRetryAfter  time.Duration `yaml:"max_retry_after"` // longest Retry-After waited in a round; default 2m
	DeadAfter      int           `yaml:"dead_after"`      // rounds an entry may fail with a 4xx before it is dead-lettered; default 3
}

// syncConfig is the block as stripesync's Config.
func (c StripeConfig) syncConfig() stripesync.Config {
	return stripesync.Config{BaseURL: c.BaseURL, SecretKeyEnv: c.SecretKeyEnv, BatchSize: c.BatchSize, Interval: c.Interval,
		LeaseTTL: c.LeaseTTL, RequestTimeout: c.RequestTimeout, MaxAttempts: c.MaxAttempts, BaseBackoff: c.BaseBackoff,
		MaxBackoff: c.MaxBackoff, MaxRetryAfter: c.MaxRetryAfter, DeadAfter: c.DeadAfter}
}

// keyEnv is the variable the secret key is read from.
func (c StripeConfig) keyEnv() string {
	if c.SecretKeyEnv != "" {
		return c.SecretKeyEnv
	}
	return stripesync.DefaultSecretKeyEnv
}

// newStripe builds the Stripe sync of c when its key's variable is set;
// nil, nil when it is not (the sync is opt-in). The key never leaves
// stripesync, and neither the log nor an error holds it.
func newStripe(c StripeConfig, rdb redis.UniversalClient, getenv func(string) string, meter metric.Meter,
	clock sandgate.Clock, log *slog.Logger) (*stripesync.Syncer, error) {
	if getenv(c.keyEnv()) == "" {
		log.Info("stripe sync off: no secret key", slog.String("env", c.keyEnv()))
		return nil, nil
	}
	s, err := stripesync.New(c.syncConfig(), stripesync.Deps{Redis: rdb, Getenv: getenv, Logger: log.With("component", "stripesync"),
		Meter: meter, Clock: clock})
	if err != nil {
		return nil, fmt.Errorf("config: billing.stripe: %w", err)
	}
	log.Info("stripe sync on", slog.String("env", c.keyEnv()), slog.Bool("default_base_url", c.BaseURL == ""))
	return s, nil
}

// check validates the block, naming its YAML path; a request_timeout at
// or past the lease_ttl is refused with the defaults filled in.
func (c StripeConfig) check() error {
	sc := c.syncConfig()
	if sc.LeaseTTL == 0 {
		sc.LeaseTTL = time.Minute
	}
	if sc.RequestTimeout == 0 {
		sc.RequestTimeout = 20 * time.Second
	}
	if err := sc.Validate(); err != nil {
		return fmt.Errorf("config: billing.stripe: %s", strings.TrimPrefix(err.Error(), "stripesync: "))
	}
	if strings.HasPrefix(c.SecretKeyEnv, "sk_") || strings.HasPrefix(c.SecretKeyEnv, "rk_") {
		// A key pasted where its variable's name goes must not end up in
		// the error, the log or the file's reader's eyes once more.
		return fmt.Errorf("config: billing.stripe.secret_key_env names the environment variable holding the key, not the key")
	}
	return nil
}
