//go:build linux

// The end-to-end tests of this package build the real sandgate binary once,
// with the race detector, and drive it as an operator and a client would:
// `sandgate dev` and `sandgate serve` processes on runtime-chosen loopback
// ports, the `sandgate admin` CLI, the v1 client of client/ and curl. The
// helpers below start and stop those processes, capture their output for
// log scanning, and make sure nothing they started outlives the test.

package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/providers/local"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/internal/logbuf"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/internal/testpki"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/providertest"
)

// sandgateBin is the race-enabled sandgate binary that TestMain builds once.
var sandgateBin string

// pollTimeout bounds every wait for a process or a state change. It is a
// ceiling, never an expectation: polls return as soon as the condition holds.
const pollTimeout = 60 * time.Second

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "sandgate-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	sandgateBin = filepath.Join(dir, "sandgate")
	goTool, err := exec.LookPath("go")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: the go command is needed to build sandgate:", err)
		return 1
	}
	// -race: the binary under test is race-checked too; every process's
	// output is scanned for race reports when it stops.
	build := exec.Command(goTool, "build", "-race", "-o", sandgateBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: go build -race:", err)
		return 1
	}
	// The vendor providers' agent, beside sandgate where the broker looks
	// for it: static and stripped, as guests get it.
	guest := exec.Command(goTool, "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(dir, "sandgate-guest"), "../sandgate-guest")
	guest.Env = append(os.Environ(), "CGO_ENABLED=0")
	guest.Stdout, guest.Stderr = os.Stderr, os.Stderr
	if err := guest.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: go build sandgate-guest:", err)
		return 1
	}
	return m.Run()
}

// process is one running sandgate binary with its output captured.
type process struct {
	t      testing.TB
	name   string
	cmd    *exec.Cmd
	stdout logbuf.Buffer
	stderr logbuf.Buffer
	done   chan struct{} // closed once the process has been waited for
	err    error         // Wait's error; read after done

	mu       sync.Mutex
	killed   bool // SIGKILLed on purpose: its exit status means nothing
	children []procStat
}

// cleanEnv is the test's environment without sandgate's own variables, so
// a developer's SANDGATE_*, BROKER_* or OTEL_* settings cannot leak into a test.
//
// GORACE gains atexit_sleep_ms=0 (unless it sets it): the race runtime
// otherwise sleeps a second at every exit, which each CLI call would pay.
func cleanEnv(extra ...string) []string {
	var env []string
	gorace := ""
	for _, kv := range os.Environ() {
		switch {
		case strings.HasPrefix(kv, "SANDGATE_"), strings.HasPrefix(kv, "BROKER_"), strings.HasPrefix(kv, "OTEL_"):
		case strings.HasPrefix(kv, "GORACE="):
			gorace = strings.TrimPrefix(kv, "GORACE=")
		default:
			env = append(env, kv)
		}
	}
	if !strings.Contains(gorace, "atexit_sleep_ms") {
		gorace = strings.TrimSpace(gorace + " atexit_sleep_ms=0")
	}
	env = append(env, "GORACE="+gorace)
	return append(env, extra...)
}

// startProcess runs the sandgate binary with args in workDir. When the test
// ends it is stopped with SIGTERM (SIGKILL if it does not exit), its output
// is scanned for race reports and panics, and it must have exited cleanly
// with no sandbox left behind.
func startProcess(t testing.TB, name, workDir string, env []string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(sandgateBin, args...)
	cmd.Dir = workDir
	cmd.Env = cleanEnv(env...)
	return startCmd(t, name, cmd)
}

