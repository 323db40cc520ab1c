package gateway_test

// Benchmarks of the hot paths through the TLS test server, each beside the
// cost of one Redis round trip on the same server (BenchmarkRedisPing), so
// that docs/benchmarks.md can quote every figure as a ratio measured in the
// same run. Every benchmark also reports rt/op, the Redis round trips per
// operation, counted by the same hook as roundtrip_test.go. Requests are
// sent one at a time over one keep-alive connection: the figures are
// latencies, not throughput under load.
//
//	go test -run '^$' -bench . -benchtime 2s ./gateway/

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/internal/bwrapfloor"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/noop"
)

// benchReport reports the round trips per operation since the last reset.
func benchReport(b *testing.B, e *rtEnv) {
	b.ReportMetric(float64(e.rt.trips.Load())/float64(b.N), "rt/op")
}

// BenchmarkRedisPing is the baseline: one PING round trip through the
// gateway's own client (with the counting hook) to the same server.
func BenchmarkRedisPing(b *testing.B) {
	e := rtStart(b, rtOptions{})
	rdb := e.db.Redis()
	ctx := context.Background()
	e.rt.reset()
	for b.Loop() {
		if err := rdb.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
	benchReport(b, e)
}

// BenchmarkRedisEvalshaTrivial is one EVALSHA of "return 1": a round trip
// plus the cost of entering Lua, the floor of any script call.
func BenchmarkRedisEvalshaTrivial(b *testing.B) {
	e := rtStart(b, rtOptions{})
	rdb := e.db.Redis()
	ctx := context.Background()
	script := redis.NewScript("return 1")
	if err := script.Load(ctx, rdb).Err(); err != nil {
		b.Fatal(err)
	}
	e.rt.reset()
	for b.Loop() {
		if err := script.EvalSha(ctx, rdb, nil).Err(); err != nil {
			b.Fatal(err)
		}
	}
	benchReport(b, e)
}

// BenchmarkLease is GET /v1/lease with a warm auth cache.
func BenchmarkLease(b *testing.B) {
	e := rtStart(b, rtOptions{})
	req := benchRequest(b, e, http.MethodGet, "/v1/lease", "", nil)
	e.rt.reset()
	for b.Loop() {
		benchSend(b, e, req, "", http.StatusOK)
	}
	benchReport(b, e)
}

// BenchmarkLeaseVsTLSFloor alternates, in one run, a warm GET /v1/lease
// with the request-rate limits on and a minimal TLS handler that serves
// the same body from memory with no Redis at all (the floor), each over
// its own keep-alive connection, and reports their ratio: floor-ns ÷
// lease-ns, the lease's throughput as a share of the floor's (target ≥
// 0.9). The read limit's burst is the production one (so the limiter
// borrows in its production batches), its rate high enough that nothing
// is refused. The gateway logs, meters and traces as `sandgate serve` does
// without an OTLP exporter (rtOptions.production).
func BenchmarkLeaseVsTLSFloor(b *testing.B) {
	read := admission.DefaultRates[admission.ClassRead]
	read.PerSecond = 1e9
	e := rtStart(b, rtOptions{rateLimited: true, rates: map[admission.Class]admission.Rate{admission.ClassRead: read}, production: true})
	req := benchRequest(b, e, http.MethodGet, "/v1/lease", "", nil)
	resp, err := e.client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	floor := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	b.Cleanup(floor.Close)
	fc := floor.Client()
	freq, err := http.NewRequest(http.MethodGet, floor.URL+"/v1/lease", nil)
	if err != nil {
		b.Fatal(err)
	}
	freq.Header = req.Header.Clone()
	var leaseNS, floorNS time.Duration
	e.rt.reset()
	for b.Loop() {
		t0 := time.Now()
		r, err := fc.Do(freq)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
		t1 := time.Now()
		benchSend(b, e, req, "", http.StatusOK)
		floorNS, leaseNS = floorNS+t1.Sub(t0), leaseNS+time.Since(t1)
	}
	benchReport(b, e)
	b.ReportMetric(float64(leaseNS.Nanoseconds())/float64(b.N), "lease-ns/op")
	b.ReportMetric(float64(floorNS.Nanoseconds())/float64(b.N), "floor-ns/op")
	b.ReportMetric(float64(floorNS)/float64(leaseNS), "lease÷floor")
}

// BenchmarkAcquireNoopProvider is POST /v1/workspaces on the noop
// provider (providers/noop), whose create costs nothing: authentication,
// the idempotency check, admission and the confirm that answers the
// record. Each op uses a fresh Idempotency-Key, and the limit is high
// enough that admission never refuses.
func BenchmarkAcquireNoopProvider(b *testing.B) {
	e := rtStart(b, rtOptions{maxConcurrent: 1 << 30, provider: noop.New("bench")})
	e.acquire(b) // loads the scripts
	e.rt.reset()
	for b.Loop() {
		hdr := http.Header{protocol.HeaderIdempotencyKey: {sandgate.NewID("key_")}}
		benchSend(b, e, benchRequest(b, e, http.MethodPost, "/v1/workspaces", rtAcquireBody, hdr), rtAcquireBody, http.StatusCreated)
	}
	benchReport(b, e)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "acquires/s")
}

