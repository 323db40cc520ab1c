package console_test

import (
	"maps"
	"testing"

	"github.com/sandgate/sandgate/console"
)

func TestParseRefusals(t *testing.T) {
	in := `# HELP sandgate_http_requests_total v1 requests
# TYPE sandgate_http_requests_total counter
sandgate_http_requests_total{code="",otel_scope_name="gw",route="GET /v1/lease",status="200"} 7
sandgate_http_requests_total{code="emergency_stopped",otel_scope_name="gw",route="POST /v1/workspaces",status="403"} 3
sandgate_http_requests_total{code="emergency_stopped",otel_scope_name="gw",route="POST /v1/workspaces/{id}/snapshots",status="403"} 1
sandgate_http_requests_total{code="workspace_gone",otel_scope_name="gw",route="POST /v1/workspaces/{id}/exec",status="410"} 2
sandgate_reaper_passes_total{otel_scope_name="reaper"} 9
`
	got := console.ParseRefusals([]byte(in))
	want := map[string]int64{"emergency_stopped": 4, "workspace_gone": 2}
	if !maps.Equal(got, want) {
		t.Errorf("ParseRefusals = %v; want %v", got, want)
	}
}
