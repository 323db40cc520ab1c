package billing_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/store"
)

// resendScripts sends every script call twice and answers the second
// reply, as go-redis does when the first reply was lost (a read timeout,
// a reset connection) after Redis ran it.
func resendScripts(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
	if err := next(ctx, cmd); err != nil {
		return err
	}
	return next(ctx, cmd)
}

// TestCreateRateCardSentTwice: a create whose script is sent twice
// answers the version it made, and the card has no copy of it; the next
// create, of the same prices or others, adds a version.
func TestCreateRateCardSentTwice(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client()
	rdb.AddHook(redistest.ScriptHook(resendScripts))
	bill := billing.New(billing.Config{}, billing.Deps{DB: store.New(store.Config{}, rdb)})
	ctx := context.Background()
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	prices := map[string]int64{}
	for _, s := range sandgate.StandardSizes {
		prices[s.Name] = 7
	}
	create := func(label string, p map[string]int64) int {
		t.Helper()
		c, err := bill.CreateRateCard(ctx, "twice", "USD", p, now)
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		return c.Version
	}
	if v := create("create", prices); v != 1 {
		t.Errorf("a create sent twice: version %d; want 1", v)
	}
	if c, err := bill.RateCard(ctx, "twice", 0); err != nil || c.Version != 1 {
		t.Errorf("newest version after one create sent twice = %d, %v; want 1", c.Version, err)
	}
	if v := create("the same prices again", prices); v != 2 {
		t.Errorf("the same prices created again: version %d; want 2", v)
	}
	other := map[string]int64{}
	for k, p := range prices {
		other[k] = p + 1
	}
	if v := create("other prices", other); v != 3 {
		t.Errorf("other prices: version %d; want 3", v)
	}
	cards, err := bill.RateCards(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cards) != 1 || cards[0].Name != "twice" || cards[0].Version != 3 || cards[0].Prices["small"] != 8 {
		t.Errorf("rate cards = %+v; want twice at version 3, small at 8", cards)
	}
}
