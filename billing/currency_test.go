package billing_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/protocol"
)

func flatPrices(unit int64) map[string]int64 {
	p := map[string]int64{}
	for _, s := range sandgate.StandardSizes {
		p[s.Name] = unit
	}
	return p
}

// A card is priced in one currency: it cannot be put on an account of
// another, nor get a version in another; a card without a currency is
// refused at creation.
func TestRateCardCurrency(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.bill.CreateRateCard(ctx, "nocur", "", flatPrices(1), e.clock.Now()); err == nil || !strings.Contains(err.Error(), "currency is required") {
		t.Errorf("CreateRateCard without a currency = %v; want refused, currency is required", err)
	}
	if _, err := e.bill.CreateRateCard(ctx, "usd", "USD", flatPrices(100), e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		label    string
		currency string
		wantErr  bool
	}{{"a JPY account", "JPY", true}, {"a USD account", "USD", false}}
	for _, tt := range tests {
		err := e.bill.SetSettings(ctx, billing.Settings{AccountID: "acct_" + tt.currency, RateCard: "usd", Currency: tt.currency})
		if tt.wantErr {
			if !errors.Is(err, billing.ErrCardCurrency) || !strings.Contains(err.Error(), "USD") || !strings.Contains(err.Error(), "JPY") {
				t.Errorf("USD card on %s: %v; want ErrCardCurrency naming USD and JPY", tt.label, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("USD card on %s: %v", tt.label, err)
		}
	}
	if _, err := e.bill.CreateRateCard(ctx, "usd", "EUR", flatPrices(1), e.clock.Now()); !errors.Is(err, billing.ErrCardCurrency) {
		t.Errorf("a EUR version of a USD card: %v; want ErrCardCurrency", err)
	}
	if c, err := e.bill.RateCard(ctx, "usd", 0); err != nil || c.Version != 1 || c.Currency != "USD" {
		t.Errorf("RateCard(usd) = %+v, %v; want version 1 in USD", c, err)
	}
}

// A card stored before cards had currencies keeps pricing the accounts
// already on it, cannot be put on another until an operator sets its
// currency, and that migration is allowed once.
func TestRateCardCurrencyMigration(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rdb := e.db.Redis()
	// The card and the settings as an older broker wrote them.
	old := `{"name":"legacy","version":0,"prices_micros":{"small":7,"standard":7,"large":7,"xlarge":7},"created_at":"2026-01-01T00:00:00Z"}`
	if err := rdb.HSet(ctx, "sg:ratecard:legacy", "latest", 1, "1", old).Err(); err != nil {
		t.Fatal(err)
	}
	rdb.SAdd(ctx, "sg:ratecards", "legacy")
	if err := rdb.HSet(ctx, "sg:{acct_old}:billing", "configured", "1", "rate_card", "legacy", "currency", "USD",
		"credit_limit", 0, "postpaid", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if p, err := e.bill.Price(ctx, "acct_old", "small", e.clock.Now(), e.clock.Now().Add(time.Hour)); err != nil || p.UnitMicros != 7 || p.Currency != "USD" {
		t.Fatalf("the attached account's price = %+v, %v; want 7 USD micros/s, unchanged", p, err)
	}
	cards, err := e.bill.RateCards(ctx)
	if err != nil || len(cards) != 1 || cards[0].Currency != "" {
		t.Fatalf("RateCards = %+v, %v; want legacy without a currency", cards, err)
	}
	err = e.bill.SetSettings(ctx, billing.Settings{AccountID: "acct_new", RateCard: "legacy", Currency: "USD"})
	if !errors.Is(err, billing.ErrCardCurrency) || !strings.Contains(err.Error(), "set-currency legacy") {
		t.Fatalf("attaching a card without a currency: %v; want ErrCardCurrency telling to run set-currency", err)
	}
	if _, err := e.bill.CreateRateCard(ctx, "legacy", "USD", flatPrices(8), e.clock.Now()); !errors.Is(err, billing.ErrCardCurrency) {
		t.Errorf("a version of a card without a currency: %v; want ErrCardCurrency", err)
	}
	if _, err := e.bill.SetRateCardCurrency(ctx, "nope", "USD"); !errors.Is(err, billing.ErrNoRateCard) {
		t.Errorf("SetRateCardCurrency(nope) = %v; want ErrNoRateCard", err)
	}
	c, err := e.bill.SetRateCardCurrency(ctx, "legacy", "USD")
	if err != nil || c.Currency != "USD" || c.Prices["small"] != 7 {
		t.Fatalf("SetRateCardCurrency = %+v, %v; want legacy in USD, prices unchanged", c, err)
	}
	if _, err := e.bill.SetRateCardCurrency(ctx, "legacy", "EUR"); !errors.Is(err, billing.ErrCardCurrency) {
		t.Errorf("setting the currency twice: %v; want ErrCardCurrency", err)
	}
	if err := e.bill.SetSettings(ctx, billing.Settings{AccountID: "acct_new", RateCard: "legacy", Currency: "USD"}); err != nil {
		t.Errorf("attaching the migrated card: %v", err)
	}
}

// An account whose billing was never configured cannot acquire; marked
// free it acquires at price 0 in XXX, held against nothing.
func TestUnconfiguredAccountRefusedFreeAdmitted(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	_, err := e.acquire("acct_none", "inst_1", "", time.Hour)
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.InsufficientFunds || pe.Reason != billing.ReasonNotConfigured ||
		!strings.Contains(pe.Message, "acct_none has no billing settings") || !strings.Contains(pe.Message, "billing set --free") {
		t.Fatalf("acquire of an unconfigured account = %v; want insufficient_funds, billing_not_configured, saying what to do", err)
	}
	if err := e.bill.SetSettings(ctx, billing.Settings{AccountID: "acct_free", Free: true, RateCard: "x"}); err == nil {
		t.Error("free with a rate card: accepted; want refused")
	}
	if err := e.bill.SetSettings(ctx, billing.Settings{AccountID: "acct_free", Free: true}); err != nil {
		t.Fatal(err)
	}
	st, err := e.bill.Settings(ctx, "acct_free")
	if err != nil || !st.Free || !st.Postpaid || st.Currency != billing.NoCurrency || st.State() != billing.StateFree {
		t.Fatalf("Settings(acct_free) = %+v, %v; want free, postpaid, XXX", st, err)
	}
	w, err := e.acquire("acct_free", "inst_1", "", time.Hour)
	if err != nil {
		t.Fatalf("acquire of a free account: %v", err)
	}
	if w.Price.Currency != billing.NoCurrency || w.Price.UnitMicros != 0 || w.Price.HoldMicros != 0 {
		t.Errorf("free workspace price = %+v; want 0 in XXX, no hold", w.Price)
	}
	states, err := e.bill.States(ctx, []string{"acct_free", "acct_none"})
	if err != nil || states["acct_free"] != billing.StateFree || states["acct_none"] != billing.StateNotConfigured {
		t.Errorf("States = %v, %v; want free and not_configured", states, err)
	}
	if r, err := e.bill.Reconcile(ctx, "acct_none"); err != nil || r.Billing != billing.StateNotConfigured {
		t.Errorf("Reconcile(acct_none).Billing = %q, %v; want not_configured", r.Billing, err)
	}
}

// An adjustment needs a reason, and its reason and operator are on the
// ledger entry and the statement's adjustment line.
func TestAdjustmentReasonOnEntryAndStatement(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const acct = "acct_r"
	e.account(acct, 10, false)
	fin := billing.UsageEntry{ID: billing.FinalID("ws_a"), Kind: billing.KindUsage, Final: true, AccountID: acct, WorkspaceID: "ws_a",
		Size: "small", Currency: "USD", UnitPriceMicros: 10, Seconds: 100, AmountMicros: 1000, TerminatedAt: e.clock.Now()}
	if _, err := e.bill.Ledger().Append(ctx, fin); err != nil {
		t.Fatal(err)
	}
	adj := billing.UsageAdjustment{Corrects: fin.ID, Key: "k", AmountMicros: -400, Actor: "alice:sgo_ab12", At: e.clock.Now()}
	if _, _, err := e.bill.AdjustUsage(ctx, acct, adj); err == nil || !strings.Contains(err.Error(), "reason is required") {
		t.Errorf("an adjustment without a reason: %v; want refused", err)
	}
	adj.Reason = "outage credit, INC-7"
	got, _, err := e.bill.AdjustUsage(ctx, acct, adj)
	if err != nil || got.Reason != adj.Reason || got.Actor != adj.Actor {
		t.Fatalf("AdjustUsage = %+v, %v; want reason and actor on the entry", got, err)
	}
	st, err := billing.BuildStatement(ctx, e.bill.Ledger(), e.bill, acct, e.clock.Now(), e.clock.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Adjustments) != 1 || st.Adjustments[0].Reason != adj.Reason || st.Adjustments[0].Actor != adj.Actor {
		t.Errorf("statement adjustments = %+v; want one with reason %q and actor %q", st.Adjustments, adj.Reason, adj.Actor)
	}
}
