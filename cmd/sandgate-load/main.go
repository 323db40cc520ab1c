// Command sandgate-load measures the broker's memory under exec output: it
// builds sandgate, starts a real `sandgate dev` (embedded store, local
// bubblewrap provider, default in-flight caps), and reads the broker
// process's peak resident set (VmHWM in /proc/PID/status) while one
// workspace runs first one exec, the baseline, then many at once, each
// printing 2 × N bytes (stdout and stderr). A refused exec (429) is retried
// after its Retry-After, as a client would, until every exec has run. It
// runs once and exits; it is bounded by -timeout. With -before REV it first
// measures the broker of that revision the same way, for comparison.
//
//	go run ./cmd/sandgate-load -execs 40 -bytes 4194304 [-before REV]
//
// With -noisy it measures noisy neighbours instead (noisy.go): the
// latency of `exec true` in one small workspace, quiet and then while a
// second one keeps a fork tree at its process cap and a third allocates
// past its memory limit.
//
//	go run ./cmd/sandgate-load -noisy [-n 200] [-hold 300s]
//
// With -acquire it measures acquire + release throughput instead
// (acquire.go): a real `sandgate serve` over a private redis-server with
// one provider of kind noop, C clients running N acquire+release pairs,
// alternating with redis-benchmark's EVALSHA of `return 1` on the same
// server, reported as their ratio.
//
//	go run ./cmd/sandgate-load -acquire [-pairs 2000] [-c 8] [-rounds 3] [-log-level info]
//
// With -cluster it runs acquire/release cycles across several `sandgate
// serve` processes on a Redis Cluster it starts (cluster.go): no
// over-admission, money reconciled, slots equal to live records; -chaos
// kills a primary mid-run, -compare measures 1 vs N gateways and one
// redis-server vs the cluster.
//
//	go run ./cmd/sandgate-load -cluster [-cycles 10000] [-gateways 3] [-chaos | -compare]
//
// With -idle it measures what idle local workspaces cost the host
// (idle.go): host CPU from /proc/stat over a window with none, then with n
// live idle workspaces.
//
//	go run ./cmd/sandgate-load -idle -n 1000 [-window 30s]
//
// With -ttfc it measures time to first command (ttfc.go). -ttfc and
// -acquire, whose targets include absolute times, first print what the
// host charges for a page fault, a system call, a wake-up and a process
// start (host.go), so that sittings on different days can be compared.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/protocol"
)