// startCmd is startProcess for a command that ends up as the sandgate
// binary (through exec, never a fork: it is the process signalled).
func startCmd(t testing.TB, name string, cmd *exec.Cmd) *process {
	t.Helper()
	p := &process{t: t, name: name, done: make(chan struct{}), cmd: cmd}
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	// The broker dies with the test binary even if the test is cut short
	// (a -timeout panic skips cleanups); its sandboxes die with it
	// (bwrap --die-with-parent).
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p.cmd.WaitDelay = 10 * time.Second
	if err := startTied(p.cmd); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(p.cleanup)
	return p
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Logs returns everything the process wrote so far, stdout then stderr.
func (p *process) Logs() string { return p.stdout.String() + p.stderr.String() }

// kill stops the process with SIGKILL, as a crash would, and waits for it.
func (p *process) kill() {
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	p.rememberChildren()
	_ = p.cmd.Process.Kill()
	<-p.done
}

// stopTimeout bounds a stop: longer than the broker's own shutdown bound
// (shutdown_timeout, 30 s by default, for requests still in flight) plus
// the closing of its providers, on a loaded machine.
const stopTimeout = 2 * time.Minute

// stop asks the process to shut down (SIGTERM) and waits, killing it if it
// does not exit within stopTimeout.
func (p *process) stop() {
	if p.exited() {
		return
	}
	p.rememberChildren()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		p.t.Errorf("%s did not exit within %v of SIGTERM; killing it", p.name, stopTimeout)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *process) cleanup() {
	p.stop()
	p.mu.Lock()
	killed := p.killed
	p.mu.Unlock()
	logs := p.Logs()
	switch {
	case strings.Contains(logs, "WARNING: DATA RACE"):
		p.t.Errorf("%s: the race detector reported a data race", p.name)
	case strings.Contains(logs, "panic:") || strings.Contains(logs, "fatal error:"):
		p.t.Errorf("%s panicked", p.name)
	case !killed && p.err != nil:
		p.t.Errorf("%s exited with %v after SIGTERM; want a clean exit", p.name, p.err)
	}
	p.checkNoSandboxesLeft()
	if p.t.Failed() {
		p.t.Logf("%s output:\n%s", p.name, tail(logs, 16<<10))
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// procStat identifies a process across pid reuse: pid plus start time.
type procStat struct {
	pid, ppid int
	start     string
	comm      string
}

// readProcs reads every process's pid, parent and start time from /proc.
func readProcs() []procStat {
	entries, _ := os.ReadDir("/proc")
	var out []procStat
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// "pid (comm) state ppid … starttime(22nd)…"; comm may hold spaces.
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		f := strings.Fields(s[end+1:])
		if len(f) < 20 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		out = append(out, procStat{pid: pid, ppid: ppid, start: f[19], comm: s[open+1 : end]})
	}
	return out
}

// rememberChildren records every descendant of the process (its sandboxes'
// prlimit/bwrap trees) before it is stopped, while the tree still hangs
// from it.
func (p *process) rememberChildren() {
	out := p.sandboxProcs()
	p.mu.Lock()
	p.children = out
	p.mu.Unlock()
}

// sandboxProcs returns the descendants that belong to sandboxes: all but
// the data directory's supervisor, which outlives the broker and its last
// workspace by design (providers/local/README.md): it ends workspaces at
// their deadlines, and lingers a while after the last one.
func (p *process) sandboxProcs() []procStat {
	var out []procStat
	for _, ps := range p.descendants() {
		if b, _ := os.ReadFile("/proc/" + strconv.Itoa(ps.pid) + "/cmdline"); strings.Contains(string(b), local.SupervisorName) {
			continue
		}
		out = append(out, ps)
	}
	return out
}

// descendants returns the processes that descend from this one now.
func (p *process) descendants() []procStat {
	all := readProcs()
	kids := map[int][]procStat{}
	for _, ps := range all {
		kids[ps.ppid] = append(kids[ps.ppid], ps)
	}
	var out []procStat
	queue := []int{p.cmd.Process.Pid}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range kids[pid] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
	}
	return out
}

// checkNoSandboxesLeft waits (bounded) until every process that descended
// from the broker when it was stopped is gone. One that stays is an
// escaped sandbox: it is killed by pid, and the test fails.
func (p *process) checkNoSandboxesLeft() {
	p.mu.Lock()
	kids := p.children
	p.mu.Unlock()
	if len(kids) == 0 {
		return
	}
	alive := func() []procStat {
		now := map[int]string{}
		for _, ps := range readProcs() {
			now[ps.pid] = ps.start
		}
		var out []procStat
		for _, k := range kids {
			if now[k.pid] == k.start {
				out = append(out, k)
			}
		}
		return out
	}
	// An escaped sandbox stays for good; one being torn down can take
	// seconds on a loaded machine.
	deadline := time.Now().Add(pollTimeout)
	for {
		left := alive()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, k := range left {
				p.t.Errorf("%s: process %d (%s) outlived the broker", p.name, k.pid, k.comm)
				_ = syscall.Kill(k.pid, syscall.SIGKILL)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitFor polls cond until it reports true, failing the test after
// pollTimeout with cond's last description of what it waits for.
func waitFor(t testing.TB, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(pollTimeout)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %v", what, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// --- sandgate dev -----------------------------------------------------------

// devBroker is a running `sandgate dev` and what its dev.env says.
type devBroker struct {
	*process
	workDir    string // the process's working directory
	dataDir    string // workDir/.sandgate
	env        map[string]string
	URL        string
	CAPath     string
	Token      string
	AdminURL   string
	AdminToken string
	Roots      *x509.CertPool
}

// devEnvKeys are the variables dev.env must define.
var devEnvKeys = []string{"BROKER_URL", "BROKER_CA", "BROKER_TOKEN", "SANDGATE_ADMIN_URL", "SANDGATE_ADMIN_TOKEN", "FINANCE_TOKEN"}

// startDev runs `sandgate dev` on runtime-chosen ports in a fresh working
// directory (data dir .sandgate inside it, as the README runs it) and waits
// until dev.env is complete and GET /v1/lease answers 200.
func startDev(t testing.TB) *devBroker {
	t.Helper()
	return startDevWith(t, nil)
}

// startDevWith is startDev with extra environment variables and flags
// (for example a vendor's variables and --provider).
func startDevWith(t testing.TB, env []string, flags ...string) *devBroker {
	t.Helper()
	work := t.TempDir()
	d := &devBroker{workDir: work, dataDir: filepath.Join(work, ".sandgate")}
	discardWorkspaces(t, d.dataDir, "sandgate-dev")
	args := append([]string{"dev", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir", ".sandgate"}, flags...)
	d.process = startProcess(t, "sandgate dev", work, env, args...)
	envPath := filepath.Join(d.dataDir, "dev.env")
	waitFor(t, "dev.env", func() (bool, error) {
		if d.exited() {
			t.Fatalf("sandgate dev exited early (%v):\n%s", d.err, d.Logs())
		}
		b, err := os.ReadFile(envPath)
		if err != nil {
			return false, err
		}
		env, err := parseEnvFile(string(b))
		if err != nil {
			return false, err // still being written
		}
		d.env = env
		return true, nil
	})
	d.URL, d.CAPath, d.Token = d.env["BROKER_URL"], d.env["BROKER_CA"], d.env["BROKER_TOKEN"]
	d.AdminURL, d.AdminToken = d.env["SANDGATE_ADMIN_URL"], d.env["SANDGATE_ADMIN_TOKEN"]
	d.Roots = loadPool(t, d.CAPath)
	c := newClient(t, d.URL, d.Roots, d.Token)
	waitFor(t, "GET /v1/lease on sandgate dev", func() (bool, error) {
		if d.exited() {
			t.Fatalf("sandgate dev exited early (%v):\n%s", d.err, d.Logs())
		}
		_, err := c.Lease(context.Background())
		return err == nil, err
	})
	return d
}

// parseEnvFile parses dev.env: KEY=VALUE lines and # comments. It fails
// until every key of devEnvKeys is present, so that a half-written file
// is read again.
func parseEnvFile(s string) (map[string]string, error) {
	env := map[string]string{}
	if !strings.HasSuffix(s, "\n") {
		return nil, errors.New("dev.env is incomplete")
	}
	for _, line := range strings.Split(s, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("dev.env: line without '=': %q", line)
		}
		env[k] = v
	}
	for _, k := range devEnvKeys {
		if env[k] == "" {
			return nil, fmt.Errorf("dev.env has no %s", k)
		}
	}
	return env, nil
}

// AdminEnv is the environment `sandgate admin` reads its URL and token from.
func (d *devBroker) AdminEnv() []string {
	return []string{"SANDGATE_ADMIN_URL=" + d.AdminURL, "SANDGATE_ADMIN_TOKEN=" + d.AdminToken}
}

// Client returns a v1 client of the dev broker with tok (the dev token
// when empty).
func (d *devBroker) Client(t testing.TB, tok string) *client.Client {
	if tok == "" {
		tok = d.Token
	}
	return newClient(t, d.URL, d.Roots, tok)
}

// startRedis runs a private redis-server for one test.
func startRedis(t testing.TB) *redistest.Server { return redistest.Start(t) }

// --- sandgate serve ---------------------------------------------------------

// serveConfig is one broker deployment: a config file that any number of
// `sandgate serve` processes share (same Redis, same data_dir, same
// broker_id), its throwaway PKI and its operator tokens.
type serveConfig struct {
	Path       string
	DataDir    string
	PKI        *testPKI
	AdminToken string // role admin, configured with token_env
	OpToken    string // role operator, configured with token_sha256
	env        []string
}

// serveOptions are the knobs of newServeConfig; zero means the default
// noted beside each.
type serveOptions struct {
	LogLevel string // "" means info
	// Providers replaces the config's provider block (YAML); "" means
	// the local provider alone.
	Providers string
	// Redis replaces the config's redis block (YAML, without the
	// `redis:` line, indented two spaces); "" means `addr: redisAddr`.
	Redis string
}

const adminTokenEnv = "SANDGATE_E2E_ADMIN_TOKEN"

// newServeConfig writes a config for `sandgate serve` against redisAddr:
// listeners on 127.0.0.1:0 (the ports are read from the process's log),
// TLS with a fresh CA, one admin operator by token_env and one operator by
// token_sha256, and small-sized defaults.
func newServeConfig(t testing.TB, redisAddr string, o serveOptions) *serveConfig {
	t.Helper()
	dir := t.TempDir()
	c := &serveConfig{
		Path:       filepath.Join(dir, "sandgate.yaml"),
		DataDir:    filepath.Join(dir, "data"),
		PKI:        newPKI(t, dir),
		AdminToken: "sgo_" + randHex(24),
		OpToken:    "sgo_" + randHex(24),
	}
	discardWorkspaces(t, c.DataDir, "sandgate-e2e")
	c.env = []string{adminTokenEnv + "=" + c.AdminToken}
	opHash := sha256.Sum256([]byte(c.OpToken))
	level := o.LogLevel
	if level == "" {
		level = "info"
	}
	rds := o.Redis
	if rds == "" {
		rds = fmt.Sprintf("  addr: %q", redisAddr)
	}
	provs := o.Providers
	if provs == "" {
		provs = "provider:\n  name: local"
	}
	yaml := fmt.Sprintf(`# sandgate serve, written by the e2e tests
listen: "127.0.0.1:0"
admin_listen: "127.0.0.1:0"
data_dir: %q
broker_id: "sandgate-e2e"
tls:
  cert_file: %q
  key_file: %q
redis:
%s
%s
operators:
  - name: e2e-admin
    role: admin
    token_env: %s
  - name: e2e-operator
    role: operator
    token_sha256: %q
lease:
  grace_period: 1h
defaults:
  sizes: [small, standard]
  default_size: small
  limits:
    max_concurrent_workspaces: 2
    max_lifetime: 1h
    idle_timeout: 15m
log:
  level: %s
`, c.DataDir, c.PKI.CertPath, c.PKI.KeyPath, rds, provs, adminTokenEnv, hex.EncodeToString(opHash[:]), level)
	if err := os.WriteFile(c.Path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

// discardWorkspaces ends, when the test is over, the local workspaces
// broker left in dataDir, and removes their cgroups and the provider's
// parent cgroups: a broker that is stopped or killed keeps its
// workspaces, which outlive it by design, and the removal of the test's
// directory would leave their cgroups on the host. Call it before the
// brokers start, so that it runs after they are gone (cleanups run last
// first).
func discardWorkspaces(t testing.TB, dataDir, broker string) {
	t.Cleanup(func() {
		// One directory per local provider: "local", or "local-NAME".
		dirs, _ := filepath.Glob(filepath.Join(dataDir, "local*"))
		for _, dir := range dirs {
			if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
				continue
			}
			p, err := local.New(context.Background(), local.Config{DataDir: dir}, providers.Env{BrokerID: broker, DataDir: dataDir})
			if err != nil {
				t.Logf("the workspaces left in %s are not ended: %v", dir, err)
				continue
			}
			providertest.Discard(p)
		}
	})
}

// serveBroker is one running `sandgate serve` process.
type serveBroker struct {
	*process
	cfg      *serveConfig
	URL      string
	AdminURL string
}

// startServe runs `sandgate serve --config` and waits until it logs its
// listeners and its public listener answers an unauthenticated request.
// startPair starts a Redis and two `sandgate serve` processes of one
// config over it, one after the other: both share data_dir, and a
// starting local provider empties the shared trash directory.
func startPair(t testing.TB) (*redistest.Server, *serveConfig, *serveBroker, *serveBroker) {
	t.Helper()
	rs, cfg, gwA := startOne(t)
	return rs, cfg, gwA, startServe(t, cfg)
}

// startOne starts a Redis and a `sandgate serve` over it with the
// default config.
func startOne(t testing.TB) (*redistest.Server, *serveConfig, *serveBroker) {
	t.Helper()
	rs := startRedis(t)
	cfg := newServeConfig(t, rs.Addr, serveOptions{})
	return rs, cfg, startServe(t, cfg)
}

func startServe(t testing.TB, cfg *serveConfig) *serveBroker {
	t.Helper()
	return startServeEnv(t, cfg)
}

// startServeEnv is startServe with extra environment variables for this
// process only.
func startServeEnv(t testing.TB, cfg *serveConfig, extra ...string) *serveBroker {
	t.Helper()
	s := &serveBroker{cfg: cfg}
	env := append(append([]string(nil), cfg.env...), extra...)
	s.process = startProcess(t, "sandgate serve", t.TempDir(), env, "serve", "--config", cfg.Path)
	waitFor(t, "sandgate serve to listen", func() (bool, error) {
		if s.exited() {
			t.Fatalf("sandgate serve exited early (%v):\n%s", s.err, s.Logs())
		}
		pub, adm, ok := listenAddrs(s.stderr.String())
		if !ok {
			return false, errors.New("no \"sandgate listening\" log line yet")
		}
		s.URL, s.AdminURL = "https://"+pub, "http://"+adm
		return true, nil
	})
	hc := httpsClient(cfg.PKI.Roots)
	waitFor(t, "sandgate serve to answer", func() (bool, error) {
		resp, err := hc.Get(s.URL + "/v1/lease")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusUnauthorized, fmt.Errorf("status %d", resp.StatusCode)
	})
	return s
}

// listenAddrs finds the "sandgate listening" line in a JSON log.
func listenAddrs(logs string) (public, adminAddr string, ok bool) {
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct {
			Msg         string `json:"msg"`
			Listen      string `json:"listen"`
			AdminListen string `json:"admin_listen"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "sandgate listening" {
			return line.Listen, line.AdminListen, true
		}
	}
	return "", "", false
}

// Client returns a v1 client of this gateway with tok.
func (s *serveBroker) Client(t testing.TB, tok string) *client.Client {
	return newClient(t, s.URL, s.cfg.PKI.Roots, tok)
}

// Admin returns an operator API client of this gateway with the admin token.
func (s *serveBroker) Admin(t testing.TB) *adminapi.Client {
	return newAdminClient(t, s.AdminURL, s.cfg.AdminToken)
}

// Operator returns an operator API client with the operator-role token.
func (s *serveBroker) Operator(t testing.TB) *adminapi.Client {
	return newAdminClient(t, s.AdminURL, s.cfg.OpToken)
}

// AdminEnv is the environment `sandgate admin` needs for this gateway.
func (s *serveBroker) AdminEnv() []string {
	return []string{"SANDGATE_ADMIN_URL=" + s.AdminURL, "SANDGATE_ADMIN_TOKEN=" + s.cfg.AdminToken}
}

// --- clients ----------------------------------------------------------------

// newClient returns a v1 client that makes exactly one attempt per call,
// so every answer the test sees is the broker's first.
func newClient(t testing.TB, endpoint string, roots *x509.CertPool, tok string) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{
		Endpoint: endpoint, Token: sandgate.Secret(tok), RootCAs: roots,
		MaxAttempts: 1, UserAgent: "sandgate-e2e",
	})
	if err != nil {
		t.Fatalf("client.New: %v", err)
	}
	return c
}

func newAdminClient(t testing.TB, url, tok string) *adminapi.Client {
	t.Helper()
	c, err := adminapi.NewClient(url, sandgate.Secret(tok), nil)
	if err != nil {
		t.Fatalf("adminapi.NewClient: %v", err)
	}
	return c
}

// httpsClient is a plain HTTPS client trusting roots, for requests the v1
// client would interpret (a 404 on release) or cannot send.
func httpsClient(roots *x509.CertPool) *http.Client {
	return &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// rawCall sends one request with a bearer token and a JSON body (nil for
// none), returning the status and the body.
func rawCall(t testing.TB, hc *http.Client, method, url, tok string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// wantCode fails the test unless err is a broker answer with status and code.
func wantCode(t testing.TB, what string, err error, status int, code protocol.Code) {
	t.Helper()
	var e *client.Error
	if !errors.As(err, &e) {
		t.Fatalf("%s: err = %v; want %d %s", what, err, status, code)
	}
	if e.Status != status || e.Code != code {
		t.Fatalf("%s: answered %d %s; want %d %s", what, e.Status, e.Code, status, code)
	}
}

// noEgress is the egress policy of every workspace in these tests: the
// local provider gives a workspace no network at all.
func noEgress() *protocol.Egress { return &protocol.Egress{AllowedDomains: []string{}} }

// acquire acquires a workspace and fails the test unless it was created.
func acquire(t testing.TB, c *client.Client, key string) *protocol.Workspace {
	t.Helper()
	ws, created, err := c.Acquire(context.Background(), key, protocol.AcquireRequest{Label: "e2e", Egress: noEgress()})
	if err != nil {
		t.Fatalf("acquire %s: %v", key, err)
	}
	if !created {
		t.Fatalf("acquire %s: answered 200 (replay); want 201", key)
	}
	return ws
}

// --- operator API -----------------------------------------------------------

// createAccount creates an account named name (with a suffix when a
// test before took the name on the same broker: names are unique) and
// marks it free, since an account whose billing was never configured
// cannot acquire; a test that prices its workspaces sets billing again.
func createAccount(t testing.TB, a *adminapi.Client, name string) string {
	t.Helper()
	ctx := context.Background()
	var acct adminapi.Account
	err := a.Do(ctx, http.MethodPost, "/accounts", adminapi.CreateAccountRequest{Name: name}, &acct)
	if apiErr := (*adminapi.APIError)(nil); errors.As(err, &apiErr) && apiErr.Code == protocol.Conflict {
		err = a.Do(ctx, http.MethodPost, "/accounts", adminapi.CreateAccountRequest{Name: name + "-" + sandgate.NewID("")}, &acct)
	}
	if err != nil {
		t.Fatalf("create account: %v", err)
	}
	if err := a.Do(ctx, http.MethodPut, "/accounts/"+acct.ID+"/billing", adminapi.BillingSettings{Free: true}, nil); err != nil {
		t.Fatalf("mark account %s free: %v", acct.ID, err)
	}
	return acct.ID
}

func createInstance(t testing.TB, a *adminapi.Client, acct string, maxConcurrent int) string {
	t.Helper()
	req := adminapi.CreateInstanceRequest{AccountID: acct, Name: "e2e"}
	req.Scope.Limits.MaxConcurrentWorkspaces = maxConcurrent
	var in adminapi.Instance
	if err := a.Do(context.Background(), http.MethodPost, "/instances", req, &in); err != nil {
		t.Fatalf("create instance: %v", err)
	}
	return in.ID
}

func issueToken(t testing.TB, a *adminapi.Client, inst string) string {
	t.Helper()
	var out adminapi.IssuedToken
	if err := a.Do(context.Background(), http.MethodPost, "/instances/"+inst+"/tokens", adminapi.IssueTokenRequest{}, &out); err != nil {
		t.Fatalf("issue token: %v", err)
	}
	return out.Token
}

// runCLI runs `sandgate args…` with env added to a clean environment and
// returns its stdout; it fails the test on a non-zero exit.
func runCLI(t testing.TB, env []string, args ...string) string {
	t.Helper()
	stdout, stderr, err := tryCLI(env, args...)
	if err != nil {
		t.Fatalf("sandgate %s: %v\nstderr: %s", strings.Join(args, " "), err, stderr)
	}
	return stdout
}

func tryCLI(env []string, args ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), pollTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, sandgateBin, args...)
	cmd.Env = cleanEnv(env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// --- PKI --------------------------------------------------------------------

// testPKI is a throwaway CA and a server certificate for 127.0.0.1, ::1
// and localhost.
type testPKI struct {
	CAPath, CertPath, KeyPath string
	Roots                     *x509.CertPool
}

func newPKI(t testing.TB, dir string) *testPKI {
	t.Helper()
	pki := testpki.Issue(t, "sandgate e2e CA", []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback})
	keyDER, err := x509.MarshalECPrivateKey(pki.Key)
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{
		CAPath:   filepath.Join(dir, "ca.pem"),
		CertPath: filepath.Join(dir, "server.pem"),
		KeyPath:  filepath.Join(dir, "server-key.pem"),
		Roots:    x509.NewCertPool(),
	}
	p.Roots.AddCert(pki.CA)
	for _, f := range []struct {
		path, typ string
		der       []byte
	}{{p.CAPath, "CERTIFICATE", pki.CADER}, {p.CertPath, "CERTIFICATE", pki.LeafDER}, {p.KeyPath, "EC PRIVATE KEY", keyDER}} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func loadPool(t testing.TB, caPath string) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(caPath)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatalf("%s holds no certificate", caPath)
	}
	return pool
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// raced is one acquire of raceAcquires: the workspace, the index of the
// client (gateway) that sent it, and its error.
type raced struct {
	ws  *protocol.Workspace
	gw  int
	err error
}

// raceAcquires fires n acquires at once with fresh keys (round-NNN),
// spread over clients round-robin. A 200 replay counts as an error.
func raceAcquires(ctx context.Context, clients []*client.Client, round string, n int) []raced {
	results := make([]raced, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			gw := i % len(clients)
			ws, created, err := clients[gw].Acquire(ctx, fmt.Sprintf("%s-%03d", round, i),
				protocol.AcquireRequest{Label: "race", Egress: noEgress()})
			if err == nil && !created {
				err = errors.New("answered 200 (a replay) for a fresh key")
			}
			results[i] = raced{ws, gw, err}
		})
	}
	close(start)
	wg.Wait()
	return results
}

// wantConcurrencySplit checks that exactly limit acquires were admitted and
// every other one was refused 429 concurrency_limit, and returns the admitted.
func wantConcurrencySplit(t *testing.T, results []raced, limit int) []raced {
	t.Helper()
	var won []raced
	refused := 0
	for i, r := range results {
		switch {
		case r.err == nil:
			won = append(won, r)
		case client.CodeOf(r.err) == protocol.ConcurrencyLimit:
			wantCode(t, fmt.Sprintf("acquire %d", i), r.err, http.StatusTooManyRequests, protocol.ConcurrencyLimit)
			refused++
		default:
			t.Errorf("acquire %d on gateway %d: %v; want 201 or 429 concurrency_limit", i, r.gw, r.err)
		}
	}
	if len(won) != limit || refused != len(results)-limit {
		t.Fatalf("%d racing acquires: %d × 201, %d × 429 concurrency_limit; want %d and %d",
			len(results), len(won), refused, limit, len(results)-limit)
	}
	return won
}

// readmeBlock returns the first sh block of README.md after the line
// heading, failing the test when there is none: the e2e walk-throughs run
// the README's own text.
func readmeBlock(t testing.TB, heading string) string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	_, section, ok := strings.Cut(string(readme), heading)
	_, block, ok2 := strings.Cut(section, "```sh\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatalf("README.md has no sh block under %q", heading)
	}
	return block
}

// startTied starts cmd from an OS thread that stays locked, and so alive,
// until cmd has exited. A parent-death signal (SysProcAttr.Pdeathsig)
// follows the thread that forked the child, not the process, and this test
// binary ends threads: the local provider's exec launcher never gives its
// locked thread back. A child forked earlier from a thread that a launcher
// then took would die with it, mid-test.
func startTied(cmd *exec.Cmd) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return // the thread ends with this goroutine: it forked nothing
		}
		started <- nil
		// Wait for the exit without reaping it: cmd.Wait does that.
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if err != unix.EINTR {
				break
			}
		}
		runtime.UnlockOSThread()
	}()
	return <-started
}
