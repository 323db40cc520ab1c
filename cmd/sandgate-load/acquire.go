package main

// -acquire: acquire + release throughput against a real `sandgate serve`
// whose one provider is of kind noop (nothing runs, so the figure is the
// broker's: HTTP, TLS, admission, billing, Redis), beside redis-benchmark's
// EVALSHA of `return 1` on the same redis-server, alternating, reported as
// a ratio.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandgate/sandgate/internal/logbuf"
	"github.com/sandgate/sandgate/protocol"
)

// acquireOptions bound an -acquire run.
type acquireOptions struct {
	bin    string // sandgate binary; "" builds ./cmd/sandgate
	n      int    // acquire+release pairs per round
	c      int    // concurrent clients
	rounds int    // rounds, each: redis-benchmark, then the broker
	level  string // the broker's log level: info logs a line per request
	before string // a git revision to measure beside bin, alternating; "" for none
}

const adminTokenEnv = "SANDGATE_LOAD_ADMIN_TOKEN"

func runAcquire(ctx context.Context, o acquireOptions) error {
	if _, err := exec.LookPath("redis-benchmark"); err != nil {
		return errors.New("redis-benchmark not found: install redis-tools (Debian: a dependency of redis-server)")
	}
	dir, bin, err := workDir(ctx, "sandgate-load-acquire-", o.bin)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	o.bin = bin
	port, err := freePort()
	if err != nil {
		return err
	}
	redisAddr := "127.0.0.1:" + strconv.Itoa(port)
	rs := exec.CommandContext(ctx, "redis-server", "--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no", "--dir", dir)
	rs.Stdout, rs.Stderr = io.Discard, io.Discard
	if err := rs.Start(); err != nil {
		return fmt.Errorf("redis-server: %w", err)
	}
	defer func() { _ = rs.Process.Kill(); _ = rs.Wait() }()
	if err := waitTCP(ctx, redisAddr); err != nil {
		return err
	}

	srv, err := startServe(ctx, dir, o.bin, redisAddr, noopProvider, o.c, o.level)
	if err != nil {
		return err
	}
	defer srv.stop()
	tok, err := srv.tenant(ctx, o.c)
	if err != nil {
		return err
	}
	srv.token = tok

	// Warm up: load every script into Redis, fill the caches, open the
	// connections.
	if _, err := srv.pairs(ctx, min(o.n, 4*o.c), o.c); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	var old *serve // the broker of o.before, on the same redis-server
	if o.before != "" {
		if old, err = startBefore(ctx, dir, o, redisAddr); err != nil {
			return err
		}
		defer old.stop()
	}
	acqBody, relBody, err := srv.pairBodies(ctx)
	if err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	fl, err := startFloor(ctx, dir, srv, acqBody, relBody)
	if err != nil {
		return err
	}
	defer fl.stop()
	if _, err := fl.pairs(ctx, min(o.n, 4*o.c), o.c); err != nil {
		return fmt.Errorf("floor warm-up: %w", err)
	}
	sha := sha1.Sum([]byte("return 1"))
	load := exec.CommandContext(ctx, "redis-cli", "-h", "127.0.0.1", "-p", strconv.Itoa(port), "SCRIPT", "LOAD", "return 1")
	if out, err := load.CombinedOutput(); err != nil {
		return fmt.Errorf("redis-cli SCRIPT LOAD: %w: %s", err, out)
	}
	fmt.Printf("workload: %d acquire+release pairs per round over %d clients (keep-alive TLS), provider noop, broker log level %s; "+
		"baselines: redis-benchmark -n %d EVALSHA %x 0 on the same redis-server with -c %d (the clients' concurrency) and with -c 1 "+
		"(one connection's rate); %d rounds, alternating\n",
		o.n, o.c, o.level, 10*o.n, sha, o.c, o.rounds)
	fmt.Printf("floor: the same pairs against a minimal net/http TLS server answering the broker's own bodies (floor.go)\n")
	host, err := probeHost()
	if err != nil {
		return err
	}
	fmt.Printf("%s\n\n", host)
	fmt.Printf("| round | EVALSHA req/s (-c %d) | EVALSHA req/s (-c 1) | acquire+release pairs/s | pairs ÷ EVALSHA -c %d | pairs ÷ EVALSHA -c 1 | floor pairs/s | floor ÷ EVALSHA -c %d | pairs ÷ floor |\n"+
		"| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n", o.c, o.c, o.c)
	evalsha := func(clients int) (float64, error) {
		bench := exec.CommandContext(ctx, "redis-benchmark", "-h", "127.0.0.1", "-p", strconv.Itoa(port),
			"-n", strconv.Itoa(10*o.n), "-c", strconv.Itoa(clients), "-q", "evalsha", hex.EncodeToString(sha[:]), "0")
		out, err := bench.Output()
		if err != nil {
			return 0, fmt.Errorf("redis-benchmark: %w", err)
		}
		return benchRate(out)
	}
	var ratios, ratios1, ceilings, budgets []float64
	var costs, oldCosts []processCPU
	var stats [2]commandStats // the last round's, before and after this build's pairs
	for r := range o.rounds {
		es, err := evalsha(o.c)
		if err != nil {
			return err
		}
		es1, err := evalsha(1)
		if err != nil {
			return err
		}
		st0, err := readCommandStats(ctx, port)
		if err != nil {
			return err
		}
		cpu0 := sampleCPU(rs.Process.Pid, srv.cmd.Process.Pid)
		pairs, err := srv.pairs(ctx, o.n, o.c)
		if err != nil {
			return fmt.Errorf("round %d: %w", r+1, err)
		}
		costs = append(costs, sampleCPU(rs.Process.Pid, srv.cmd.Process.Pid).perPair(cpu0, o.n))
		if stats[1], err = readCommandStats(ctx, port); err != nil {
			return err
		}
		stats[0] = st0
		if old != nil {
			cpu0 := sampleCPU(rs.Process.Pid, old.cmd.Process.Pid)
			if _, err := old.pairs(ctx, o.n, o.c); err != nil {
				return fmt.Errorf("round %d, %s: %w", r+1, o.before, err)
			}
			oldCosts = append(oldCosts, sampleCPU(rs.Process.Pid, old.cmd.Process.Pid).perPair(cpu0, o.n))
		}
		budgets = append(budgets, float64(cpuCount())*1e6/(0.3*es))
		floorPairs, err := fl.pairs(ctx, o.n, o.c)
		if err != nil {
			return fmt.Errorf("round %d, floor: %w", r+1, err)
		}
		ratios = append(ratios, pairs/es)
		ratios1 = append(ratios1, pairs/es1)
		ceilings = append(ceilings, floorPairs/es)
		fmt.Printf("| %d | %.0f | %.0f | %.0f | %.3f | %.3f | %.0f | %.3f | %.3f |\n", r+1, es, es1, pairs, pairs/es, pairs/es1,
			floorPairs, floorPairs/es, pairs/floorPairs)
	}
	fmt.Printf("\nCPU per acquire+release pair, from /proc (clock ticks of %d ms), beside the CPU a pair may use at the target rate (the host's %d CPUs ÷ (0.3 × EVALSHA -c %d)):\n\n", 1000/clockTicks, cpuCount(), o.c)
	fmt.Printf("| round | redis-server µs | sandgate serve µs | load clients µs | all three µs | at the target µs | all three ÷ at the target |\n" +
		"| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for r, c := range costs {
		all := c.redis + c.broker + c.clients
		fmt.Printf("| %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f |\n", r+1, c.redis, c.broker, c.clients, all, budgets[r], all/budgets[r])
	}
	if old != nil {
		fmt.Printf("\nThe same, now beside %s (its pairs run right after this build's in each round, on the same redis-server):\n\n", o.before)
		fmt.Printf("| round | redis-server µs now | before | now ÷ before | sandgate serve µs now | before | now ÷ before |\n" +
			"| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for r, c := range costs {
			b := oldCosts[r]
			fmt.Printf("| %d | %.0f | %.0f | %.2f | %.0f | %.0f | %.2f |\n", r+1, c.redis, b.redis, c.redis/b.redis, c.broker, b.broker, c.broker/b.broker)
		}
	}
	fmt.Printf("\nWhat redis-server ran a pair in the last round, this build (INFO commandstats):\n\n")
	printPerPair(stats[0], stats[1], o.n)
	med := func(v []float64) float64 { sort.Float64s(v); return v[len(v)/2] }
	fmt.Printf("\nmedian pairs ÷ EVALSHA: %.3f against -c %d, %.3f against -c 1 (target ≥ 0.3); "+
		"median floor ÷ EVALSHA -c %d: %.3f (no broker doing two HTTPS requests per pair exceeds it on this host)\n",
		med(ratios), o.c, med(ratios1), o.c, med(ceilings))
	return nil
}

