package billing

import (
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate/store"
)

// Config configures Billing. A zero field means the default noted beside it.
type Config struct {
	// Provider names the sandbox provider on usage entries of workspaces
	// whose record names none (written before providers had names). ""
	// means "local".
	Provider string
	// Log receives settlement failures. nil discards.
	Log *slog.Logger
	// Webhook also sends every budget alert to a URL; zero sends none.
	Webhook WebhookConfig
}

// Billing prices, holds, settles and reconciles. It is safe for
// concurrent use. Create it with New.
type Billing struct {
	db     *store.DB
	rdb    redis.UniversalClient
	ledger *Ledger
	cfg    Config
}

// New returns Billing over the store's Redis.
func New(db *store.DB, cfg Config) *Billing {
	if cfg.Provider == "" {
		cfg.Provider = "local"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Webhook.URL != "" {
		cfg.Webhook = cfg.Webhook.withDefaults()
	}
	return &Billing{db: db, rdb: db.Redis(), ledger: NewLedger(db.Redis()), cfg: cfg}
}

// Ledger returns the usage ledger reader.
func (b *Billing) Ledger() *Ledger { return b.ledger }
