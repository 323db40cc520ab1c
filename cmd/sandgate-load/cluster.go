package main

// -cluster mode: acquire/release cycles across several `sandgate serve`
// processes sharing one Redis (one redis-server, or a Redis Cluster of
// three primaries with a replica each), at a concurrency above every
// instance's max_concurrent_workspaces, with the noop provider (-provider
// noop, the default: a create and a release cost nothing, so the figures
// are the broker's and Redis's) or the local provider (-provider local: a
// create is a directory and a disk image, a release removes them). It checks what the broker
// promises: no instance ever holds more acknowledged workspaces than its
// limit, every account's money reconciles to the micro-unit, and every
// instance's concurrency slots are exactly its live records at the end.
// With -chaos the primary of one instance's slot is killed (SIGKILL)
// mid-run; its replica takes over, the dead node comes back as a replica,
// and the run goes on without restarting a gateway. With -compare it
// measures throughput for 1 and N gateways on one Redis and on the
// cluster, alternating, and prints the ratios.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/token"
)

// clusterOpts are the knobs of -cluster mode.
type clusterOpts struct {
	bin         string
	cycles      int           // acquire/release cycles in all
	gateways    int           // sandgate serve processes
	instances   int           // instances (each of its own account)
	max         int           // every instance's max_concurrent_workspaces
	concurrency int           // clients in flight; 0 means 3 × max × instances
	chaos       bool          // kill a primary mid-run
	compare     bool          // throughput: 1 vs N gateways, single vs cluster
	single      bool          // run on one redis-server instead of the cluster
	hold        time.Duration // how long a client keeps each workspace
	duration    time.Duration // no new cycle starts after this long; 0 means no bound
	provider    string        // kind of the gateways' one provider: noop or local
}

// providerYML is the gateways' provider config for o.provider, and the
// provider name instances record.
func (o clusterOpts) providerYML() (yml, name string, err error) {
	switch o.provider {
	case "", "noop":
		return "providers: [{name: bench, kind: noop}]\ndefault_provider: bench", "bench", nil
	case "local":
		return "provider: {name: local}", "local", nil
	}
	return "", "", fmt.Errorf("-provider %q: want noop or local", o.provider)
}

func runCluster(ctx context.Context, o clusterOpts) error {
	dir, bin, err := workDir(ctx, "sandgate-load-cluster-", o.bin)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	o.bin = bin
	if o.concurrency == 0 {
		o.concurrency = 3 * o.max * o.instances
	}
	if !o.compare {
		r, err := clusterRun(ctx, dir, o, !o.single, o.gateways, o.chaos)
		if err != nil {
			return err
		}
		r.print(o)
		return r.verdict()
	}
	// Throughput: each setup in turn, twice, alternating, so that the
	// machine's load is shared; the ratios use the sum of both rounds.
	type setup struct {
		cluster  bool
		gateways int
	}
	setups := []setup{{false, 1}, {true, 1}, {false, o.gateways}, {true, o.gateways}}
	rate := map[setup][2]float64{}
	for round := range 2 {
		for i, s := range setups {
			r, err := clusterRun(ctx, filepath.Join(dir, fmt.Sprintf("r%d-%d", round, i)), o, s.cluster, s.gateways, false)
			if err != nil {
				return err
			}
			if err := r.verdict(); err != nil {
				return err
			}
			v := rate[s]
			v[0] += float64(r.cycles)
			v[1] += r.elapsed.Seconds()
			rate[s] = v
			fmt.Printf("round %d: %s, %d gateway(s): %d cycles in %s (%.0f/s), load %s\n",
				round+1, map[bool]string{false: "one redis-server", true: "cluster"}[s.cluster], s.gateways,
				r.cycles, r.elapsed.Round(time.Millisecond), float64(r.cycles)/r.elapsed.Seconds(), loadavg())
		}
	}
	per := func(s setup) float64 { return rate[s][0] / rate[s][1] }
	fmt.Printf("\n| setup | cycles/s | ratio |\n| --- | ---: | ---: |\n")
	base := per(setups[0])
	for _, s := range setups {
		fmt.Printf("| %s, %d gateway(s) | %.0f | %.2f |\n", map[bool]string{false: "one redis-server", true: "cluster"}[s.cluster], s.gateways, per(s), per(s)/base)
	}
	fmt.Printf("| %d gateways ÷ 1, one redis-server | — | %.2f |\n", o.gateways, per(setups[2])/per(setups[0]))
	fmt.Printf("| %d gateways ÷ 1, cluster | — | %.2f |\n", o.gateways, per(setups[3])/per(setups[1]))
	fmt.Printf("| cluster ÷ one redis-server, 1 gateway | — | %.2f |\n", per(setups[1])/per(setups[0]))
	fmt.Printf("| cluster ÷ one redis-server, %d gateways | — | %.2f |\n", o.gateways, per(setups[3])/per(setups[2]))
	return nil
}