// BenchmarkAcquireReleaseNoopProvider is an acquire and its release on the
// noop provider, one pair at a time: five round trips a pair.
func BenchmarkAcquireReleaseNoopProvider(b *testing.B) {
	e := rtStart(b, rtOptions{maxConcurrent: 1 << 30, provider: noop.New("bench")})
	e.mustDo(b, http.MethodDelete, "/v1/workspaces/"+e.acquire(b), "", nil, http.StatusOK) // loads the scripts
	e.rt.reset()
	for b.Loop() {
		e.mustDo(b, http.MethodDelete, "/v1/workspaces/"+e.acquire(b), "", nil, http.StatusOK)
	}
	benchReport(b, e)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
}

// BenchmarkExecFakeProvider is POST …/exec with a provider that answers at
// once: the gateway's and Redis's share of an exec.
func BenchmarkExecFakeProvider(b *testing.B) {
	benchExec(b, rtStart(b, rtOptions{}))
}

// BenchmarkExecLocal is POST …/exec of "true" on the local provider: a
// real bwrap sandbox per exec.
func BenchmarkExecLocal(b *testing.B) {
	p, err := local.New(context.Background(), local.Config{DataDir: b.TempDir()}, providers.Env{BrokerID: "bench"})
	if err != nil {
		b.Fatalf("local.New: %v", err)
	}
	benchExec(b, rtStart(b, rtOptions{provider: p}))
}

// BenchmarkBwrapTrue runs "true" under a bare bwrap with the namespaces
// the local provider asks for (no limits, no workspace binds, no
// gateway): the floor of BenchmarkExecLocal.
func BenchmarkBwrapTrue(b *testing.B) {
	cmd := bareBwrap(b)
	for b.Loop() {
		runBare(b, cmd)
	}
}

// BenchmarkExecLocalVsBwrap alternates one POST …/exec of "true" on the
// local provider and one bare bwrap "true" (BenchmarkBwrapTrue's), so that
// both see the same load, and reports each one's mean and their ratio
// (x-bwrap): the provider's overhead over the sandbox itself, measured side
// by side in one run. Its execs are forked by the workspace's resident
// (the default): no bwrap per exec.
func BenchmarkExecLocalVsBwrap(b *testing.B) {
	benchExecLocalVsBwrap(b, local.Config{DataDir: b.TempDir()})
}

// BenchmarkExecLocalVsBwrapOwn is BenchmarkExecLocalVsBwrap with a bwrap
// of its own per exec (local.Config.BwrapExec).
func BenchmarkExecLocalVsBwrapOwn(b *testing.B) {
	benchExecLocalVsBwrap(b, local.Config{DataDir: b.TempDir(), BwrapExec: true})
}

func benchExecLocalVsBwrap(b *testing.B, c local.Config) {
	p, err := local.New(context.Background(), c, providers.Env{BrokerID: "bench"})
	if err != nil {
		b.Fatalf("local.New: %v", err)
	}
	e := rtStart(b, rtOptions{provider: p})
	id := e.acquire(b)
	b.Cleanup(func() { e.do(b, http.MethodDelete, "/v1/workspaces/"+id, "", nil) })
	const body = `{"argv":["true"]}`
	req := benchRequest(b, e, http.MethodPost, "/v1/workspaces/"+id+"/exec", body, nil)
	bare := bareBwrap(b)
	benchSend(b, e, req, body, http.StatusOK) // warm: the disk image's first mount
	execVsBwrap(b, e, req, body, bare)
}