func main() {
	execs := flag.Int("execs", 40, "execs fired at once in one workspace")
	size := flag.Int64("bytes", 4<<20, "bytes each exec prints on stdout and again on stderr")
	bin := flag.String("sandgate", "", "sandgate binary to run; empty builds ./cmd/sandgate")
	before := flag.String("before", "", "also measure the broker of this git revision (built from git archive), for comparison; -acquire alternates it with this build in each round")
	timeout := flag.Duration("timeout", 10*time.Minute, "bound of the whole run")
	noisy := flag.Bool("noisy", false, "measure noisy neighbours instead: exec true latency in one workspace, quiet and beside a fork tree and a memory hog")
	n := flag.Int("n", 200, "-noisy: sequential `exec true` per phase; -idle: idle workspaces; -ttfc: cycles (default 50)")
	files := flag.Bool("files", false, "measure file transfers instead: -c clients each writing then reading a file of -size bytes")
	clients := flag.Int("c", 0, "-files, -acquire: clients at once (default 16 for -files, 8 for -acquire)")
	fileSize := flag.Int64("size", 8<<20, "-files: bytes of each client's file")
	hold := flag.Duration("hold", 300*time.Second, "-noisy: the neighbours' durable commands' timeout (they are cancelled before)")
	acq := flag.Bool("acquire", false, "measure acquire+release throughput with the noop provider beside redis-benchmark EVALSHA instead")
	pairs := flag.Int("pairs", 2000, "-acquire: acquire+release pairs per round")
	rounds := flag.Int("rounds", 3, "-acquire: rounds, each redis-benchmark then the broker")
	level := flag.String("log-level", "info", "-acquire: the broker's log level (info writes one line per request)")
	cluster := flag.Bool("cluster", false, "acquire/release cycles across several `sandgate serve` processes on a Redis Cluster (cluster.go)")
	var co clusterOpts
	flag.IntVar(&co.cycles, "cycles", 10000, "-cluster: acquire/release cycles in all")
	flag.IntVar(&co.gateways, "gateways", 3, "-cluster: sandgate serve processes")
	flag.IntVar(&co.instances, "instances", 2, "-cluster: instances, each of its own account")
	flag.IntVar(&co.max, "max", 4, "-cluster: every instance's max_concurrent_workspaces")
	flag.IntVar(&co.concurrency, "concurrency", 0, "-cluster: requests in flight; 0 means 3 × max × instances")
	flag.BoolVar(&co.chaos, "chaos", false, "-cluster: kill -9 the primary of one instance's slot mid-run")
	flag.BoolVar(&co.compare, "compare", false, "-cluster: throughput of 1 and -gateways gateways on one redis-server and on the cluster, alternating")
	flag.DurationVar(&co.hold, "hold-workspace", 20*time.Millisecond, "-cluster: how long a client keeps each workspace before releasing it")
	flag.DurationVar(&co.duration, "duration", 0, "-cluster: start no cycle after this long (per run), then check; 0 means no bound but -timeout")
	flag.BoolVar(&co.single, "single", false, "-cluster: run on one redis-server instead of the cluster")
	flag.StringVar(&co.provider, "provider", "noop", "-cluster: the gateways' provider kind, noop or local")
	idle := flag.Bool("idle", false, "measure idle workspaces instead: host CPU with -n live idle local workspaces against none")
	window := flag.Duration("window", 30*time.Second, "-idle: each measuring window")
	diskMiB := flag.Int("disk-mib", 16, "-idle: each workspace's disk image")
	ttfc := flag.Bool("ttfc", false, "measure time to first command instead: -n (default 50) sequential acquire, exec `echo ready`, release cycles on the local provider beside a bare bwrap")
	pool := flag.Int("pool", 0, "-ttfc: warm workspaces per size and image (0: the pool off)")
	fly := flag.Bool("fly", false, "-ttfc: Fly Machines on the flytest fake instead of the local provider")
	ttfcRedis := flag.Bool("redis", false, "-ttfc: sandgate serve on a redis-server of its own (as in production) instead of sandgate dev and its embedded store")
	floorServe := flag.String("floor-serve", "", "internal, run by -acquire: serve its floor on this address")
	floorDir := flag.String("floor-dir", "", "internal, with -floor-serve: the directory -acquire prepared")
	flag.Parse()
	if *floorServe != "" {
		if err := runFloorServe(*floorServe, *floorDir); err != nil {
			fmt.Fprintln(os.Stderr, "sandgate-load: floor:", err)
			os.Exit(1)
		}
		return
	}
	// SIGINT or SIGTERM ends the run early and still stops what it started.
	sctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(sctx, *timeout)
	defer cancel()
	var err error
	switch {
	case *ttfc:
		cycles := 50
		flag.Visit(func(f *flag.Flag) {
			if f.Name == "n" {
				cycles = *n
			}
		})
		err = runTTFC(ctx, ttfcOptions{bin: *bin, n: cycles, pool: *pool, fly: *fly, redis: *ttfcRedis})
	case *acq:
		err = runAcquire(ctx, acquireOptions{bin: *bin, n: *pairs, c: orDefault(*clients, 8), rounds: max(*rounds, 1), level: *level, before: *before})
	case *files:
		err = runFiles(ctx, *bin, *before, orDefault(*clients, 16), *fileSize)
	case *cluster:
		co.bin = *bin
		err = runCluster(ctx, co)
	case *idle:
		err = runIdle(ctx, *n, *window, *diskMiB)
	case *noisy:
		err = runNoisy(ctx, *bin, *n, *hold)
	default:
		err = run(ctx, *bin, *before, *execs, *size)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandgate-load:", err)
		os.Exit(1)
	}
}

// broker is the running `sandgate dev`.
type broker struct {
	cmd   *exec.Cmd
	url   string
	token string
	hc    *http.Client
	env   map[string]string // dev.env
	logs  string            // the broker's stderr
	halt  func()            // stops a broker started otherwise than by cmd

	unavailable atomic.Int64 // -files: 503s retried
}

