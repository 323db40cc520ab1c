package stripesync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/tick"
)

// DefaultSecretKeyEnv is the environment variable the Stripe secret key is
// read from when [Config.SecretKeyEnv] is empty.
const DefaultSecretKeyEnv = "SANDGATE_STRIPE_SECRET_KEY"

// Config tunes a [Syncer]. A zero field means the default noted beside it;
// [Config.Validate] only checks, and New fills the defaults first.
type Config struct {
	// BaseURL is Stripe's API base URL; "" means Stripe's own
	// (https://api.stripe.com). Tests point it at stripe-mock.
	BaseURL string
	// SecretKeyEnv names the environment variable holding the secret key;
	// "" means DefaultSecretKeyEnv. The key itself never sits in config.
	SecretKeyEnv string
	// BatchSize is how many ledger entries one round sends at most per
	// account; 0 means 100.
	BatchSize int
	// Interval is the pause of [Syncer.Run] between rounds; 0 means 1 min.
	Interval time.Duration
	// LeaseTTL is how long an account's lease lasts unless renewed (each
	// send renews it); 0 means 1 min. It must exceed RequestTimeout, so a
	// slow answer does not let another gateway take the account mid-send.
	LeaseTTL time.Duration
	// MaxAttempts is how many times one round tries a send that failed
	// with a 429, a 5xx or a network error; 0 means 5. The round then
	// stops, and the next one starts again from the same entry.
	MaxAttempts int
	// BaseBackoff is the wait after the first retryable failure, doubled
	// after each; 0 means 1 s. A Retry-After header longer than the
	// backoff is honoured instead.
	BaseBackoff time.Duration
	// MaxBackoff caps the doubled backoff (not a Retry-After); 0 means 1 min.
	MaxBackoff time.Duration
	// MaxRetryAfter is the longest Retry-After waited for inside a round;
	// a longer one ends the round (the next round is after Interval).
	// 0 means 2 min.
	MaxRetryAfter time.Duration
	// DeadAfter is how many rounds an entry may fail with a non-retryable
	// error (a 4xx other than 401, 403 and 429) before it is put on the
	// dead-letter list and the cursor moves past it; 0 means 3.
	DeadAfter int
	// RequestTimeout bounds one call to Stripe; 0 means 20 s.
	RequestTimeout time.Duration
}

// Deps are what a [Syncer] is lent by its host.
type Deps struct {
	// Redis holds the settings, cursors, leases and the usage ledger. Required.
	Redis redis.UniversalClient
	// Getenv reads the secret key's variable; nil means os.Getenv.
	Getenv func(string) string
	// Logger gets background failures; nil means none. It never receives
	// the secret key.
	Logger *slog.Logger
	// Meter makes the metrics (see [Syncer]); nil means no metrics.
	Meter metric.Meter
	// Clock tells the time; nil means sandgate.SystemClock.
	Clock sandgate.Clock
	// Sleep waits d or until ctx ends (returning its error); nil means a
	// timer. Tests replace it to see each backoff without waiting.
	Sleep func(ctx context.Context, d time.Duration) error
	// HTTPClient sends the requests to Stripe; nil means a client of its own.
	HTTPClient *http.Client
	// Owner names this process in leases; "" means a random id.
	Owner string
}

func (c *Config) setDefaults() {
	if c.SecretKeyEnv == "" {
		c.SecretKeyEnv = DefaultSecretKeyEnv
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	defInt := func(n *int, v int) {
		if *n == 0 {
			*n = v
		}
	}
	defInt(&c.BatchSize, 100)
	defInt(&c.MaxAttempts, 5)
	defInt(&c.DeadAfter, 3)
	def(&c.Interval, time.Minute)
	def(&c.LeaseTTL, time.Minute)
	def(&c.BaseBackoff, time.Second)
	def(&c.MaxBackoff, time.Minute)
	def(&c.MaxRetryAfter, 2*time.Minute)
	def(&c.RequestTimeout, 20*time.Second)
}

// Validate reports the first field out of range.
func (c Config) Validate() error {
	if c.BaseURL != "" {
		u, err := url.Parse(c.BaseURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return errors.New("stripesync: base_url must be an http(s) URL")
		}
	}
	switch {
	case c.BatchSize < 0 || c.BatchSize > 10000:
		return errors.New("stripesync: batch_size must be in 1..10000")
	case c.MaxAttempts < 0, c.DeadAfter < 0:
		return errors.New("stripesync: max_attempts and dead_after must not be negative")
	case c.Interval < 0, c.LeaseTTL < 0, c.BaseBackoff < 0, c.MaxBackoff < 0, c.MaxRetryAfter < 0, c.RequestTimeout < 0:
		return errors.New("stripesync: durations must not be negative")
	}
	if c.LeaseTTL != 0 && c.RequestTimeout >= c.LeaseTTL {
		return fmt.Errorf("stripesync: request_timeout (%s) must be shorter than lease_ttl (%s)", c.RequestTimeout, c.LeaseTTL)
	}
	return nil
}

func (d *Deps) setDefaults() {
	if d.Getenv == nil {
		d.Getenv = os.Getenv
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Clock == nil {
		d.Clock = sandgate.SystemClock{}
	}
	if d.Sleep == nil {
		d.Sleep = tick.Sleep
	}
}
