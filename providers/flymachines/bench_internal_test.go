package flymachines

import (
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/guesttest"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/flymachines/flytest"
)

// BenchmarkExecTrue is `exec true` on a Machine of the fake, through the
// agent's jail as every tenant exec runs (jail) and the same vendor exec
// without it (plain): their ratio is what the jail adds
// (docs/benchmarks.md).
func BenchmarkExecTrue(b *testing.B) {
	s, err := flytest.New(b.Context(), flytest.Options{Token: "fm2_bench", DataDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	p, err := New(b.Context(), Config{BaseURL: s.URL(), Token: sandgate.Secret("fm2_bench"), App: "sandgate-bench", Org: "personal",
		BlobDir: b.TempDir(), Transport: s.Transport()}, providers.Env{BrokerID: "bench", GuestBinary: guesttest.Binary(b)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	spec := providers.CreateSpec{WorkspaceID: "ws_bench", InstanceID: "inst_bench", ExpiresAt: time.Now().Add(time.Hour)}
	spec.Size, _ = sandgate.LookupSize("small")
	sb, err := p.Create(b.Context(), spec)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Terminate(b.Context(), sb) })
	true1 := providers.ExecSpec{Argv: []string{"true"}, Timeout: 10 * time.Second}
	for _, tt := range []struct {
		name string
		exec func() (providers.ExecResult, error)
	}{
		{"jail", func() (providers.ExecResult, error) { return p.Exec(b.Context(), sb, true1) }},
		{"plain", func() (providers.ExecResult, error) { return directExecer{p: p}.Exec(b.Context(), sb, true1) }},
	} {
		b.Run(tt.name, func(b *testing.B) {
			for b.Loop() {
				if res, err := tt.exec(); err != nil || res.ExitCode != 0 {
					b.Fatalf("exec true = %+v, %v", res, err)
				}
			}
		})
	}
}
