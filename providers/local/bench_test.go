package local_test

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// BenchmarkExecPaced runs "true" in one workspace at an interactive pace,
// one exec every 20 ms, and reports the execs' latency percentiles (ns/op
// counts the pauses too). Execs back to back hide costs that an idle host
// shows: on cgroup v1 the kernel's global cgroup lock, when a process is
// moved into a cgroup by its pid, first waits for an RCU grace period,
// and an idle host's grace periods are the longest (joinAsStarted).
func BenchmarkExecPaced(b *testing.B) {
	p, sb := benchWorkspace(b)
	var took []time.Duration
	for b.Loop() {
		time.Sleep(20 * time.Millisecond)
		t0 := time.Now()
		res, err := p.Exec(b.Context(), sb, providers.ExecSpec{Argv: []string{"true"}, MaxOutputBytes: 10})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec true: %v, exit %d", err, res.ExitCode)
		}
		took = append(took, time.Since(t0))
	}
	reportPercentiles(b, took)
}

// BenchmarkDurableCommand starts a durable command of "true" in one
// workspace and reads it until it is completed, polling every
// millisecond, and reports the percentiles of that time: a durable
// command's runner, its step (the broker's binary started again) and
// bwrap, and the command's end reaching its status. (Here the step is the
// test binary, whose packages initialise faster than the broker's.)
func BenchmarkDurableCommand(b *testing.B) {
	p, sb := benchWorkspace(b)
	var took []time.Duration
	n := 0
	for b.Loop() {
		time.Sleep(20 * time.Millisecond)
		n++
		id := "c" + strconv.Itoa(n)
		t0 := time.Now()
		if err := p.StartCommand(b.Context(), sb, id, providers.ExecSpec{Argv: []string{"true"}, Timeout: time.Minute, MaxOutputBytes: 10}); err != nil {
			b.Fatalf("StartCommand: %v", err)
		}
		for {
			st, err := p.ReadCommand(b.Context(), sb, id, 10)
			if err != nil {
				b.Fatalf("ReadCommand: %v", err)
			}
			if st.State == providers.CommandCompleted {
				if st.ExitCode != 0 {
					b.Fatalf("true: exit %d", st.ExitCode)
				}
				break
			}
			time.Sleep(time.Millisecond)
		}
		took = append(took, time.Since(t0))
	}
	reportPercentiles(b, took)
}

// benchWorkspace returns a provider on a data directory of its own and a
// workspace of it, both gone after the benchmark.
func benchWorkspace(b *testing.B) (*local.Provider, providers.Sandbox) {
	p, err := local.New(b.Context(), local.Config{DataDir: b.TempDir()}, providers.Env{BrokerID: broker})
	if err != nil {
		b.Fatalf("local.New: %v", err)
	}
	b.Cleanup(func() { providertest.Discard(p) })
	return p, providertest.Create(b, p, providertest.Spec(b))
}

// reportPercentiles reports p50, p90 and the maximum of took, in ms.
func reportPercentiles(b *testing.B, took []time.Duration) {
	slices.Sort(took)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(took[len(took)/2]), "p50-ms")
	b.ReportMetric(ms(took[len(took)*9/10]), "p90-ms")
	b.ReportMetric(ms(took[len(took)-1]), "max-ms")
}
