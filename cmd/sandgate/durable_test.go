//go:build linux

// Durable commands across real gateway processes: the sandgate binary is
// built once per test and run as `sandgate serve` processes over one
// redis-server and one data directory, as a deployment behind a load
// balancer would. Identifiers carry the dur prefix.

package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/token"
)

// durMarker is planted in every command's argv; no log line may carry it.
const durMarker = "durable-marker-4b7e"

// durCluster is one redis-server, one data directory, and the gateway
// processes the test starts over them.
type durCluster struct {
	t       *testing.T
	bin     string
	dir     string
	redis   string
	cert    string
	key     string
	pool    *x509.CertPool
	token   sandgate.Secret
	mu      sync.Mutex
	gws     []*durGateway
	dataDir string
}

// durGateway is one `sandgate serve` process.
type durGateway struct {
	cmd  *exec.Cmd
	url  string
	logs *bytes.Buffer
	cl   *client.Client
	done chan struct{}
}

func durStart(t *testing.T) *durCluster {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Fatalf("bwrap is required: %v", err)
	}
	c := &durCluster{t: t, dir: t.TempDir()}
	c.dataDir = filepath.Join(c.dir, "data")
	discardWorkspaces(t, c.dataDir, "durable-test")
	c.bin = filepath.Join(c.dir, "sandgate")
	build := exec.Command("go", "build", "-o", c.bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	srv := redistest.Start(t)
	c.redis = srv.Addr
	c.cert, c.key, c.pool = durCert(t, c.dir)
	c.seed(store.New(store.Config{}, srv.Client()))
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, g := range c.gws {
			g.kill()
		}
		for _, g := range c.gws {
			if strings.Contains(g.logs.String(), durMarker) {
				t.Errorf("a gateway's logs carry argv:\n%s", g.logs.String())
			}
		}
	})
	return c
}

// seed creates an account, an instance that may run the local provider
// (no network, the host image) and a token, straight in the store.
func (c *durCluster) seed(db *store.DB) {
	c.t.Helper()
	ctx := context.Background()
	now := time.Now().UTC()
	acct := sandgate.Account{ID: sandgate.NewID(sandgate.PrefixAccount), Name: "dur", CreatedAt: now}
	in := sandgate.Instance{ID: sandgate.NewID(sandgate.PrefixInstance), AccountID: acct.ID, Name: "dur", CreatedAt: now,
		Scope: sandgate.Scope{DefaultImage: local.Image, EgressCeiling: []string{}, Limits: sandgate.DefaultLimits}}
	c.token = token.New(token.Prefix)
	l := sandgate.Lease{ID: sandgate.NewID(sandgate.PrefixLease), TokenHash: token.Hash(c.token), InstanceID: in.ID, AccountID: acct.ID, IssuedAt: now}
	if err := db.CreateAccount(ctx, acct); err != nil {
		c.t.Fatal(err)
	}
	// An account whose billing was never configured cannot acquire.
	if err := billing.New(billing.Config{}, billing.Deps{DB: db}).SetSettings(ctx, billing.Settings{AccountID: acct.ID, Free: true}); err != nil {
		c.t.Fatal(err)
	}
	if err := db.PutInstance(ctx, in); err != nil {
		c.t.Fatal(err)
	}
	if err := db.IssueLease(ctx, l, false, now, 0); err != nil {
		c.t.Fatal(err)
	}
}

// gateway starts one more `sandgate serve` process and waits until it
// answers. A process that exits because its port was taken between
// durFreeAddr and its bind (another test's listener, a client's ephemeral
// port) is started again on other ports.
func (c *durCluster) gateway() *durGateway {
	c.t.Helper()
	for attempt := 1; ; attempt++ {
		g, err := c.startGateway()
		if err == nil {
			return g
		}
		if !strings.Contains(err.Error(), "address already in use") || attempt == 3 {
			c.t.Fatal(err)
		}
	}
}