// startBefore builds revision o.before and starts it as a second
// `sandgate serve` on the same redis-server, in a directory of its own,
// with a tenant of its own and its scripts loaded.
func startBefore(ctx context.Context, dir string, o acquireOptions, redisAddr string) (*serve, error) {
	bin, err := buildBefore(ctx, dir, o.before)
	if err != nil {
		return nil, err
	}
	sub := filepath.Join(dir, "serve-before")
	if err := os.MkdirAll(sub, 0o700); err != nil {
		return nil, err
	}
	old, err := startServe(ctx, sub, bin, redisAddr, noopProvider, o.c, o.level)
	if err != nil {
		return nil, err
	}
	if old.token, err = old.tenant(ctx, o.c); err == nil {
		_, err = old.pairs(ctx, min(o.n, 4*o.c), o.c)
	}
	if err != nil {
		old.stop()
		return nil, fmt.Errorf("%s: %w", o.before, err)
	}
	return old, nil
}

// processCPU is CPU time of redis-server, the broker and this process (the
// load clients): so far, in seconds (sampleCPU), or per pair, in µs
// (perPair).
type processCPU struct{ redis, broker, clients float64 }

func sampleCPU(redisPid, brokerPid int) processCPU {
	r, _ := pidTicks(redisPid)
	b, _ := pidTicks(brokerPid)
	return processCPU{float64(r) / clockTicks, float64(b) / clockTicks, selfCPU().Seconds()}
}