func run(ctx context.Context, bin, before string, execs int, size int64) error {
	dir, bin, err := workDir(ctx, "sandgate-load-", bin)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var old *figures
	if before != "" {
		oldBin, err := buildBefore(ctx, dir, before)
		if err != nil {
			return err
		}
		f, err := measure(ctx, oldBin, filepath.Join(dir, "data-before"), execs, size)
		if err != nil {
			return fmt.Errorf("before (%s): %w", before, err)
		}
		old = &f
	}
	f, err := measure(ctx, bin, filepath.Join(dir, "data"), execs, size)
	if err != nil {
		return err
	}

	// What the caps admit at once in one workspace: the per-workspace
	// cap, each exec reserving its worst case (both streams at
	// max_output_bytes; the small body is left out).
	perExec := 2 * f.maxOutput
	admitted := int64(min(gateway.DefaultInflightPerWorkspace, gateway.DefaultInflightPerInstance, execs)) * perExec
	admitted = min(admitted, gateway.DefaultInflightBytes)
	mib := func(v int64) string { return fmt.Sprintf("%.1f MiB", float64(v)/(1<<20)) }
	fmt.Printf("workload: %d execs at once in one workspace, each printing 2 × %d bytes (stdout, stderr)\n", execs, size)
	fmt.Printf("caps: %d per workspace, %d per instance, %s budget; max_output_bytes %d; payload admitted at once: %s\n\n",
		gateway.DefaultInflightPerWorkspace, gateway.DefaultInflightPerInstance, mib(gateway.DefaultInflightBytes),
		f.maxOutput, mib(admitted))
	fmt.Printf("| figure | value | ratio |\n| --- | ---: | ---: |\n")
	if old != nil {
		fmt.Printf("| before (%s): RSS at rest | %s | — |\n", before, mib(old.idle))
		fmt.Printf("| before: peak RSS, one exec alone | %s | %.2f × its rest |\n", mib(old.one), float64(old.one)/float64(old.idle))
		fmt.Printf("| before: peak RSS, %d execs at once (%d refused, %s) | %s | %.2f × its one-exec peak |\n",
			execs, old.refusals, old.elapsed.Round(time.Millisecond), mib(old.peak), float64(old.peak)/float64(old.one))
	}
	fmt.Printf("| RSS at rest (after a warm-up exec) | %s | — |\n", mib(f.idle))
	fmt.Printf("| peak RSS, one exec alone (baseline) | %s | %.2f × rest |\n", mib(f.one), float64(f.one)/float64(f.idle))
	fmt.Printf("| peak RSS, %d execs at once (%d refusals with 429 retried; %s) | %s | %.2f × baseline |\n",
		execs, f.refusals, f.elapsed.Round(time.Millisecond), mib(f.peak), float64(f.peak)/float64(f.one))
	fmt.Printf("| peak RSS ÷ payload admitted at once (%s) | — | %.2f |\n", mib(admitted), float64(f.peak)/float64(admitted))
	fmt.Printf("| (peak − rest) ÷ payload admitted at once | — | %.2f |\n", float64(f.peak-f.idle)/float64(admitted))
	if old != nil {
		fmt.Printf("| peak RSS now ÷ before | — | %.3f |\n", float64(f.peak)/float64(old.peak))
	}
	if f.peak >= 512<<20 || f.peak > 3*admitted {
		return fmt.Errorf("peak RSS %s is not under 512 MiB and within 3× %s", mib(f.peak), mib(admitted))
	}
	return nil
}

// buildBefore builds the broker as of revision rev, from `git archive` in
// a directory under dir, and returns the binary.
func buildBefore(ctx context.Context, dir, rev string) (string, error) {
	src := filepath.Join(dir, "before")
	if err := os.MkdirAll(src, 0o700); err != nil {
		return "", err
	}
	archive := exec.CommandContext(ctx, "sh", "-c", `git archive "$1" | tar -x -C "$2"`, "sh", rev, src)
	archive.Stderr = os.Stderr
	if err := archive.Run(); err != nil {
		return "", fmt.Errorf("git archive %s: %w", rev, err)
	}
	oldBin := filepath.Join(dir, "sandgate-before")
	if err := build(ctx, src, oldBin); err != nil {
		return "", err
	}
	return oldBin, nil
}

// workDir makes the run's temporary directory (named after prefix) and,
// when bin is "", builds ./cmd/sandgate into it: it returns the directory,
// which the caller removes, and the binary to run.
func workDir(ctx context.Context, prefix, bin string) (dir, sandgate string, err error) {
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		return "", "", err
	}
	if bin == "" {
		bin = filepath.Join(dir, "sandgate")
		if err := build(ctx, ".", bin); err != nil {
			os.RemoveAll(dir)
			return "", "", err
		}
	}
	return dir, bin, nil
}