// BenchmarkExecBwrapProviderVsBwrap is BenchmarkExecLocalVsBwrap with a
// provider whose Exec runs the bare bwrap itself, from a goroutine of its
// own, as the local provider's launching thread does: its x-bwrap is the
// gateway's own share of an exec beside a bare bwrap, the floor of
// ExecLocalVsBwrap's.
func BenchmarkExecBwrapProviderVsBwrap(b *testing.B) {
	bare := bareBwrap(b)
	e := rtStart(b, rtOptions{provider: bwrapProvider{noop.New("bench"), bare}})
	id := e.acquire(b)
	const body = `{"argv":["true"]}`
	req := benchRequest(b, e, http.MethodPost, "/v1/workspaces/"+id+"/exec", body, nil)
	benchSend(b, e, req, body, http.StatusOK)
	execVsBwrap(b, e, req, body, bare)
}

// execVsBwrap alternates the exec request req with the bare bwrap, so that
// both see the same load, and reports each one's mean and their ratio.
func execVsBwrap(b *testing.B, e *rtEnv, req *http.Request, body string, bare []string) {
	var execs, bwraps time.Duration
	for b.Loop() {
		t0 := time.Now()
		benchSend(b, e, req, body, http.StatusOK)
		t1 := time.Now()
		runBare(b, bare)
		execs, bwraps = execs+t1.Sub(t0), bwraps+time.Since(t1)
	}
	b.ReportMetric(float64(execs.Nanoseconds())/float64(b.N), "exec-ns")
	b.ReportMetric(float64(bwraps.Nanoseconds())/float64(b.N), "bwrap-ns")
	b.ReportMetric(float64(execs)/float64(bwraps), "x-bwrap")
}

// bwrapProvider is the noop provider with an Exec that runs argv, the bare
// bwrap, and reports its exit code.
type bwrapProvider struct {
	*noop.Provider
	argv []string
}

func (p bwrapProvider) Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	done := make(chan error, 1)
	go func() { done <- exec.CommandContext(ctx, p.argv[0], p.argv[1:]...).Run() }()
	if err := <-done; err != nil {
		return providers.ExecResult{}, err
	}
	return providers.ExecResult{}, nil
}

// bareBwrap returns the bare bwrap command line of "true" with the local
// provider's namespaces.
func bareBwrap(b *testing.B) []string {
	argv, err := bwrapfloor.Command("true")
	if err != nil {
		b.Fatal(err)
	}
	return argv
}

func runBare(b *testing.B, argv []string) {
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		b.Fatalf("bwrap true: %v: %s", err, out)
	}
}

func benchExec(b *testing.B, e *rtEnv) {
	id := e.acquire(b)
	b.Cleanup(func() { e.do(b, http.MethodDelete, "/v1/workspaces/"+id, "", nil) })
	const body = `{"argv":["true"]}`
	req := benchRequest(b, e, http.MethodPost, "/v1/workspaces/"+id+"/exec", body, nil)
	e.rt.reset()
	for b.Loop() {
		benchSend(b, e, req, body, http.StatusOK)
	}
	e.settled(b) // the last exec's end, recorded after its answer
	benchReport(b, e)
}

// benchRequest builds an authenticated request; benchSend gives it a body.
func benchRequest(b *testing.B, e *rtEnv, method, path, body string, hdr http.Header) *http.Request {
	b.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.tok.Reveal())
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	return req
}

// benchSend sends req with body and fails unless the status is want. It
// drains the response so that the connection is reused.
func benchSend(b *testing.B, e *rtEnv, req *http.Request, body string, want int) {
	if body != "" {
		req.Body, req.ContentLength = io.NopCloser(strings.NewReader(body)), int64(len(body))
	}
	resp, err := e.client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		b.Fatalf("%s %s = %d; want %d", req.Method, req.URL.Path, resp.StatusCode, want)
	}
}