// result is what one run saw.
type result struct {
	cycles       int
	elapsed      time.Duration
	overAdmitted int64 // acknowledged acquires past an instance's limit
	peak         int64 // most acknowledged workspaces of one instance at once
	limited      int64 // 429 concurrency_limit (retried)
	unavailable  int64 // 503 admission_unavailable (retried)
	busy         int64 // 503 unavailable: the provider had no capacity (retried)
	timeouts     int64 // requests the broker did not answer within the client's timeout (retried)
	otherErrors  []string
	drift        []string // money and slots that do not reconcile
	killedAt     time.Duration
	recovered    time.Duration // from the kill to the first acquire after it
	failClosed   time.Duration // from the kill to the restart of the dead node
	unavailAfter int64         // 503s after the kill
}

func (r *result) print(o clusterOpts) {
	fmt.Printf("cycles: %d in %s (%.0f/s); load %s\n", r.cycles, r.elapsed.Round(time.Millisecond), float64(r.cycles)/r.elapsed.Seconds(), loadavg())
	fmt.Printf("concurrency %d over %d instances of max %d: peak %d held, %d over-admissions\n", o.concurrency, o.instances, o.max, r.peak, r.overAdmitted)
	fmt.Printf("refused and retried: %d concurrency_limit, %d admission_unavailable, %d unavailable (provider capacity), %d client timeouts (%s)\n",
		r.limited, r.unavailable, r.busy, r.timeouts, clientTimeout)
	if r.killedAt > 0 {
		fmt.Printf("chaos: primary killed at %s; %d admission_unavailable after it; dead node restarted %s after the kill; first acquire after the kill %s after it\n",
			r.killedAt.Round(time.Millisecond), r.unavailAfter, r.failClosed.Round(time.Millisecond), r.recovered.Round(time.Millisecond))
	}
	fmt.Printf("money and slots: %d disagreement(s)\n", len(r.drift))
	for _, d := range r.drift {
		fmt.Println("  drift:", d)
	}
	for _, e := range r.otherErrors {
		fmt.Println("  error:", e)
	}
}

func (r *result) verdict() error {
	switch {
	case r.overAdmitted > 0:
		return fmt.Errorf("%d over-admissions", r.overAdmitted)
	case len(r.drift) > 0:
		return fmt.Errorf("%d disagreements in money or slots", len(r.drift))
	case len(r.otherErrors) > 0:
		return fmt.Errorf("%d unexpected errors", len(r.otherErrors))
	}
	return nil
}

// clientTimeout bounds one request of the load's clients; a request past
// it is counted and retried with a new key (its workspace, if created,
// stays until the reaper or the checks see it).
const clientTimeout = time.Minute

// tenant is one account with one instance and its token.
type tenant struct {
	acct, inst, token string
	mu                sync.Mutex
	held              int // acknowledged acquires whose release has not begun
}