// build builds the broker as `make build` and the Dockerfile do, so that
// what is measured is what ships: a static binary (CGO_ENABLED=0; a cgo
// build starts through the dynamic loader, which costs each local
// resident's start about 3 ms more here), without symbol tables.
func build(ctx context.Context, dir, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, "./cmd/sandgate")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build in %s: %w", dir, err)
	}
	return nil
}

// figures are one broker's measurements.
type figures struct {
	maxOutput int64 // the lease's max_output_bytes
	idle, one int64 // VmRSS at rest; VmHWM of one exec alone
	peak      int64 // VmHWM of the load
	refusals  int64
	elapsed   time.Duration
}

// measure starts `sandgate dev` from bin over dataDir and runs the
// workload against it: a warm-up exec, the rest, one exec alone, then
// every exec at once.
func measure(ctx context.Context, bin, dataDir string, execs int, size int64) (figures, error) {
	var f figures
	b, err := startDev(ctx, bin, dataDir)
	if err != nil {
		return f, err
	}
	defer b.stop()
	pid := b.cmd.Process.Pid

	var lease protocol.LeaseResponse
	if err := b.call(ctx, http.MethodGet, "/v1/lease", nil, "", &lease); err != nil {
		return f, fmt.Errorf("lease: %w", err)
	}
	f.maxOutput = lease.Limits.MaxOutputBytes
	ws, release, err := b.acquire(ctx, "load")
	if err != nil {
		return f, err
	}
	defer release()
	n := strconv.FormatInt(size, 10)
	req := protocol.ExecRequest{Argv: []string{"sh", "-c", "head -c " + n + " /dev/zero; head -c " + n + " /dev/zero >&2"}}

	// Warm up (TLS, pools, the sandbox's first start), then let the
	// runtime settle, and measure at rest.
	if _, err := b.exec(ctx, ws, req, size); err != nil {
		return f, fmt.Errorf("warm-up exec: %w", err)
	}
	time.Sleep(2 * time.Second)
	if f.idle, err = status(pid, "VmRSS"); err != nil {
		return f, err
	}
	// Baseline: the peak of one exec of the same output, alone.
	if err := resetPeak(pid); err != nil {
		return f, err
	}
	if _, err := b.exec(ctx, ws, req, size); err != nil {
		return f, fmt.Errorf("baseline exec: %w", err)
	}
	if f.one, err = status(pid, "VmHWM"); err != nil {
		return f, err
	}
	// Load: every exec at once; refusals retried after Retry-After.
	time.Sleep(2 * time.Second)
	if err := resetPeak(pid); err != nil {
		return f, err
	}
	start := time.Now()
	f.refusals, err = concurrently(execs, func(int) (int64, error) {
		r, err := b.exec(ctx, ws, req, size)
		return int64(r), err
	})
	f.elapsed = time.Since(start)
	if err != nil {
		return f, fmt.Errorf("load exec: %w", err)
	}
	f.peak, err = status(pid, "VmHWM")
	return f, err
}

// acquire acquires a workspace labelled label, with no egress, under a
// fresh idempotency key; release releases it, even once ctx has ended.
func (b *broker) acquire(ctx context.Context, label string) (ws string, release func(), err error) {
	var w protocol.Workspace
	if err := b.call(ctx, http.MethodPost, "/v1/workspaces", protocol.AcquireRequest{Label: label,
		Egress: &protocol.Egress{AllowedDomains: []string{}}}, label+"-"+strconv.FormatInt(time.Now().UnixNano(), 36), &w); err != nil {
		return "", nil, fmt.Errorf("acquire: %w", err)
	}
	return w.WorkspaceID, func() {
		b.call(context.WithoutCancel(ctx), http.MethodDelete, "/v1/workspaces/"+w.WorkspaceID, nil, "", nil)
	}, nil
}

// concurrently runs f(0) to f(n-1) all at once; it returns the refusals
// they retried, added up, and the first error one of them returned.
func concurrently(n int, f func(i int) (refused int64, err error)) (int64, error) {
	var wg sync.WaitGroup
	var refusals atomic.Int64
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			r, err := f(i)
			refusals.Add(r)
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	return refusals.Load(), <-errs
}

