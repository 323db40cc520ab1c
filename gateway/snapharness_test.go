package gateway_test

// The harness of the snapshot, durable command and listing tests: a real
// redis-server, the gateway behind httptest's TLS server, one account with
// an instance and a token, and a clock the test moves. Identifiers carry
// the snap prefix.

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/admission"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/broker"
	"github.com/sandgate/sandgate/internal/fakeprovider"
	"github.com/sandgate/sandgate/internal/redistest"
	"github.com/sandgate/sandgate/internal/sgtest"
	"github.com/sandgate/sandgate/protocol"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/reaper"
	"github.com/sandgate/sandgate/store"
	"github.com/sandgate/sandgate/token"
)

// snapEnv is one broker under test.
type snapEnv struct {
	t        *testing.T
	db       *store.DB
	p        providers.Provider
	clock    *sgtest.Clock
	srv      *httptest.Server
	reaper   *reaper.Reaper
	acct     string
	inst     string
	token    sandgate.Secret
	cl       *client.Client
	logs     *sgtest.Logs
	instance sandgate.Instance
}

// snapStartFake is snapStart over a new fake provider, with one workspace
// acquired.
func snapStartFake(t *testing.T, edit func(*sandgate.Limits)) (*fakeprovider.Provider, *snapEnv, *protocol.Workspace) {
	t.Helper()
	fake := fakeprovider.New()
	e := snapStart(t, fake, edit)
	return fake, e, e.acquire("")
}

// snapStart runs a broker over p with the instance's limits changed by
// edit (nil: the defaults), no rate limits and generous risk limits.
func snapStart(t *testing.T, p providers.Provider, edit func(*sandgate.Limits)) *snapEnv {
	t.Helper()
	rdb := redistest.Start(t).Client()
	db := store.New(store.Config{}, rdb)
	clock := sgtest.NewClock(time.Now())
	logs := &sgtest.Logs{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ps := providers.Single(providers.LegacyName, p)
	w := sgtest.Broker(t, sgtest.Config(t), broker.Options{Redis: rdb, Providers: ps, Clock: clock, Log: log, Gateway: &gateway.Config{},
		Risk: admission.RiskDefaults{AcquiresPerMinute: 1 << 20, MaxOpenWorkspaces: 1 << 20}})
	srv := httptest.NewTLSServer(w.Gateway().Handler())
	t.Cleanup(srv.Close)
	e := &snapEnv{t: t, db: db, p: p, clock: clock, srv: srv, logs: logs,
		reaper: reaper.New(reaper.Config{}, reaper.Deps{DB: db, Providers: ps, Terminator: w.Terminator(), Clock: clock, Log: log})}
	ctx := context.Background()
	e.acct = sandgate.NewID(sandgate.PrefixAccount)
	if err := db.CreateAccount(ctx, sandgate.Account{ID: e.acct, Name: "t", CreatedAt: clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := w.Billing().SetSettings(ctx, billing.Settings{AccountID: e.acct, Free: true}); err != nil { // unconfigured accounts cannot acquire
		t.Fatal(err)
	}
	lim := sandgate.Limits{MaxConcurrentWorkspaces: 1000}
	if edit != nil {
		edit(&lim)
	}
	e.instance = sandgate.Instance{ID: sandgate.NewID(sandgate.PrefixInstance), AccountID: e.acct, Name: "t",
		Scope: sandgate.Scope{DefaultImage: local.Image, EgressCeiling: []string{}, Limits: lim}, CreatedAt: clock.Now()}
	e.inst = e.instance.ID
	e.token, e.cl = e.newToken(e.instance)
	return e
}

// newToken stores an instance and issues it a token; it returns the token
// and a client that tries every call once.
func (e *snapEnv) newToken(in sandgate.Instance) (sandgate.Secret, *client.Client) {
	e.t.Helper()
	ctx := context.Background()
	if err := e.db.PutInstance(ctx, in); err != nil {
		e.t.Fatal(err)
	}
	tok := token.New(token.Prefix)
	l := sandgate.Lease{ID: sandgate.NewID(sandgate.PrefixLease), TokenHash: token.Hash(tok), InstanceID: in.ID,
		AccountID: in.AccountID, IssuedAt: e.clock.Now()}
	if err := e.db.IssueLease(ctx, l, false, e.clock.Now(), 0); err != nil {
		e.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(e.srv.Certificate())
	cl, err := client.New(client.Config{Endpoint: e.srv.URL, Token: tok, RootCAs: pool, MaxAttempts: 1})
	if err != nil {
		e.t.Fatal(err)
	}
	return tok, cl
}

// otherInstance returns the token and a client of a second instance of
// the same account.
func (e *snapEnv) otherInstance() (sandgate.Secret, *client.Client) {
	e.t.Helper()
	in := e.instance
	in.ID = sandgate.NewID(sandgate.PrefixInstance)
	return e.newToken(in)
}

// acquire creates a workspace (cold, or from snapshot) and fails the test
// on an error.
func (e *snapEnv) acquire(snapshot string) *protocol.Workspace {
	e.t.Helper()
	ws, created, err := e.cl.Acquire(context.Background(), sandgate.NewID("key-"), snapAcquireReq(snapshot))
	if err != nil || !created {
		e.t.Fatalf("Acquire(snapshot %q) = %v, created %v; want 201", snapshot, err, created)
	}
	return ws
}

func snapAcquireReq(snapshot string) protocol.AcquireRequest {
	return protocol.AcquireRequest{Label: "t", Egress: &protocol.Egress{AllowedDomains: []string{}}, SnapshotID: snapshot}
}

// do sends one raw request with the instance's token and returns the
// status and the body.
func (e *snapEnv) do(method, path string, body any, hdr map[string]string) (int, []byte) {
	e.t.Helper()
	return e.doWith(e.token, method, path, body, hdr)
}

// doWith is do with another token.
func (e *snapEnv) doWith(tok sandgate.Secret, method, path string, body any, hdr map[string]string) (int, []byte) {
	e.t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, r)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok.Reveal())
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// snapCode returns the envelope's code of a body, "" for none.
func snapCode(b []byte) protocol.Code {
	var env protocol.Envelope
	json.Unmarshal(b, &env)
	return env.Error.Code
}

// snapErrCode returns the protocol code of a client error, "" for nil and
// "transport" for an error without an answer.
func snapErrCode(err error) protocol.Code {
	if err == nil {
		return ""
	}
	var e *client.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return "transport"
}
