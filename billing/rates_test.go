package billing_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
)

// TestCreateRateCardSentTwice: a create sent again unchanged (its reply
// lost, go-redis resending it) answers the version it made, and the card
// has no copy of it; a later create of the same prices, or another price
// list, still adds a version.
func TestCreateRateCardSentTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	prices := map[string]int64{}
	for _, s := range sandgate.StandardSizes {
		prices[s.Name] = 7
	}
	now := e.clock.Now()
	versions := func(label string, at time.Time, p map[string]int64) int {
		t.Helper()
		c, err := e.bill.CreateRateCard(ctx, "twice", p, at)
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		return c.Version
	}
	if v := versions("create", now, prices); v != 1 {
		t.Fatalf("first create: version %d; want 1", v)
	}
	if v := versions("create sent again", now, prices); v != 1 {
		t.Errorf("the same create sent again: version %d; want 1", v)
	}
	if c, err := e.bill.RateCard(ctx, "twice", 0); err != nil || c.Version != 1 {
		t.Errorf("newest version after the resend = %d, %v; want 1", c.Version, err)
	}
	if _, err := e.bill.RateCard(ctx, "twice", 2); err == nil {
		t.Error("version 2 exists after one create sent twice")
	}
	if v := versions("the same prices a millisecond later", now.Add(time.Millisecond), prices); v != 2 {
		t.Errorf("the same prices created again later: version %d; want 2", v)
	}
	other := map[string]int64{}
	for k, p := range prices {
		other[k] = p + 1
	}
	if v := versions("other prices", now.Add(time.Millisecond), other); v != 3 {
		t.Errorf("other prices: version %d; want 3", v)
	}
	cards, err := e.bill.RateCards(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cards) != 1 || cards[0].Name != "twice" || cards[0].Version != 3 || cards[0].Prices["small"] != 8 {
		t.Errorf("rate cards = %+v; want twice at version 3, small at 8", cards)
	}
}