// perPair is the CPU each process spent after s0, per pair of n, in µs.
func (s processCPU) perPair(s0 processCPU, n int) processCPU {
	per := 1e6 / float64(n)
	return processCPU{(s.redis - s0.redis) * per, (s.broker - s0.broker) * per, (s.clients - s0.clients) * per}
}

// benchRate parses redis-benchmark -q's "…: N requests per second" line.
func benchRate(out []byte) (float64, error) {
	m := regexp.MustCompile(`([0-9.]+) requests per second`).FindAllSubmatch(out, -1)
	if len(m) == 0 {
		return 0, fmt.Errorf("redis-benchmark: no rate in %q", out)
	}
	return strconv.ParseFloat(string(m[len(m)-1][1]), 64)
}

// serve is the running `sandgate serve`.
type serve struct {
	cmd      *exec.Cmd
	stderr   *logbuf.Buffer
	url      string
	adminURL string
	admin    string // admin operator token
	token    string // the tenant's token
	hc       *http.Client
}

// noopProvider is -acquire's providers: nothing runs, so the figures are
// the broker's own.
const noopProvider = `providers:
  - name: bench
    kind: noop
default_provider: bench
`

// startServe starts `sandgate serve` on redisAddr with providers (the
// config's providers and default_provider, as YAML).
func startServe(ctx context.Context, dir, bin, redisAddr, providers string, clients int, level string) (*serve, error) {
	cert, key, roots, err := selfSigned(dir)
	if err != nil {
		return nil, err
	}
	// Fixed free ports, so that a log level above info (which hides the
	// "sandgate listening" line) still finds the listeners.
	pub, err := freePort()
	if err != nil {
		return nil, err
	}
	adm, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &serve{admin: "sgo_" + randHex(24), stderr: &logbuf.Buffer{}}
	// Limits sized for the load: the production request-rate limits stay
	// on, wide enough not to refuse it; risk velocity and open workspaces
	// likewise.
	cfg := fmt.Sprintf(`# sandgate-load -acquire
listen: "127.0.0.1:%d"
admin_listen: "127.0.0.1:%d"
data_dir: %q
broker_id: %q
tls:
  cert_file: %q
  key_file: %q
redis:
  addr: %q
%soperators:
  - name: load-admin
    role: admin
    token_env: %s
defaults:
  limits:
    max_concurrent_workspaces: %d
    max_lifetime: 1h
admission:
  risk:
    acquires_per_minute: 100000000
    max_open_workspaces: 100000
  rate_limits:
    acquire: {per_second: 1000000, burst: 1000000}
    read: {per_second: 1000000, burst: 1000000}
log:
  level: %s
`, pub, adm, filepath.Join(dir, "data"), "sandgate-load-"+filepath.Base(dir), cert, key, redisAddr, providers, adminTokenEnv, 4*clients, level)
	path := filepath.Join(dir, "sandgate.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	s.cmd = exec.Command(bin, "serve", "--config", path)
	s.cmd.Env = append(os.Environ(), adminTokenEnv+"="+s.admin)
	s.cmd.Stdout, s.cmd.Stderr = io.Discard, s.stderr
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	s.hc = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots},
		MaxIdleConnsPerHost: clients}}
	s.url, s.adminURL = fmt.Sprintf("https://127.0.0.1:%d", pub), fmt.Sprintf("http://127.0.0.1:%d", adm)
	for i := 0; ; i++ {
		if s.cmd.ProcessState != nil {
			return nil, fmt.Errorf("sandgate serve exited:\n%s", s.stderr.String())
		}
		if resp, err := s.hc.Get(s.url + "/v1/lease"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusUnauthorized {
				return s, nil
			}
		}
		if i == 600 || ctx.Err() != nil {
			s.stop()
			return nil, fmt.Errorf("sandgate serve did not answer within 60s:\n%s", s.stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *serve) stop() {
	_ = s.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
}

// tenant creates an account, an instance with room for the clients'
// workspaces, and a token, through the operator API.
func (s *serve) tenant(ctx context.Context, clients int) (string, error) {
	var acct struct{ ID string }
	if err := s.adminDo(ctx, http.MethodPost, "/accounts", map[string]any{"name": "load-" + randHex(4)}, &acct); err != nil {
		return "", fmt.Errorf("create account: %w", err)
	}
	// An account whose billing was never set cannot acquire; a free one
	// admits at price 0 through the same holds, ledger and settle scripts.
	if err := s.adminDo(ctx, http.MethodPut, "/accounts/"+acct.ID+"/billing", map[string]any{"free": true}, &struct{}{}); err != nil {
		return "", fmt.Errorf("set billing: %w", err)
	}
	var in struct{ ID string }
	req := map[string]any{"account_id": acct.ID, "name": "load",
		"scope": map[string]any{"limits": map[string]any{"max_concurrent_workspaces": 4 * clients}}}
	if err := s.adminDo(ctx, http.MethodPost, "/instances", req, &in); err != nil {
		return "", fmt.Errorf("create instance: %w", err)
	}
	var tok struct{ Token string }
	if err := s.adminDo(ctx, http.MethodPost, "/instances/"+in.ID+"/tokens", map[string]any{}, &tok); err != nil {
		return "", fmt.Errorf("issue token: %w", err)
	}
	return tok.Token, nil
}

func (s *serve) adminDo(ctx context.Context, method, path string, in, out any) error {
	body, _ := json.Marshal(in)
	req, err := http.NewRequestWithContext(ctx, method, s.adminURL+"/admin/v1"+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+s.admin)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(b))
	}
	return json.Unmarshal(b, out)
}

