package admin_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sandgate/sandgate/admin"
	"github.com/sandgate/sandgate/adminapi"
)

// TestMetrics: every operator request is counted and timed by its route
// template and status class (never a path with an id in it), and an
// audit entry that cannot be written is counted, from 0.
func TestMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e := newEnv(t, func(d *admin.Deps) { d.Meter = mp.Meter("admin") })

	collect := func() (requests map[[2]string]int64, histograms map[[2]string]uint64, auditFailures int64, seen bool) {
		t.Helper()
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		requests, histograms = map[[2]string]int64{}, map[[2]string]uint64{}
		key := func(s attribute.Set) [2]string {
			r, _ := s.Value("route")
			c, _ := s.Value("status_class")
			if s.Len() != 2 {
				t.Errorf("attributes %v; want route and status_class alone", s.ToSlice())
			}
			return [2]string{r.AsString(), c.AsString()}
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch m.Name {
				case admin.MetricRequests:
					for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
						requests[key(dp.Attributes)] += dp.Value
					}
				case admin.MetricRequestDuration:
					for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
						histograms[key(dp.Attributes)] += dp.Count
					}
				case admin.MetricAuditWriteFailures:
					seen = true
					for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
						auditFailures += dp.Value
					}
				}
			}
		}
		return requests, histograms, auditFailures, seen
	}
	if _, _, n, seen := collect(); !seen || n != 0 {
		t.Errorf("before any request: %s seen %v, %d; want a series at 0", admin.MetricAuditWriteFailures, seen, n)
	}

	a := e.account()
	inst := e.instance(a)
	e.do(operatorToken, http.MethodGet, "/instances/"+inst, nil, &adminapi.Instance{})
	if status, _ := e.refused(operatorToken, http.MethodGet, "/instances/inst_doesnotexist", nil); status != http.StatusNotFound {
		t.Fatalf("GET a missing instance = %d; want 404", status)
	}
	e.refused(operatorToken, http.MethodGet, "/no/such/route/"+inst, nil)
	e.refused("sgo_wrong", http.MethodPost, "/accounts", adminapi.CreateAccountRequest{Name: "x"})

	req, hist, _, _ := collect()
	for k, want := range map[[2]string]int64{
		{"POST /admin/v1/accounts", "2xx"}:     1,
		{"POST /admin/v1/instances", "2xx"}:    1,
		{"GET /admin/v1/instances/:id", "2xx"}: 1,
		{"GET /admin/v1/instances/:id", "4xx"}: 1,
		{"unmatched", "4xx"}:                   1,
		{"POST /admin/v1/accounts", "4xx"}:     1,
	} {
		if req[k] != want || hist[k] != uint64(want) {
			t.Errorf("%v: %d requests, %d latencies; want %d", k, req[k], hist[k], want)
		}
	}
	for k := range req {
		if strings.Contains(k[0], inst) || strings.Contains(k[0], a) || strings.Contains(k[0], "inst_") {
			t.Errorf("a route label carries an id: %q", k[0])
		}
	}

	// Redis is gone: the refused request's audit entry cannot be written.
	e.redis.Kill()
	if status, _ := e.refused(adminToken, http.MethodPost, "/accounts", adminapi.CreateAccountRequest{Name: "y"}); status != http.StatusServiceUnavailable {
		t.Fatalf("POST /accounts without Redis = %d; want 503", status)
	}
	req, _, n, _ := collect()
	if n != 1 {
		t.Errorf("%s = %d after one failed audit write; want 1", admin.MetricAuditWriteFailures, n)
	}
	if got := req[[2]string{"POST /admin/v1/accounts", "5xx"}]; got != 1 {
		t.Errorf("POST /admin/v1/accounts 5xx = %d; want 1", got)
	}
}
