package gateway_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/providers"
)

// TestBillingHoldSettleAndAbort: an Acquire holds the worst case, a failed
// create gives it back uncharged, and a release settles the metered
// seconds at the admitted price into the usage ledger, once.
func TestBillingHoldSettleAndAbort(t *testing.T) {
	t.Parallel()
	// Half past an hour: the workspace's 90 s cross no whole UTC hour, so
	// its usage is one final entry (no interim accrual entry).
	start := sgtest.MidHour(time.Now())
	h := sgtest.New(t, sgtest.Options{Start: start})
	op := newOperator(t, h)
	in := h.NewInstance(adminapi.Scope{})
	acct := in.AccountID
	op.billing(t, acct, "0.000100", false)
	op.do(t, http.MethodPost, "/accounts/"+acct+"/funds/credit", adminapi.FundsRequest{Amount: "50.00", Reason: "open", IdempotencyKey: "o"}, nil)
	funds := func() adminapi.Balance {
		var b adminapi.Balance
		op.do(t, http.MethodGet, "/accounts/"+acct+"/funds", nil, &b)
		return b
	}

	h.Provider.OnCreate(func(context.Context, providers.CreateSpec) error { return errors.New("boom") })
	if rep := do(t, h, acquireReq(in.Token, "fails", acquireBody("fails"))); rep.Status != http.StatusBadGateway {
		t.Fatalf("acquire with a failing create: %d, want 502", rep.Status)
	}
	if b := funds(); b.HoldsMicros != 0 || b.Available != "50.00" {
		t.Fatalf("after a failed create: %+v; want the hold back", b)
	}
	h.Provider.OnCreate(nil)

	ws := acquire(t, h, in.Token, "ok")
	if b := funds(); b.HoldsMicros <= 0 {
		t.Fatalf("with a workspace running: holds %d; want its worst case", b.HoldsMicros)
	}
	// A price change reaches only later workspaces.
	op.do(t, http.MethodPost, "/rate-cards", adminapi.RateCardRequest{Name: "card-" + lower(acct), Currency: "USD",
		Prices: map[string]string{"small": "1.00", "standard": "1.00", "large": "1.00", "xlarge": "1.00"}}, nil)
	h.Clock.Advance(90*time.Second + time.Millisecond)
	release(t, h, in.Token, ws.WorkspaceID)
	release(t, h, in.Token, ws.WorkspaceID)

	var got []billing.UsageEntry
	if err := billing.NewLedger(h.DB.Redis()).Scan(context.Background(), acct, time.Time{}, time.Time{}, func(e billing.UsageEntry) error {
		got = append(got, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("usage entries = %d, want 1: %+v", len(got), got)
	}
	e := got[0]
	// Metered from the provider's confirmed start (the harness clock's
	// start) to the release, 90.001 s rounded up: 91 s at the admitted
	// 100 micros/s.
	if e.WorkspaceID != ws.WorkspaceID || !e.StartedAt.Equal(start) || !e.EndedAt.Equal(start.Add(90*time.Second+time.Millisecond)) ||
		e.Seconds != 91 || e.UnitPriceMicros != 100 || e.AmountMicros != 9_100 || !e.Final ||
		e.RateCardVersion != 1 || e.Currency != "USD" || e.TerminationReason != "released" || e.InstanceID != in.ID {
		t.Fatalf("usage entry = %+v; want final, 91 s from %s at the admitted 100 micros/s (9100), v1, USD, released", e, start)
	}
	if b := funds(); b.HoldsMicros != 0 || b.SettledMicros != 9_100 || b.BalanceMicros != 50_000_000-9_100 || b.AvailableMicros != 50_000_000-9_100 {
		t.Fatalf("after release: %+v; want no holds, 9100 settled, 49.9909 left", b)
	}
	var reps []billing.Report
	op.do(t, http.MethodGet, "/billing/reconcile?account="+acct, nil, &reps)
	if len(reps) != 1 || len(reps[0].Drift) != 0 {
		t.Fatalf("reconcile: %+v", reps)
	}
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
