package billing

import (
	"log/slog"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/store"
)

// Config configures Billing. A zero field means the default noted beside it.
type Config struct {
	// Provider names the sandbox provider on usage entries of workspaces
	// whose record names none (written before providers had names). ""
	// means "local".
	Provider string
	// Webhook also sends every budget alert to a URL; zero sends none.
	Webhook WebhookConfig
	// Meter records MetricSettled. nil means no metrics are recorded.
	Meter metric.Meter
	// PoolRateCard names the rate card that prices the warm pools' time
	// (PoolUsage); "" leaves it unpriced.
	PoolRateCard string
}

// Deps are what Billing works with.
type Deps struct {
	DB *store.DB
	// Log receives settlement failures. nil discards.
	Log *slog.Logger
	// Clock dates what billing decides by itself: a funds entry given no
	// time, and Run's accrual. nil means sandgate.SystemClock. Webhook
	// deliveries keep the wall clock: their signature's time is checked
	// against the receiver's clock, and their retries are timers.
	Clock sandgate.Clock
}

// Billing prices, holds, settles and reconciles. It is safe for
// concurrent use. Create it with New.
type Billing struct {
	db     *store.DB
	rdb    redis.UniversalClient
	ledger *Ledger
	prices *PriceCache
	cfg    Config
	log    *slog.Logger
	clock  sandgate.Clock
	// settled records MetricSettled; nil without a Meter.
	settled metric.Int64Counter
}

// New returns Billing over the store's Redis.
func New(cfg Config, d Deps) *Billing {
	if cfg.Provider == "" {
		cfg.Provider = "local"
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Clock == nil {
		d.Clock = sandgate.SystemClock{}
	}
	if cfg.Webhook.URL != "" {
		cfg.Webhook = cfg.Webhook.withDefaults()
	}
	db := d.DB
	b := &Billing{db: db, rdb: db.Redis(), ledger: NewLedger(db.Redis()), prices: &PriceCache{}, cfg: cfg, log: d.Log, clock: d.Clock}
	if cfg.Meter != nil {
		var err error
		if b.settled, err = cfg.Meter.Int64Counter(MetricSettled, metric.WithUnit("{micro_unit}"),
			metric.WithDescription("Money charged by accrual and settlement, in micro-units, by currency.")); err != nil {
			b.log.Warn("billing metric not registered", slog.String("metric", MetricSettled), slog.Any("err", err))
		}
	}
	return b
}

// MetricSettled counts the money charged to accounts (accrued while a
// workspace runs and settled at its end), in micro-units, by currency: its
// one attribute, so the label set stays bounded.
const MetricSettled = "sandgate.billing.settled_micros"

// Ledger returns the usage ledger reader.
func (b *Billing) Ledger() *Ledger { return b.ledger }
