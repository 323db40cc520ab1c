package telemetry

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate"
)

// MetricLiveWorkspaces is the number of live (not terminated) workspaces
// of the whole broker, by provider and state. Every gateway reports the
// same broker-wide count: aggregate it with max, not sum.
const MetricLiveWorkspaces = "sandgate.workspaces.live"

// LiveWorkspacesEvery is how often at most the live workspaces are read
// from the store; scrapes in between report the last count.
const LiveWorkspacesEvery = 10 * time.Second

// LiveWorkspaces registers MetricLiveWorkspaces, read by list (the store's
// live workspaces of every account) at most once per LiveWorkspacesEvery,
// each read bounded by timeout. A failed read keeps the last count. Every
// provider of names reports every live state, 0 when it has none.
func LiveWorkspaces(m metric.Meter, names []string, timeout time.Duration, list func(ctx context.Context) ([]sandgate.Workspace, error)) error {
	type key struct{ provider, state string }
	var (
		mu     sync.Mutex
		last   map[key]int64
		readAt time.Time
	)
	_, err := m.Int64ObservableGauge(MetricLiveWorkspaces, metric.WithUnit("{workspace}"),
		metric.WithDescription("Live workspaces of the broker, by provider and state (every gateway reports the same count)."),
		metric.WithInt64Callback(func(ctx context.Context, o metric.Int64Observer) error {
			mu.Lock()
			defer mu.Unlock()
			if last == nil || time.Since(readAt) >= LiveWorkspacesEvery {
				rctx, cancel := context.WithTimeout(ctx, timeout)
				ws, err := list(rctx)
				cancel()
				if err == nil {
					counts := map[key]int64{}
					for _, n := range names {
						for _, st := range []sandgate.WorkspaceState{sandgate.WorkspaceStarting, sandgate.WorkspaceRunning, sandgate.WorkspaceTerminating} {
							counts[key{n, string(st)}] = 0
						}
					}
					for _, w := range ws {
						p := w.Provider
						if p == "" {
							p = "local"
						}
						counts[key{p, string(w.State)}]++
					}
					// A provider and state with none left reports 0, not a stale count.
					for k := range last {
						if _, ok := counts[k]; !ok {
							counts[k] = 0
						}
					}
					last, readAt = counts, time.Now()
				}
			}
			for k, n := range last {
				o.Observe(n, metric.WithAttributeSet(attribute.NewSet(
					attribute.String("provider", k.provider), attribute.String("state", k.state))))
			}
			return nil
		}))
	return err
}
