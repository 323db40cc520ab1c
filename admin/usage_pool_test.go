package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/sandgate/sandgate/admin"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
)

// The usage summary carries the warm pools' time and cost as lines of
// their own, priced at the pool rate card, beside groups and totals that
// are the accounts' alone; a read of one account shows no pool; the read
// is audited.
func TestUsageSummaryPool(t *testing.T) {
	var bill *billing.Billing
	e := newEnv(t, func(d *admin.Deps) {
		bill = billing.New(billing.Config{PoolRateCard: "pool-cost"}, billing.Deps{DB: d.DB, Clock: d.Clock})
		d.Billing = bill
	})
	ctx := context.Background()
	e.clock.mu.Lock()
	e.clock.t = usageMonth.AddDate(0, 0, 14).Add(12 * time.Hour) // 2026-10-15 12:00
	e.clock.mu.Unlock()
	a := e.account()
	in := e.instance(a)
	total := e.seedUsage(a, in, 4)
	var before adminapi.UsageSummary
	e.do(financeToken, http.MethodGet, "/usage/summary?group_by=account&"+monthQuery, nil, &before)

	if _, err := bill.CreateRateCard(ctx, "pool-cost", "USD", map[string]int64{"small": 5000, "standard": 10000, "large": 20000, "xlarge": 40000},
		usageMonth); err != nil {
		t.Fatal(err)
	}
	// Two brokers' pools: 90s and 30.5s of small (120.5s, priced to the
	// millisecond, shown as 121 whole seconds), 10s of large.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	now := e.clock.Now()
	must(bill.PoolMeter().Record(ctx, now, []billing.PoolTotal{{Provider: "local", Size: "small", Image: "host", Warm: 90 * time.Second},
		{Provider: "local", Size: "large", Image: "host", Warm: 10 * time.Second}}))
	must(bill.PoolMeter().Record(ctx, now, []billing.PoolTotal{{Provider: "local", Size: "small", Image: "host", Warm: 30500 * time.Millisecond}}))

	var raw json.RawMessage
	e.do(financeToken, http.MethodGet, "/usage/summary?group_by=account&"+monthQuery, nil, &raw)
	var sum adminapi.UsageSummary
	if err := json.Unmarshal(raw, &sum); err != nil {
		t.Fatal(err)
	}
	wantLine := `{"provider":"local","size":"small","image":"host","seconds":121,"rate_card":"pool-cost","currency":"USD","amount_micros":602500,"amount":"0.60"}`
	if !bytes.Contains(raw, []byte(wantLine)) {
		t.Errorf("summary %s\nhas no pool line %s", raw, wantLine)
	}
	want := []adminapi.PoolLine{
		{Provider: "local", Size: "large", Image: "host", Seconds: 10, RateCard: "pool-cost", Currency: "USD", AmountMicros: 200000, Amount: "0.20"},
		{Provider: "local", Size: "small", Image: "host", Seconds: 121, RateCard: "pool-cost", Currency: "USD", AmountMicros: 602500, Amount: "0.60"},
	}
	if !slices.Equal(sum.Pool, want) {
		t.Errorf("pool lines = %+v; want %+v", sum.Pool, want)
	}
	if !slices.Equal(sum.Groups, before.Groups) || len(sum.Groups) != 1 || sum.Groups[0].AmountMicros != total {
		t.Errorf("groups with pool time = %+v; want the account's alone, as before it: %+v (total %d)", sum.Groups, before.Groups, total)
	}

	// A read of one account, or of another size, leaves the pool out.
	var one adminapi.UsageSummary
	e.do(financeToken, http.MethodGet, "/usage/summary?group_by=account&account="+a+"&"+monthQuery, nil, &one)
	if one.Pool == nil || len(one.Pool) != 0 {
		t.Errorf("pool of a one-account read = %#v; want an empty list", one.Pool)
	}
	var large adminapi.UsageSummary
	e.do(financeToken, http.MethodGet, "/usage/summary?group_by=size&size=large&"+monthQuery, nil, &large)
	if len(large.Pool) != 1 || large.Pool[0].Size != "large" {
		t.Errorf("pool of a read of size large = %+v; want its large line only", large.Pool)
	}

	// Every read is audited, and the one with pool lines counts them.
	evs, _ := e.audit("")
	var reads, withPool int
	for _, ev := range evs {
		if ev.Action == "usage.summary" && ev.Outcome.Status == http.StatusOK {
			reads++
			if bytes.Contains(ev.After, []byte(`"pool_lines":2`)) {
				withPool++
			}
		}
	}
	if reads != 4 || withPool != 1 {
		t.Errorf("audit log has %d usage.summary reads, %d counting 2 pool lines; want 4 and 1", reads, withPool)
	}
}
