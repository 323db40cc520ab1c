package stripesync_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/stripemock"
)

// mockSock is the unix socket stripe-mock listens on, for the whole package.
var mockSock string

// TestMain builds stripe-mock from its Go module (a tool dependency in
// go.mod, so only the go command and the module proxy are needed) and
// runs it on a unix socket for every test of the package.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "stripemock")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin, err := stripemock.Build(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	mockSock = filepath.Join(dir, "sock")
	var logs bytes.Buffer
	cmd := exec.Command(bin, "-http-unix", mockSock)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start stripe-mock:", err)
		return 1
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.Dial("unix", mockSock)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "stripe-mock did not listen: %v\n%s", err, logs.String())
			return 1
		}
		time.Sleep(20 * time.Millisecond)
	}
	return m.Run()
}

// request is one request the sync sent, as the proxy saw it.
type request struct {
	Path           string
	Form           url.Values
	IdempotencyKey string
	Auth           string
	Status         int  // the answer: stripe-mock's, or the injected fault's
	Injected       bool // answered by the fault, never reached stripe-mock
}

// fault decides, per request, to answer it instead of stripe-mock: a
// status > 0 with its headers and body; 0 forwards it.
type fault func(r request, n int) (status int, header http.Header, body string)

// proxy is a recording, fault-injecting reverse proxy in front of
// stripe-mock.
type proxy struct {
	URL string
	mu  sync.Mutex
	log []request
	f   fault
}

func startProxy(t *testing.T) *proxy {
	t.Helper()
	p := &proxy{}
	rp := stripemock.Proxy(mockSock)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		form, _ := url.ParseQuery(string(body))
		req := request{Path: r.URL.Path, Form: form, IdempotencyKey: r.Header.Get("Idempotency-Key"), Auth: r.Header.Get("Authorization")}
		p.mu.Lock()
		f, n := p.f, len(p.log)
		p.mu.Unlock()
		if f != nil {
			if status, h, b := f(req, n); status > 0 {
				for k, v := range h {
					w.Header()[k] = v
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				io.WriteString(w, b)
				req.Status, req.Injected = status, true
				p.add(req)
				return
			}
		}
		rec := &statusWriter{ResponseWriter: w}
		rp.ServeHTTP(rec, r)
		req.Status = rec.status
		p.add(req)
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

func (p *proxy) add(r request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.log = append(p.log, r)
}

func (p *proxy) setFault(f fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.f = f
}

func (p *proxy) requests() []request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]request(nil), p.log...)
}

// delivered are the requests stripe-mock answered 200: the events Stripe
// would have counted.
func (p *proxy) delivered() []request {
	var out []request
	for _, r := range p.requests() {
		if !r.Injected && r.Status == http.StatusOK {
			out = append(out, r)
		}
	}
	return out
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// stripeError is a Stripe error body.
func stripeError(typ, msg string) string {
	return fmt.Sprintf(`{"error":{"type":%q,"message":%q}}`, typ, strings.ReplaceAll(msg, `"`, `'`))
}

// clock is a settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// sleeper records the waits asked of it and returns at once (or the
// context's error).
type sleeper struct {
	mu    sync.Mutex
	waits []time.Duration
	block bool // wait for the context instead (for Run)
}

func (s *sleeper) Sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.waits = append(s.waits, d)
	block := s.block
	s.mu.Unlock()
	if block {
		<-ctx.Done()
	}
	return ctx.Err()
}

func (s *sleeper) got() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.waits...)
}