// pairs runs n acquire+release pairs over c clients and returns pairs/s.
// Each client holds one keep-alive TLS connection of its own, opened
// before the clock starts, and writes and reads its requests on it itself
// (rawConn): net/http's client hands every request to its connection's
// two goroutines and back, which on a small host costs about as much CPU
// as the server's answer. The same clients load the broker and the floor.
func (s *serve) pairs(ctx context.Context, n, c int) (float64, error) {
	conns := make([]*rawConn, c)
	defer func() {
		for _, rc := range conns {
			if rc != nil {
				rc.close()
			}
		}
	}()
	for i := range conns {
		rc, err := s.dial(ctx)
		if err != nil {
			return 0, err
		}
		conns[i] = rc
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, c)
	start := time.Now()
	for _, rc := range conns {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if err := s.pair(ctx, rc); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(n) / elapsed.Seconds(), nil
}

// rawConn is one client's keep-alive HTTPS/1.1 connection to the server,
// driven by hand: one request at a time, written and read by the caller.
type rawConn struct {
	s    *serve
	conn *tls.Conn
	br   *bufio.Reader
	host string
	req  []byte // the request being written, reused
}

// dial opens a connection to s with its client's TLS settings.
func (s *serve) dial(ctx context.Context) (*rawConn, error) {
	u, err := url.Parse(s.url)
	if err != nil {
		return nil, err
	}
	d := tls.Dialer{Config: s.hc.Transport.(*http.Transport).TLSClientConfig.Clone()}
	c, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return nil, err
	}
	return &rawConn{s: s, conn: c.(*tls.Conn), br: bufio.NewReaderSize(c, 16<<10), host: u.Host}, nil
}

func (rc *rawConn) close() { _ = rc.conn.Close() }