func (c *durCluster) startGateway() (*durGateway, error) {
	c.t.Helper()
	c.mu.Lock()
	n := len(c.gws)
	c.mu.Unlock()
	listen, admin := durFreeAddr(c.t), durFreeAddr(c.t)
	cfg := fmt.Sprintf(`listen: %q
admin_listen: %q
data_dir: %q
broker_id: durable-test
tls:
  cert_file: %q
  key_file: %q
redis:
  addr: %q
`, listen, admin, c.dataDir, c.cert, c.key, c.redis)
	path := filepath.Join(c.dir, fmt.Sprintf("gateway-%d.yaml", n))
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		c.t.Fatal(err)
	}
	g := &durGateway{url: "https://" + listen, logs: &bytes.Buffer{}, done: make(chan struct{})}
	g.cmd = exec.Command(c.bin, "serve", "--config", path)
	g.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	g.cmd.Stdout, g.cmd.Stderr = &durSyncWriter{w: g.logs}, &durSyncWriter{w: g.logs}
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := g.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	go func() { g.cmd.Wait(); close(g.done) }()
	cl, err := client.New(client.Config{Endpoint: g.url, Token: c.token, RootCAs: c.pool, MaxAttempts: 1}) // the default 60 s per call, as the other e2e clients: an acquire can take 20 s on a loaded machine
	if err != nil {
		g.kill()
		c.t.Fatal(err)
	}
	g.cl = cl
	for i := 0; ; i++ {
		if _, err := cl.Lease(context.Background()); err == nil {
			break
		} else if i == 1200 { // a minute at least, as the harness's pollTimeout: starts are slow on a loaded machine
			g.kill()
			return nil, fmt.Errorf("gateway %d did not answer: %w\n%s", n, err, g.logs.String())
		}
		select {
		case <-g.done:
			return nil, fmt.Errorf("gateway %d exited: %s", n, g.logs.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	c.mu.Lock()
	c.gws = append(c.gws, g)
	c.mu.Unlock()
	return g, nil
}

// kill ends the gateway process with SIGKILL, as a crash would, and waits
// for it. Only the process itself is signalled: what it started in a
// session of its own must survive it.
func (g *durGateway) kill() {
	select {
	case <-g.done:
		return
	default:
	}
	g.cmd.Process.Kill()
	<-g.done
}

type durSyncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *durSyncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

func durFreeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// durCert writes a self-signed certificate for 127.0.0.1 and returns the
// files and a pool that trusts it.
func durCert(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "durable-test"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// durAcquire creates a workspace and releases it when the test ends.
func durAcquire(t *testing.T, c *durCluster, g *durGateway) string {
	t.Helper()
	ws, _, err := g.cl.Acquire(context.Background(), sandgate.NewID("dur-"), protocol.AcquireRequest{
		Label: "dur", Egress: &protocol.Egress{AllowedDomains: []string{}}})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	t.Cleanup(func() {
		// Any live gateway can release it; that kills what still runs.
		c.mu.Lock()
		gws := append([]*durGateway(nil), c.gws...)
		c.mu.Unlock()
		for _, g := range gws {
			select {
			case <-g.done:
				continue
			default:
			}
			if _, err := g.cl.Release(context.Background(), ws.WorkspaceID); err == nil {
				return
			}
		}
	})
	return ws.WorkspaceID
}

// durWait polls ReadCommand through g until the command is finished.
func durWait(t *testing.T, g *durGateway, ws, identity string, within time.Duration) *protocol.CommandStatus {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		st, err := g.cl.ReadCommand(context.Background(), ws, identity)
		if err != nil {
			t.Fatalf("ReadCommand: %v", err)
		}
		if st.State == protocol.CommandCompleted || st.State == protocol.CommandCanceled {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("command still %q after %v", st.State, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func durB64(s string) string {
	b, _ := base64.StdEncoding.DecodeString(s)
	return string(b)
}

// TestDurableStartOnceAcrossGateways: PUTs of one identity from many
// goroutines, through two gateway processes, launch the command once (it
// appends a line to a file: exactly one line).
func TestDurableStartOnceAcrossGateways(t *testing.T) {
	t.Parallel()
	c := durStart(t)
	g1, g2 := c.gateway(), c.gateway()
	ws := durAcquire(t, c, g1)
	req := protocol.ExecRequest{Argv: []string{"sh", "-c", "echo line >>/workspace/log # " + durMarker}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	launched, answered := 0, 0
	for i := range 24 {
		g := []*durGateway{g1, g2}[i%2]
		wg.Go(func() {
			_, l, err := g.cl.StartCommand(context.Background(), ws, "tool:once", req)
			// 429: the gateway's in-flight cap refused it before anything
			// ran (each PUT holds twice the output cap for the request's
			// life); a client sends it again after Retry-After, which
			// cannot launch twice (spec §Idempotency and retries).
			for range 30 {
				var e *client.Error
				if !errors.As(err, &e) || e.Code != protocol.RateLimited {
					break
				}
				time.Sleep(e.RetryAfter)
				_, l, err = g.cl.StartCommand(context.Background(), ws, "tool:once", req)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("StartCommand: %v", err)
				return
			}
			answered++
			if l {
				launched++
			}
		})
	}
	wg.Wait()
	if launched != 1 || answered != 24 {
		t.Fatalf("launched %d of %d answered PUTs; want exactly 1", launched, answered)
	}
	for _, g := range []*durGateway{g1, g2} {
		if st := durWait(t, g, ws, "tool:once", time.Minute); st.State != protocol.CommandCompleted || st.ExitCode == nil || *st.ExitCode != 0 {
			t.Errorf("command read through %s = %+v; want completed 0", g.url, st)
		}
	}
	b, err := g2.cl.ReadFile(context.Background(), ws, "/workspace/log")
	if err != nil || string(b) != "line\n" {
		t.Errorf("file = %q, %v; want exactly one line", b, err)
	}
}

// TestDurableSurvivesEveryGateway: a 30-second command keeps running while
// every gateway process is killed; a new gateway reads it completed with
// the right exit code and output.
func TestDurableSurvivesEveryGateway(t *testing.T) {
	t.Parallel()
	c := durStart(t)
	g1, g2 := c.gateway(), c.gateway()
	ws := durAcquire(t, c, g1)
	start := time.Now()
	_, launched, err := g1.cl.StartCommand(context.Background(), ws, "tool:long", protocol.ExecRequest{
		Argv:           []string{"sh", "-c", "sleep 30; printf finished; printf oops >&2; exit 7 # " + durMarker},
		TimeoutSeconds: 120,
	})
	if err != nil || !launched {
		t.Fatalf("StartCommand = %v, launched %v", err, launched)
	}
	if st, err := g2.cl.ReadCommand(context.Background(), ws, "tool:long"); err != nil || st.State != protocol.CommandRunning {
		t.Fatalf("ReadCommand through the other gateway = %+v, %v; want running", st, err)
	}
	g1.kill()
	g2.kill()
	time.Sleep(2 * time.Second) // no gateway at all for a while
	g3 := c.gateway()
	if st, err := g3.cl.ReadCommand(context.Background(), ws, "tool:long"); err != nil || st.State != protocol.CommandRunning {
		t.Fatalf("ReadCommand through a new gateway = %+v, %v; want still running", st, err)
	}
	st := durWait(t, g3, ws, "tool:long", 2*time.Minute)
	if st.State != protocol.CommandCompleted || st.ExitCode == nil || *st.ExitCode != 7 ||
		durB64(st.StdoutB64) != "finished" || durB64(st.StderrB64) != "oops" || st.StdoutBytes != 8 || st.StderrBytes != 4 {
		t.Errorf("command after every gateway was killed = %+v; want completed 7, finished, oops", st)
	}
	if d := time.Since(start); d < 29*time.Second {
		t.Errorf("command finished after %v; want it to run its 30 seconds", d)
	}
}