func clusterRun(ctx context.Context, dir string, o clusterOpts, cluster bool, gateways int, chaos bool) (*result, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	var (
		rdb      redis.UniversalClient
		c        *redistest.Cluster
		redisYML string
	)
	if cluster {
		var err error
		if c, err = redistest.NewCluster(ctx, filepath.Join(dir, "redis")); err != nil {
			return nil, err
		}
		defer c.Close()
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, ClusterStateReloadInterval: time.Second})
		redisYML = fmt.Sprintf("{mode: cluster, addrs: [%s], wait: {replicas: 1, timeout: 500ms}}", strings.Join(c.Addrs, ", "))
	} else {
		addr, stop, err := startRedis(ctx, filepath.Join(dir, "redis"))
		if err != nil {
			return nil, err
		}
		defer stop()
		rdb = redis.NewClient(&redis.Options{Addr: addr})
		redisYML = fmt.Sprintf("{addr: %q}", addr)
	}
	defer rdb.Close()
	db := store.New(store.Config{}, rdb)
	bill := billing.New(billing.Config{}, billing.Deps{DB: db})
	tenants, funds, err := setupTenants(ctx, db, bill, o)
	if err != nil {
		return nil, err
	}

	provYML, _, err := o.providerYML()
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "sandgate.yaml")
	yml := fmt.Sprintf(`listen: "127.0.0.1:0"
admin_listen: "127.0.0.1:0"
data_dir: %q
broker_id: sandgate-load
tls: {trusted_proxies: [127.0.0.1/32]}
redis: %s
%s
admission:
  timeout: 2s
  risk: {acquires_per_minute: 100000000, max_open_workspaces: 100000000}
  rate_limits: {read: {per_second: 1000000, burst: 1000000}, acquire: {per_second: 1000000, burst: 1000000}, exec: {per_second: 1000000, burst: 1000000}}
log: {level: info}
`, filepath.Join(dir, "data"), redisYML, provYML)
	if err := os.WriteFile(cfg, []byte(yml), 0o600); err != nil {
		return nil, err
	}
	var urls []string
	for i := range gateways {
		u, stop, err := startGateway(ctx, o.bin, cfg, filepath.Join(dir, fmt.Sprintf("gateway%d.log", i)))
		if err != nil {
			return nil, err
		}
		defer stop()
		urls = append(urls, u)
	}

	r := &result{}
	hc := &http.Client{Timeout: clientTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: o.concurrency}}
	var (
		next     atomic.Int64
		done     atomic.Int64
		killedAt atomic.Int64 // unix ns of the kill; 0 before
		firstOK  atomic.Int64 // unix ns of the first acquire after the kill
		errMu    sync.Mutex
	)
	fail := func(s string) {
		errMu.Lock()
		if len(r.otherErrors) < 20 {
			r.otherErrors = append(r.otherErrors, s)
		}
		errMu.Unlock()
	}
	start := time.Now()
	// Cycles stop starting at the duration bound (or ctx's end), so that
	// the checks below always run.
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	if o.duration > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(runCtx, o.duration)
		defer cancel()
	}
	var wg sync.WaitGroup
	for w := range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil && next.Add(1) <= int64(o.cycles) {
				t := tenants[rand.IntN(len(tenants))]
				key := sandgate.NewID("k")
				for runCtx.Err() == nil {
					gw := urls[rand.IntN(len(urls))]
					status, body, err := call(ctx, hc, http.MethodPost, gw+"/v1/workspaces", t.token, key,
						protocol.AcquireRequest{Label: "load", Egress: &protocol.Egress{AllowedDomains: []string{}}})
					if err != nil {
						if errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "Client.Timeout") {
							atomic.AddInt64(&r.timeouts, 1)
						} else {
							fail(err.Error())
						}
						key = sandgate.NewID("k")
						time.Sleep(50 * time.Millisecond)
						continue
					}
					if status == http.StatusCreated || status == http.StatusOK {
						var ws protocol.Workspace
						if err := json.Unmarshal(body, &ws); err != nil {
							fail("acquire body: " + err.Error())
							break
						}
						if k := killedAt.Load(); k != 0 {
							firstOK.CompareAndSwap(0, time.Now().UnixNano())
						}
						t.mu.Lock()
						t.held++
						h := int64(t.held)
						t.mu.Unlock()
						if h > int64(o.max) {
							atomic.AddInt64(&r.overAdmitted, 1)
						}
						for p := atomic.LoadInt64(&r.peak); h > p && !atomic.CompareAndSwapInt64(&r.peak, p, h); p = atomic.LoadInt64(&r.peak) {
						}
						time.Sleep(o.hold) // the client uses its workspace a moment
						release(ctx, hc, urls, t, ws.WorkspaceID, fail)
						done.Add(1)
						break
					}
					var pe protocol.Error
					_ = json.Unmarshal(body, &struct {
						Error *protocol.Error `json:"error"`
					}{&pe})
					switch {
					case status == http.StatusTooManyRequests && pe.Code == protocol.ConcurrencyLimit:
						atomic.AddInt64(&r.limited, 1)
						time.Sleep(time.Duration(10+rand.IntN(20)) * time.Millisecond)
					case status == http.StatusServiceUnavailable && pe.Code == protocol.AdmissionUnavailable:
						atomic.AddInt64(&r.unavailable, 1)
						if killedAt.Load() != 0 {
							atomic.AddInt64(&r.unavailAfter, 1)
						}
						// A new key: this one may hold a pending claim the reaper frees.
						key = sandgate.NewID("k")
						time.Sleep(50 * time.Millisecond)
					case status == http.StatusServiceUnavailable && pe.Code == protocol.Unavailable:
						atomic.AddInt64(&r.busy, 1)
						key = sandgate.NewID("k")
						time.Sleep(100 * time.Millisecond)
					case status == http.StatusConflict:
						key = sandgate.NewID("k") // the key's acquire is still in progress elsewhere
					default:
						fail(fmt.Sprintf("acquire: %d %s", status, bytes.TrimSpace(body)))
						key = sandgate.NewID("k")
						time.Sleep(50 * time.Millisecond)
					}
				}
			}
			_ = w
		}()
	}
	if chaos && c != nil {
		for done.Load() < int64(o.cycles/3) && runCtx.Err() == nil && (o.duration == 0 || time.Since(start) < o.duration/3) {
			time.Sleep(10 * time.Millisecond)
		}
		live := store.AdmissionKeys(tenants[0].acct, tenants[0].inst, "", "").Live
		dead, err := c.KillPrimaryOf(ctx, live)
		if err != nil {
			return nil, err
		}
		k := time.Now()
		killedAt.Store(k.UnixNano())
		r.killedAt = k.Sub(start)
		if err := c.WaitFailover(ctx); err != nil {
			return nil, err
		}
		// The promoted replica has no replica of its own: admission on
		// its slots fails closed until the dead node is back.
		time.Sleep(2 * time.Second)
		if err := c.Restart(dead); err != nil {
			return nil, err
		}
		r.failClosed = time.Since(k)
		if err := c.WaitHealthy(ctx); err != nil {
			return nil, err
		}
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	r.cycles = int(done.Load())
	if f := firstOK.Load(); f != 0 {
		r.recovered = time.Duration(f - killedAt.Load())
	}
	// A bound reached mid-cycle left its release to finish above; the
	// checks get a context of their own (reconcile bounds itself).
	r.drift = reconcile(context.WithoutCancel(ctx), db, bill, tenants, funds)
	return r, nil
}

