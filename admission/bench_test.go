package admission_test

import (
	"context"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/store"
)

// BenchmarkAdmit measures the whole admission script (idempotency claim,
// stop and pause, concurrency, risk, record) against a real redis-server,
// and beside it redis-benchmark's figure for a trivial EVALSHA on the same
// server in the same run: the ratio is what admission costs over the floor
// of one script call.
func BenchmarkAdmit(b *testing.B) {
	srv := redistest.Start(b)
	db := store.New(store.Config{}, srv.Client())
	p := admission.New(db.Redis(), admission.Standard(db, admission.StandardConfig{
		IdempotencyTTL: time.Hour, PendingTimeout: time.Minute,
		Risk: admission.RiskDefaults{AcquiresPerMinute: 1 << 30, MaxOpenWorkspaces: 1 << 30},
	})...)
	ctx := context.Background()
	acct, inst := sandgate.NewID("acct_"), sandgate.NewID("inst_")
	scope := sandgate.Scope{Limits: sandgate.Limits{MaxConcurrentWorkspaces: 1 << 30}.WithDefaults()}
	now := time.Now().UTC()
	i := 0
	before := evalshaUsec(b, srv)
	start := time.Now()
	for b.Loop() {
		w := newWorkspace(acct, inst, now)
		key := strconv.Itoa(i)
		i++
		err := p.Admit(ctx, &admission.Request{Workspace: w, Scope: scope,
			Keys: store.AdmissionKeys(acct, inst, w.ID, key), KeyHash: key, RequestHash: "h", Now: now})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "admits/s")
	b.ReportMetric((evalshaUsec(b, srv)-before)/float64(b.N), "redis-µs/admit")
	if rps := redisBenchmarkEvalsha(b, srv); rps > 0 {
		b.ReportMetric(rps, "redis-benchmark-evalsha/s")
	}
}

var usecRE = regexp.MustCompile(`cmdstat_evalsha:calls=\d+,usec=(\d+)`)

// evalshaUsec is the redis-server CPU its EVALSHA calls took so far (INFO
// commandstats, µs): what the scripts cost redis-server, commands inside
// included.
func evalshaUsec(b *testing.B, srv *redistest.Server) float64 {
	b.Helper()
	info, err := srv.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	m := usecRE.FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

var rpsRE = regexp.MustCompile(`([0-9.]+) requests per second`)

// redisBenchmarkEvalsha runs redis-benchmark (one connection, like the
// serial loop above) on a trivial script and returns its requests/s.
func redisBenchmarkEvalsha(b *testing.B, srv *redistest.Server) float64 {
	b.Helper()
	sha, err := srv.Client().ScriptLoad(context.Background(), "return 1").Result()
	if err != nil {
		b.Fatal(err)
	}
	host, port, _ := strings.Cut(srv.Addr, ":")
	out, err := exec.Command("redis-benchmark", "-h", host, "-p", port, "-c", "1", "-n", "20000", "-q",
		"EVALSHA", sha, "0").CombinedOutput()
	if err != nil {
		b.Fatalf("redis-benchmark: %v: %s", err, out)
	}
	m := rpsRE.FindSubmatch(out)
	if m == nil {
		b.Fatalf("redis-benchmark output without a figure: %s", out)
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}
