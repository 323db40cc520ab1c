package broker_test

import (
	"context"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/internal/broker"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/token"
)

// A warm local workspace that waited 40s and was then taken by an
// acquire adds exactly 40s, priced at the pool rate card, to the usage
// summary's pool line, and nothing to the account that took it: its
// metered seconds start at the take. A second broker's pool adds to the
// same line, and a broker started afresh reads both.
func TestPoolTimeIsTheOperators(t *testing.T) {
	start := sgtest.MidHour(time.Now())
	h := sgtest.New(t, sgtest.Options{Start: start}) // the accounts and the Redis
	ctx := context.Background()

	lp, err := local.New(t.Context(), local.Config{DataDir: t.TempDir(),
		Pool: providers.PoolConfig{Per: []providers.PoolEntry{{Size: "small", Count: 1}}}},
		providers.Env{BrokerID: "pool-cost", Clock: h.Clock})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { lp.Close() })
	cfg := sgtest.Config(t)
	cfg.Defaults.DefaultImage = sgtest.DefaultImage
	cfg.Billing.PoolRateCard = "pool-cost"
	cfg.Operators = []broker.OperatorConfig{{Name: "test", Role: "finance", TokenSHA256: token.Hash(h.AdminToken)}}
	b := sgtest.Broker(t, cfg, broker.Options{Redis: h.Redis.Client(), Providers: providers.Single(sgtest.ProviderName, lp), Clock: h.Clock})
	gw := httptest.NewTLSServer(b.Gateway().Handler())
	t.Cleanup(gw.Close)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); b.Gateway().Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })

	if _, err := h.Billing.CreateRateCard(ctx, "pool-cost", "USD", map[string]int64{"small": 1000, "standard": 2000, "large": 4000, "xlarge": 8000},
		start.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	in := h.NewInstance(adminapi.Scope{})
	sgtest.WaitFor(t, "a warm workspace", func() bool { return lp.PoolStats().Ready[0].Ready == 1 })

	h.Clock.Advance(40 * time.Second)
	roots := x509.NewCertPool()
	roots.AddCert(gw.Certificate())
	c, err := client.New(client.Config{Endpoint: gw.URL, Token: in.Token, RootCAs: roots, BaseBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ws, _, err := c.Acquire(ctx, "k1", protocol.AcquireRequest{Label: "l", Size: "small", Egress: &protocol.Egress{AllowedDomains: []string{}}})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	if st := lp.PoolStats(); st.Taken != 1 {
		t.Fatalf("pool stats %+v; want the acquire to take the warm workspace", st)
	}
	if err := b.RecordPool(ctx); err != nil {
		t.Fatalf("RecordPool: %v", err)
	}
	h.Clock.Advance(25 * time.Second)
	if _, err := c.Release(ctx, ws.WorkspaceID); err != nil {
		t.Fatalf("release: %v", err)
	}

	// Another broker's pool of the same provider, size and image: 10s.
	if err := h.Billing.PoolMeter().Record(ctx, h.Clock.Now(), []billing.PoolTotal{
		{Provider: sgtest.ProviderName, Size: "small", Image: sgtest.DefaultImage, Warm: 10 * time.Second}}); err != nil {
		t.Fatal(err)
	}

	// A broker started afresh on the store reads what both recorded.
	fresh := sgtest.Broker(t, cfg, broker.Options{Redis: h.Redis.Client(), Providers: h.Providers, Clock: h.Clock})
	adm := httptest.NewServer(fresh.Admin().Handler())
	t.Cleanup(adm.Close)
	ac, err := adminapi.NewClient(adm.URL, h.AdminToken, adm.Client())
	if err != nil {
		t.Fatal(err)
	}
	var sum adminapi.UsageSummary
	q := "/usage/summary?group_by=account&from=" + start.Truncate(time.Hour).Format(time.RFC3339) + "&to=" + start.Add(2*time.Hour).Format(time.RFC3339)
	if err := ac.Do(ctx, http.MethodGet, q, nil, &sum); err != nil {
		t.Fatal(err)
	}
	if len(sum.Groups) != 1 || sum.Groups[0].Key != in.AccountID || sum.Groups[0].Seconds != 25 {
		t.Errorf("account groups = %+v; want %s with 25 metered seconds (from the take to the release)", sum.Groups, in.AccountID)
	}
	want := adminapi.PoolLine{Provider: sgtest.ProviderName, Size: "small", Image: sgtest.DefaultImage, Seconds: 50,
		RateCard: "pool-cost", Currency: "USD", AmountMicros: 50_000, Amount: "0.05"}
	if len(sum.Pool) != 1 || sum.Pool[0] != want {
		t.Errorf("pool lines = %+v; want %+v", sum.Pool, want)
	}
}