// startDev starts `sandgate dev` on free loopback ports and waits for its
// dev.env.
func startDev(ctx context.Context, bin, dataDir string, overrides ...string) (*broker, error) {
	cmd := exec.Command(bin, "dev", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir", dataDir)
	if len(overrides) > 0 { // KEY=value: SANDGATE_* overrides of the broker's config
		cmd.Env = append(os.Environ(), overrides...)
	}
	cmd.Stdout = io.Discard
	logs, err := os.Create(dataDir + ".log")
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	env := map[string]string{}
	b := &broker{cmd: cmd, env: env, logs: logs.Name()}
	for i := 0; ; i++ {
		if raw, err := os.ReadFile(filepath.Join(dataDir, "dev.env")); err == nil {
			for _, line := range strings.Split(string(raw), "\n") {
				if k, v, ok := strings.Cut(line, "="); ok {
					env[k] = v
				}
			}
			break
		}
		if i == 600 || ctx.Err() != nil {
			b.stop()
			return nil, errors.New("sandgate dev did not write dev.env within 60s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	ca, err := os.ReadFile(env["BROKER_CA"])
	if err != nil {
		b.stop()
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	b.url, b.token = env["BROKER_URL"], env["BROKER_TOKEN"]
	b.hc = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		MaxIdleConnsPerHost: 64}}
	return b, nil
}

func (b *broker) stop() {
	if b.halt != nil {
		b.halt()
		return
	}
	b.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { b.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		b.cmd.Process.Kill()
		<-done
	}
}

// call makes one request and decodes a 2xx body into out.
func (b *broker) call(ctx context.Context, method, path string, in any, key string, out any) error {
	resp, err := b.do(ctx, method, path, in, key)
	if err != nil {
		return err
	}
	defer readClose(resp.Body)
	if resp.StatusCode/100 != 2 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, body)
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// readClose reads what is left of body, then closes it. net/http keeps a
// connection for the next request only when its last response was read to
// the end: closed before (a decoder stops at the end of the JSON value,
// before the newline after it), the connection is dropped and the next
// request pays a new TCP and TLS handshake, which a tool that measures
// over one keep-alive client must not.
func readClose(body io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 1<<20))
	body.Close()
}

func (b *broker) do(ctx context.Context, method, path string, in any, key string) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		raw, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, b.url+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+b.token)
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	if key != "" {
		req.Header.Set(protocol.HeaderIdempotencyKey, key)
	}
	return b.hc.Do(req)
}

// exec runs req until it is admitted, honouring Retry-After on 429 and
// 503, checks that both streams came back whole, and returns how many
// times it was refused.
func (b *broker) exec(ctx context.Context, ws string, req protocol.ExecRequest, size int64) (int, error) {
	for refused := 0; ; refused++ {
		resp, err := b.do(ctx, http.MethodPost, "/v1/workspaces/"+ws+"/exec", req, "")
		if err != nil {
			return refused, err
		}
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
			readClose(resp.Body)
			wait, _ := strconv.Atoi(resp.Header.Get(protocol.HeaderRetryAfter))
			select {
			case <-time.After(time.Duration(max(wait, 1)) * time.Second):
			case <-ctx.Done():
				return refused, ctx.Err()
			}
			continue
		}
		var res protocol.ExecResponse
		err = json.NewDecoder(bufio.NewReader(resp.Body)).Decode(&res)
		readClose(resp.Body)
		if resp.StatusCode != http.StatusOK || err != nil {
			return refused, fmt.Errorf("exec: status %d, %v", resp.StatusCode, err)
		}
		if base64.StdEncoding.DecodedLen(len(res.StdoutB64)) < int(size) || res.StdoutBytes != size || res.StderrBytes != size ||
			res.StdoutTruncated || res.StderrTruncated || res.ExitCode != 0 {
			return refused, fmt.Errorf("exec: exit %d, stdout %d of %d bytes (%d base64), stderr %d, truncated %v/%v",
				res.ExitCode, res.StdoutBytes, size, len(res.StdoutB64), res.StderrBytes, res.StdoutTruncated, res.StderrTruncated)
		}
		return refused, nil
	}
}

// status reads one "kB" field of /proc/PID/status, in bytes.
func status(pid int, field string) (int64, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}

// resetPeak resets the process's VmHWM to its current resident set.
func resetPeak(pid int) error {
	return os.WriteFile("/proc/"+strconv.Itoa(pid)+"/clear_refs", []byte("5"), 0)
}

// orDefault is n, or def when n is not set (0).
func orDefault(n, def int) int {
	if n <= 0 {
		return def
	}
	return n
}