// release deletes a workspace through any gateway until one answers.
func release(ctx context.Context, hc *http.Client, urls []string, t *tenant, id string, fail func(string)) {
	t.mu.Lock()
	t.held-- // from the first attempt the slot may be free on the server
	t.mu.Unlock()
	for ctx.Err() == nil {
		status, body, err := call(ctx, hc, http.MethodDelete, urls[rand.IntN(len(urls))]+"/v1/workspaces/"+id, t.token, "", nil)
		if err == nil && status == http.StatusOK {
			return
		}
		if err == nil && status != http.StatusServiceUnavailable {
			fail(fmt.Sprintf("release: %d %s", status, bytes.TrimSpace(body)))
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// reconcile waits (bounded) until every account's money reconciles and
// every instance's slots are its live records, and returns what still
// disagrees.
func reconcile(ctx context.Context, db *store.DB, bill *billing.Billing, tenants []*tenant, funds int64) []string {
	deadline := time.Now().Add(90 * time.Second)
	for {
		var drift []string
		for _, t := range tenants {
			rep, err := bill.Reconcile(ctx, t.acct)
			if err != nil {
				drift = append(drift, t.acct+": reconcile: "+err.Error())
				continue
			}
			for _, d := range rep.Drift {
				drift = append(drift, t.acct+": "+d)
			}
			if got := rep.Stored.CreditsMicros; got != funds {
				drift = append(drift, fmt.Sprintf("%s: credits %d; want %d", t.acct, got, funds))
			}
			if s := rep.Stored; s.BalanceMicros != s.CreditsMicros-s.DebitsMicros-s.SettledMicros {
				drift = append(drift, fmt.Sprintf("%s: balance %d ≠ credits %d − debits %d − settled %d", t.acct, s.BalanceMicros, s.CreditsMicros, s.DebitsMicros, s.SettledMicros))
			}
			ws, err := db.Workspaces(ctx, t.acct, t.inst, true, time.Now())
			if err != nil {
				drift = append(drift, t.acct+": workspaces: "+err.Error())
				continue
			}
			live := map[string]bool{}
			for _, w := range ws {
				if w.State == sandgate.WorkspaceStarting || w.State == sandgate.WorkspaceRunning {
					live[w.ID] = true
				}
			}
			slots, err := db.Redis().ZRange(ctx, store.AdmissionKeys(t.acct, t.inst, "", "").Live, 0, -1).Result()
			if err != nil {
				drift = append(drift, t.acct+": slots: "+err.Error())
				continue
			}
			for _, s := range slots {
				if !live[s] {
					drift = append(drift, fmt.Sprintf("%s: slot %s without a live record", t.inst, s))
				}
				delete(live, s)
			}
			for id := range live {
				drift = append(drift, fmt.Sprintf("%s: live record %s without a slot", t.inst, id))
			}
		}
		if len(drift) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return drift
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// setupTenants creates the accounts, instances and tokens, prepaid on a
// priced rate card, directly in Redis (as `sandgate dev` bootstraps).
func setupTenants(ctx context.Context, db *store.DB, bill *billing.Billing, o clusterOpts) ([]*tenant, int64, error) {
	_, provName, err := o.providerYML()
	if err != nil {
		return nil, 0, err
	}
	now := time.Now().UTC()
	card := "load"
	if _, err := bill.CreateRateCard(ctx, card, "USD", map[string]int64{"small": 10, "standard": 20, "large": 40, "xlarge": 80}, now); err != nil {
		return nil, 0, fmt.Errorf("rate card: %w", err)
	}
	const funds = 1_000_000_000 // 1000.00 in micro-units
	var out []*tenant
	for i := range o.instances {
		t := &tenant{acct: sandgate.NewID(sandgate.PrefixAccount), inst: sandgate.NewID(sandgate.PrefixInstance)}
		if err := db.CreateAccount(ctx, sandgate.Account{ID: t.acct, Name: "load-" + strconv.Itoa(i), CreatedAt: now}); err != nil {
			return nil, 0, err
		}
		limits := sandgate.DefaultLimits
		limits.MaxConcurrentWorkspaces = o.max
		in := sandgate.Instance{ID: t.inst, AccountID: t.acct, Name: "load", Provider: provName,
			Scope: sandgate.Scope{EgressCeiling: []string{}, Limits: limits}, CreatedAt: now}
		if err := db.PutInstance(ctx, in); err != nil {
			return nil, 0, err
		}
		tok := token.New(token.Prefix)
		t.token = tok.Reveal()
		l := sandgate.Lease{ID: sandgate.NewID(sandgate.PrefixLease), TokenHash: token.Hash(tok), TokenPrefix: token.DisplayPrefix(tok),
			InstanceID: t.inst, AccountID: t.acct, IssuedAt: now}
		if err := db.IssueLease(ctx, l, false, now, 0); err != nil {
			return nil, 0, err
		}
		if err := bill.SetSettings(ctx, billing.Settings{AccountID: t.acct, RateCard: card, Currency: "USD"}); err != nil {
			return nil, 0, err
		}
		if _, _, err := bill.Adjust(ctx, t.acct, billing.FundsEntry{Key: "load", Kind: billing.KindCredit, AmountMicros: funds,
			Reason: "sandgate-load", Actor: "sandgate-load", At: now}); err != nil {
			return nil, 0, err
		}
		out = append(out, t)
	}
	return out, funds, nil
}

// call sends one request as a TLS-terminating proxy would forward it.
func call(ctx context.Context, hc *http.Client, method, url, tok, key string, in any) (int, []byte, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("X-Forwarded-Proto", "https")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// startGateway runs `sandgate serve` and returns its public URL once it
// listens.
func startGateway(ctx context.Context, bin, cfg, logPath string) (string, func(), error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "serve", "--config", cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return "", nil, err
	}
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(50 * time.Millisecond) {
		f, err := os.Open(logPath)
		if err != nil {
			break
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var line struct {
				Msg    string `json:"msg"`
				Listen string `json:"listen"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "sandgate listening" {
				f.Close()
				return "http://" + line.Listen, stop, nil
			}
		}
		f.Close()
	}
	stop()
	b, _ := os.ReadFile(logPath)
	return "", nil, fmt.Errorf("sandgate serve did not listen: %s", tail(string(b), 2000))
}

// startRedis runs one redis-server (AOF on) on a free port under dir.
func startRedis(ctx context.Context, dir string) (string, func(), error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--protected-mode", "no", "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	for i := 0; ; i++ {
		if err := rdb.Ping(ctx).Err(); err == nil {
			return addr, stop, nil
		} else if i == 200 {
			stop()
			return "", nil, fmt.Errorf("redis-server did not answer: %w", err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