// do sends one request (body nil for none; key, when set, as the
// Idempotency-Key) and returns the answer's status and body. A server that
// closes the connection after answering gets a new one for the next
// request.
func (rc *rawConn) do(ctx context.Context, method, path string, body []byte, key string) (int, []byte, error) {
	if rc.conn == nil {
		n, err := rc.s.dial(ctx)
		if err != nil {
			return 0, nil, err
		}
		rc.conn, rc.br = n.conn, n.br
	}
	b := append(rc.req[:0], method...)
	b = append(b, ' ')
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, rc.host...)
	b = append(b, "\r\nAuthorization: Bearer "...)
	b = append(b, rc.s.token...)
	b = append(b, "\r\n"...)
	if key != "" {
		b = append(b, protocol.HeaderIdempotencyKey+": "...)
		b = append(b, key...)
		b = append(b, "\r\n"...)
	}
	if body != nil {
		b = append(b, "Content-Type: application/json\r\nContent-Length: "...)
		b = strconv.AppendInt(b, int64(len(body)), 10)
		b = append(b, "\r\n"...)
	}
	b = append(b, "\r\n"...)
	b = append(b, body...)
	rc.req = b
	if _, err := rc.conn.Write(b); err != nil {
		return 0, nil, err
	}
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		return 0, nil, err
	}
	out, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, nil, err
	}
	if resp.Close {
		rc.close()
		rc.conn = nil
	}
	return resp.StatusCode, out, nil
}

var acquireBody = []byte(`{"label":"load","egress":{"allowed_domains":[]}}`)

// pairBodies runs one pair and returns the broker's two answers as sent.
func (s *serve) pairBodies(ctx context.Context) (acq, rel []byte, err error) {
	var ws protocol.Workspace
	var raw json.RawMessage
	if err := s.do(ctx, http.MethodPost, "/v1/workspaces", acquireBody, "load-"+randHex(12), http.StatusCreated, &raw); err != nil {
		return nil, nil, fmt.Errorf("acquire: %w", err)
	}
	acq = raw
	if err := json.Unmarshal(acq, &ws); err != nil {
		return nil, nil, err
	}
	if err := s.do(ctx, http.MethodDelete, "/v1/workspaces/"+ws.WorkspaceID, nil, "", http.StatusOK, &raw); err != nil {
		return nil, nil, fmt.Errorf("release: %w", err)
	}
	return acq, raw, nil
}

// pair acquires a workspace and releases it over rc, requiring 201 and
// then 200 with the workspace terminated.
func (s *serve) pair(ctx context.Context, rc *rawConn) error {
	var ws struct {
		WorkspaceID string `json:"workspace_id"`
		State       string `json:"state"`
	}
	answer := func(what, method, path string, body []byte, key string, want int) error {
		st, b, err := rc.do(ctx, method, path, body, key)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if st != want {
			return fmt.Errorf("%s: %s %s: %d %s", what, method, path, st, bytes.TrimSpace(b))
		}
		if err := json.Unmarshal(b, &ws); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
	if err := answer("acquire", http.MethodPost, "/v1/workspaces", acquireBody, "load-"+randHex(12), http.StatusCreated); err != nil {
		return err
	}
	if ws.WorkspaceID == "" {
		return errors.New("acquire: no workspace_id in the answer")
	}
	if err := answer("release", http.MethodDelete, "/v1/workspaces/"+ws.WorkspaceID, nil, "", http.StatusOK); err != nil {
		return err
	}
	if ws.State != "terminated" {
		return fmt.Errorf("release: state %q; want terminated", ws.State)
	}
	return nil
}

func (s *serve) do(ctx context.Context, method, path string, body []byte, key string, want int, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(protocol.HeaderIdempotencyKey, key)
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(b))
	}
	return json.Unmarshal(b, out)
}

// selfSigned writes a throwaway certificate for 127.0.0.1 and returns its
// files and a pool that trusts it.
func selfSigned(dir string) (certPath, keyPath string, roots *x509.CertPool, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sandgate-load"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", nil, err
	}
	certPath, keyPath = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return "", "", nil, err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return "", "", nil, err
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return "", "", nil, err
	}
	roots = x509.NewCertPool()
	roots.AddCert(c)
	return certPath, keyPath, roots, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func waitTCP(ctx context.Context, addr string) error {
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return c.Close()
		}
		if i == 100 || ctx.Err() != nil {
			return fmt.Errorf("redis-server at %s did not answer within 10s: %w", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
