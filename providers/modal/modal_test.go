package modal_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/modal"
	"github.com/sandgate/sandgate/providers/modal/modaltest"
	"github.com/sandgate/sandgate/providers/modal/proto/clientpb"
	"github.com/sandgate/sandgate/providers/providertest"
)

const (
	tokenID     = "ak-test-id"
	tokenSecret = "as-test-secret-planted"
)

// startFake starts a fake Modal server for the test.
func startFake(t testing.TB, cfg modaltest.Config) *modaltest.Server {
	t.Helper()
	cfg.TokenID, cfg.TokenSecret = tokenID, tokenSecret
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	s, err := modaltest.Start(t.Context(), cfg)
	if err != nil {
		t.Fatalf("modaltest.Start: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// newProvider returns a provider talking to fake.
func newProvider(t testing.TB, fake *modaltest.Server, brokerID string) *modal.Provider {
	t.Helper()
	p, err := modal.New(t.Context(), modal.Config{
		ServerURL: fake.URL, TokenID: tokenID, TokenSecret: sandgate.Secret(tokenSecret), RootCAs: fake.CertPool,
		DefaultImage: "debian:bookworm-slim",
	}, providers.Env{BrokerID: brokerID})
	if err != nil {
		t.Fatalf("modal.New: %v", err)
	}
	t.Cleanup(func() { p.Close() }) // after the sandboxes' cleanups
	return p
}

func TestProvider(t *testing.T) {
	fake := startFake(t, modaltest.Config{})
	providertest.Run(t, func(t *testing.T) providers.Provider {
		p, err := modal.New(t.Context(), modal.Config{
			ServerURL: fake.URL, TokenID: tokenID, TokenSecret: sandgate.Secret(tokenSecret), RootCAs: fake.CertPool,
		}, providers.Env{BrokerID: "sandgate-test"})
		if err != nil {
			t.Fatalf("modal.New: %v", err)
		}
		return p
	})
}

// spec is a CreateSpec on Modal's size name.
func spec(t testing.TB, size string, ttl time.Duration) providers.CreateSpec {
	t.Helper()
	s := providertest.Spec(t)
	for _, z := range modal.Sizes {
		if z.Name == size {
			s.Size = z
		}
	}
	s.ExpiresAt = time.Now().Add(ttl)
	return s
}

// TestCreateRequest: SandboxCreate carries the timeout to expires_at, the
// idle timeout, CPU and memory limits equal to the tier's requests, the
// egress allowlist, the env only through a Secret, and tags holding only
// the broker's identifiers.
func TestCreateRequest(t *testing.T) {
	fake := startFake(t, modaltest.Config{})
	p := newProvider(t, fake, "sandgate-req")
	sp := spec(t, "standard", 30*time.Minute)
	sp.IdleTimeout = 10 * time.Minute
	sp.Env = map[string]string{"CLIENT_VAR": "client-value-planted"}
	sb := providertest.Create(t, p, sp)

	var got *modaltest.Sandbox
	for _, s := range fake.Sandboxes() {
		if s.ID == sb.Ref {
			got = &s
		}
	}
	if got == nil {
		t.Fatalf("the fake has no sandbox %s", sb.Ref)
	}
	def := got.Request.GetDefinition()
	if ts := def.GetTimeoutSecs(); ts < 1780 || ts > 1800 {
		t.Errorf("timeout_secs = %d; want the seconds to expires_at (1800, at most)", ts)
	}
	if def.IdleTimeoutSecs == nil || def.GetIdleTimeoutSecs() != 600 {
		t.Errorf("idle_timeout_secs = %v; want 600", def.IdleTimeoutSecs)
	}
	r := def.GetResources()
	if r.GetMilliCpu() != 2000 || r.GetMilliCpuMax() != 2000 || r.GetMemoryMb() != 2048 || r.GetMemoryMbMax() != 2048 {
		t.Errorf("resources = %v; want milli_cpu = milli_cpu_max = 2000 (2 physical cores), memory_mb = memory_mb_max = 2048", r)
	}
	if r.GetGpuConfig() == nil || def.GetOpenPorts() == nil {
		t.Errorf("gpu_config %v, open_ports %v; want both sent (empty), as the SDK does", r.GetGpuConfig(), def.GetOpenPorts())
	}
	na := def.GetNetworkAccess()
	if na.GetNetworkAccessType() != clientpb.NetworkAccess_ALLOWLIST || len(na.GetAllowedDomains()) != 0 || len(na.GetAllowedCidrs()) != 0 {
		t.Errorf("network_access = %v; want ALLOWLIST with both lists empty (no network)", na)
	}
	wantTags := map[string]string{providers.LabelBroker: "sandgate-req", providers.LabelWorkspace: sp.WorkspaceID, providers.LabelInstance: sp.InstanceID}
	gotTags := map[string]string{}
	for _, tg := range got.Request.GetTags() {
		gotTags[tg.GetTagName()] = tg.GetTagValue()
	}
	if !maps.Equal(gotTags, wantTags) {
		t.Errorf("tags = %v; want exactly %v", gotTags, wantTags)
	}
	if len(def.GetSecretIds()) != 1 || got.Env["CLIENT_VAR"] != "client-value-planted" {
		t.Errorf("secret_ids %v, env %v; want one ephemeral secret holding the env", def.GetSecretIds(), got.Env)
	}
	if s := fmt.Sprint(got.Request); strings.Contains(s, "client-value-planted") || strings.Contains(s, "CLIENT_VAR") {
		t.Errorf("the create request carries the env itself: %s", s)
	}
	if res := providertest.Exec(t, p, sb, "sh", "-c", `printf %s "$CLIENT_VAR"`); string(res.Stdout) != "client-value-planted" {
		t.Errorf("env in an exec = %q; want the secret's value", res.Stdout)
	}
}

// Modal's domain allowlist is not relied on (the sheet is uncertain how it
// judges literal IPs): the provider enforces only [], an instance scope
// with domains is refused, and a create with domains never reaches Modal.
func TestNoDomainAllowlist(t *testing.T) {
	fake := startFake(t, modaltest.Config{})
	p := newProvider(t, fake, "sandgate-egress")
	caps := p.Capabilities()
	if caps.Egress != providers.EgressNoneOnly {
		t.Errorf("egress = %v; want none", caps.Egress)
	}
	if err := caps.CheckScope("modal", sandgate.Scope{EgressCeiling: []string{"github.com"}}); err == nil {
		t.Error("a scope with an egress ceiling of domains was accepted")
	}
	sp := spec(t, "standard", 10*time.Minute)
	sp.Egress = sandgate.EgressPolicy{AllowedDomains: []string{"github.com"}}
	if sb, err := p.Create(t.Context(), sp); err == nil {
		p.Terminate(t.Context(), sb)
		t.Fatal("a create with allowed domains succeeded")
	}
	if n := len(fake.Sandboxes()); n != 0 {
		t.Errorf("the refused create left %d sandboxes on Modal; want none", n)
	}
}

// TestVendorEndsAtExpiry: with the provider closed (no broker process at
// all), the vendor ends the sandbox at expires_at; a provider opened
// afterwards finds it gone and no longer lists it.
func TestVendorEndsAtExpiry(t *testing.T) {
	t.Parallel() // mostly waiting on the clock: beside the others
	fake := startFake(t, modaltest.Config{})
	p := newProvider(t, fake, "sandgate-expiry")
	// Room for the create and the exec, which must come before the end,
	// on a loaded machine.
	sp := spec(t, "small", 15*time.Second)
	sb, err := p.Create(t.Context(), sp)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	providertest.Exec(t, p, sb, "sh", "-c", "sleep 300 >/dev/null 2>&1 &")
	p.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := fakeSandbox(t, fake, sb.Ref)
		if st.Result != nil {
			if st.Result.GetStatus() != clientpb.GenericResult_GENERIC_STATUS_TIMEOUT {
				t.Errorf("result = %v; want TIMEOUT", st.Result)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandbox still runs 30 s after expires_at")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if late := time.Since(sp.ExpiresAt); late > 5*time.Second {
		t.Errorf("ended %v after expires_at; want at it", late)
	}
	q := newProvider(t, fake, "sandgate-expiry")
	if _, err := q.Exec(t.Context(), sb, providers.ExecSpec{Argv: []string{"true"}, Timeout: time.Minute}); !errors.Is(err, providers.ErrSandboxGone) {
		t.Errorf("Exec after expiry = %v; want ErrSandboxGone", err)
	}
	if all, err := q.List(t.Context()); err != nil || len(all) != 0 {
		t.Errorf("List after expiry = %v, %v; want empty", all, err)
	}
}

// TestVendorIdleTimeout: the vendor ends a sandbox with no exec for its
// idle timeout.
func TestVendorIdleTimeout(t *testing.T) {
	fake := startFake(t, modaltest.Config{})
	p := newProvider(t, fake, "sandgate-idle")
	sp := spec(t, "small", time.Hour)
	// Long enough that the exec below starts before it on a loaded
	// machine: a sandbox already ended would fail it.
	sp.IdleTimeout = 5 * time.Second
	sb, err := p.Create(t.Context(), sp)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	providertest.Exec(t, p, sb, "sleep", "1") // running: not idle
	deadline := time.Now().Add(time.Minute)
	for fakeSandbox(t, fake, sb.Ref).Result == nil {
		if time.Now().After(deadline) {
			t.Fatal("the idle sandbox still runs")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r := fakeSandbox(t, fake, sb.Ref).Result; r.GetStatus() != clientpb.GenericResult_GENERIC_STATUS_IDLE_TIMEOUT {
		t.Errorf("result = %v; want IDLE_TIMEOUT", r)
	}
}

func fakeSandbox(t testing.TB, fake *modaltest.Server, id string) modaltest.Sandbox {
	t.Helper()
	for _, s := range fake.Sandboxes() {
		if s.ID == id {
			return s
		}
	}
	t.Fatalf("the fake has no sandbox %s", id)
	return modaltest.Sandbox{}
}

// TestListPages: List follows SandboxList's pages (the fake's are 3
// long) and returns only this broker's live sandboxes.
func TestListPages(t *testing.T) {
	fake := startFake(t, modaltest.Config{})
	p := newProvider(t, fake, "sandgate-list")
	other := newProvider(t, fake, "sandgate-other")
	want := map[string]bool{}
	for range 7 {
		want[providertest.Create(t, p, spec(t, "small", time.Hour)).Ref] = true
	}
	providertest.Create(t, other, spec(t, "small", time.Hour))
	all, err := p.List(t.Context())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	got := map[string]bool{}
	for _, s := range all {
		got[s.Ref] = true
		if s.Labels[providers.LabelBroker] != "sandgate-list" || s.StartedAt.IsZero() {
			t.Errorf("listed %+v; want this broker's label and a start", s)
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("List = %v; want %v", got, want)
	}
	if n := len(fake.Calls("/modal.client.ModalClient/SandboxList")); n < 3 {
		t.Errorf("SandboxList called %d times; want at least 3 pages", n)
	}
}

// TestRetries: an idempotent call is retried on UNAVAILABLE with one
// idempotency key and counted attempts; TaskExecStart never is.
func TestRetries(t *testing.T) {
	fake := startFake(t, modaltest.Config{})
	p := newProvider(t, fake, "sandgate-retry")
	sb := providertest.Create(t, p, spec(t, "small", time.Hour))

	const list = "/modal.client.ModalClient/SandboxList"
	before := len(fake.Calls(list))
	fake.Fail(list, codes.Unavailable, 2)
	if _, err := p.List(t.Context()); err != nil {
		t.Fatalf("List with two UNAVAILABLE answers: %v", err)
	}
	calls := fake.Calls(list)[before:]
	if len(calls) < 3 {
		t.Fatalf("SandboxList called %d times; want 3 attempts at least", len(calls))
	}
	key := calls[0].Get("x-idempotency-key")
	for i, md := range calls[:3] {
		if !slices.Equal(md.Get("x-idempotency-key"), key) || len(key) != 1 {
			t.Errorf("attempt %d: x-idempotency-key %v; want %v on every attempt", i, md.Get("x-idempotency-key"), key)
		}
		if got := md.Get("x-retry-attempt"); !slices.Equal(got, []string{strconv.Itoa(i)}) {
			t.Errorf("attempt %d: x-retry-attempt %v", i, got)
		}
		if got := md.Get("x-retry-delay"); (i == 0) != (len(got) == 0) {
			t.Errorf("attempt %d: x-retry-delay %v; want it only on retries", i, got)
		}
		if md.Get("x-modal-client-type")[0] != "9" || len(md.Get("x-modal-auth-token")) != 1 {
			t.Errorf("attempt %d: client type %v, auth token %d; want 9 and a token", i, md.Get("x-modal-client-type"), len(md.Get("x-modal-auth-token")))
		}
	}

	const start = "/modal.task_command_router.TaskCommandRouter/TaskExecStart"
	before = len(fake.Calls(start))
	fake.Fail(start, codes.Unavailable, 1)
	if _, err := p.Exec(t.Context(), sb, providers.ExecSpec{Argv: []string{"true"}, Timeout: time.Minute}); err == nil {
		t.Error("Exec after an UNAVAILABLE start succeeded; want an error (never retried)")
	}
	if n := len(fake.Calls(start)) - before; n != 1 {
		t.Errorf("TaskExecStart sent %d times; want once", n)
	}
	for _, md := range fake.Calls(start) {
		if len(md.Get("authorization")) != 1 || len(md.Get("x-modal-token-secret")) != 0 {
			t.Errorf("router call metadata %v; want only the bearer JWT", md)
		}
	}
}

// TestRouterJWTRefresh: an expired router JWT is refreshed once on
// UNAUTHENTICATED and the call goes through.
func TestRouterJWTRefresh(t *testing.T) {
	fake := startFake(t, modaltest.Config{JWTTTL: 2 * time.Second})
	p := newProvider(t, fake, "sandgate-jwt")
	sb := providertest.Create(t, p, spec(t, "small", time.Hour))
	time.Sleep(2500 * time.Millisecond)
	if res := providertest.Exec(t, p, sb, "echo", "ok"); string(res.Stdout) != "ok\n" {
		t.Errorf("Exec after the JWT expired = %q", res.Stdout)
	}
	if n := len(fake.Calls("/modal.client.ModalClient/TaskGetCommandRouterAccess")); n < 2 {
		t.Errorf("router access asked %d times; want a refresh", n)
	}
}

// TestBadCredentials: a wrong secret fails the create with an error that
// names the variables and never the secret.
func TestBadCredentials(t *testing.T) {
	fake := startFake(t, modaltest.Config{})
	p, err := modal.New(t.Context(), modal.Config{
		ServerURL: fake.URL, TokenID: tokenID, TokenSecret: "as-wrong-secret-planted", RootCAs: fake.CertPool,
	}, providers.Env{BrokerID: "sandgate-creds"})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	_, err = p.Create(t.Context(), spec(t, "small", time.Hour))
	if err == nil || !strings.Contains(err.Error(), "MODAL_TOKEN_SECRET") || strings.Contains(err.Error(), "planted") {
		t.Errorf("Create with a wrong secret = %v; want an error naming MODAL_TOKEN_SECRET without the secret", err)
	}
}

// TestOpen: Open reads Modal's variables through Env.Getenv, and a missing
// credential names its variable.
func TestOpen(t *testing.T) {
	fake := startFake(t, modaltest.Config{})
	env := map[string]string{"MODAL_SERVER_URL": fake.URL, "MODAL_TOKEN_ID": tokenID}
	penv := providers.Env{BrokerID: "sandgate-open", Getenv: func(k string) string { return env[k] }}
	if _, err := modal.Open(t.Context(), "modal", yaml.Node{}, penv); err == nil || !strings.Contains(err.Error(), "MODAL_TOKEN_SECRET") {
		t.Errorf("Open without MODAL_TOKEN_SECRET = %v; want an error naming it", err)
	}
	env["MODAL_TOKEN_SECRET"] = tokenSecret
	p, err := modal.Open(t.Context(), "modal", yaml.Node{}, penv)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	p.Close()
	delete(env, "MODAL_TOKEN_ID")
	if _, err := modal.Open(t.Context(), "modal", yaml.Node{}, penv); err == nil || !strings.Contains(err.Error(), "MODAL_TOKEN_ID") {
		t.Errorf("Open without MODAL_TOKEN_ID = %v; want an error naming it", err)
	}
}

// TestSnapshotTTL: the image is stored with the snapshot's expiry, and the
// vendor deletes it then, with no broker involved.
func TestSnapshotTTL(t *testing.T) {
	t.Parallel() // mostly waiting on the clock: beside the others
	fake := startFake(t, modaltest.Config{})
	p := newProvider(t, fake, "sandgate-snap")
	sb := providertest.Create(t, p, spec(t, "small", time.Hour))
	providertest.Exec(t, p, sb, "sh", "-c", "mkdir -p /workspace/p && echo x >/workspace/p/f")
	// A TTL longer than the snapshot itself takes on a loaded machine: the
	// image must be there when Snapshot returns.
	ref, err := p.Snapshot(t.Context(), sb, providers.SnapshotSpec{ID: "snap_ttl", Dir: "/workspace/p", ExpiresAt: time.Now().Add(10 * time.Second)})
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if !fake.Images()[ref.Ref] {
		t.Fatalf("the fake has no image %s", ref.Ref)
	}
	deadline := time.Now().Add(time.Minute)
	for fake.Images()[ref.Ref] {
		if time.Now().After(deadline) {
			t.Fatal("the image outlived its TTL")
		}
		time.Sleep(100 * time.Millisecond)
	}
	dst := providertest.Create(t, p, spec(t, "small", time.Hour))
	if err := p.Restore(t.Context(), dst, ref, "/workspace/p"); !errors.Is(err, providers.ErrSnapshotGone) {
		t.Errorf("Restore after the TTL = %v; want ErrSnapshotGone", err)
	}
}

// TestThrottle: a call Modal throttles (an RPCRetryPolicy detail) waits
// the delay asked and is sent again, counting its throttle attempts.
func TestThrottle(t *testing.T) {
	fake := startFake(t, modaltest.Config{})
	p := newProvider(t, fake, "sandgate-throttle")
	const list = "/modal.client.ModalClient/SandboxList"
	if _, err := p.List(t.Context()); err != nil { // the App exists from here on
		t.Fatalf("List: %v", err)
	}
	before := len(fake.Calls(list))
	fake.Throttle(list, 200*time.Millisecond, 2)
	start := time.Now()
	if _, err := p.List(t.Context()); err != nil {
		t.Fatalf("List throttled twice: %v", err)
	}
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Errorf("List returned after %v; want the 2 × 200 ms asked", d)
	}
	calls := fake.Calls(list)[before:]
	if len(calls) < 3 || len(calls[0].Get("x-throttle-retry-attempt")) != 0 ||
		!slices.Equal(calls[1].Get("x-throttle-retry-attempt"), []string{"1"}) || !slices.Equal(calls[2].Get("x-throttle-retry-attempt"), []string{"2"}) {
		t.Errorf("throttle attempts %v; want none, 1, 2", calls)
	}
}

// TestDurableCommandKeepsSandbox: a durable command running longer than
// the idle timeout, with nobody reading it, keeps Modal from ending the
// sandbox as idle (its watcher is a running exec).
func TestDurableCommandKeepsSandbox(t *testing.T) {
	t.Parallel() // mostly waiting on the clock: beside the others
	fake := startFake(t, modaltest.Config{})
	p := newProvider(t, fake, "sandgate-durable")
	sp := spec(t, "small", time.Hour)
	sp.IdleTimeout = 3 * time.Second
	sb := providertest.Create(t, p, sp)
	// The check comes well past the idle timeout and well before the
	// command's end, with seconds to spare either side on a loaded machine.
	if err := p.StartCommand(t.Context(), sb, "long", providers.ExecSpec{Argv: []string{"sleep", "14"}, Timeout: time.Minute}); err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
	time.Sleep(8 * time.Second)
	if r := fakeSandbox(t, fake, sb.Ref).Result; r != nil {
		t.Fatalf("the sandbox ended %v while its command ran", r)
	}
	st := providertest.WaitCommand(t, p, sb, "long", 10)
	if st.State != providers.CommandCompleted || st.ExitCode != 0 {
		t.Errorf("command = %q exit %d; want completed 0", st.State, st.ExitCode)
	}
}

// TestExecOutputLost: an output stream that fails for good before its end
// is reported truncated, with what arrived, not as the whole output; the
// other stream, read to its end, is whole.
func TestExecOutputLost(t *testing.T) {
	fake := startFake(t, modaltest.Config{})
	p := newProvider(t, fake, "sandgate-lost")
	sb := providertest.Create(t, p, providertest.Spec(t))
	fake.Fail("/modal.task_command_router.TaskCommandRouter/TaskExecStdioRead", codes.PermissionDenied, 1)
	res := providertest.Exec(t, p, sb, "sh", "-c", "echo out; echo err >&2")
	lostOut := res.StdoutTruncated && len(res.Stdout) == 0 && string(res.Stderr) == "err\n" && !res.StderrTruncated
	lostErr := res.StderrTruncated && len(res.Stderr) == 0 && string(res.Stdout) == "out\n" && !res.StdoutTruncated
	if !lostOut && !lostErr {
		t.Errorf("exec with one stream's read failing = stdout %q (truncated %v), stderr %q (truncated %v); want the failed one empty and truncated, the other whole",
			res.Stdout, res.StdoutTruncated, res.Stderr, res.StderrTruncated)
	}
}

// fastClock runs a thousand times faster than the wall clock: the fake's
// image build (at least 50 ms) takes at least 50 s of it.
type fastClock struct{ start time.Time }

func (c fastClock) Now() time.Time { return c.start.Add(1000 * time.Since(c.start)) }

// TestTimeoutCountsFromCreate: what Create does before SandboxCreate (the
// App, an image build that can stream for minutes, the env Secret) takes
// time; the timeout sent must still end the sandbox by expires_at, so it
// is counted from SandboxCreate, not from Create's start.
func TestTimeoutCountsFromCreate(t *testing.T) {
	fake := startFake(t, modaltest.Config{})
	clock := fastClock{start: time.Now()}
	p, err := modal.New(t.Context(), modal.Config{
		ServerURL: fake.URL, TokenID: tokenID, TokenSecret: sandgate.Secret(tokenSecret), RootCAs: fake.CertPool,
		DefaultImage: "debian:bookworm-slim-never-built-before",
	}, providers.Env{BrokerID: "sandgate-slow-build", Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	sp := spec(t, "standard", time.Hour)
	sp.ExpiresAt = clock.Now().Add(23 * time.Hour)
	sb := providertest.Create(t, p, sp)
	for _, s := range fake.Sandboxes() {
		if s.ID != sb.Ref {
			continue
		}
		sent := time.Duration(s.Request.GetDefinition().GetTimeoutSecs()) * time.Second
		if most := 23*time.Hour - 50*time.Second; sent > most {
			t.Errorf("timeout_secs = %v after an image build of at least 50 s; want at most %v (to expires_at from SandboxCreate)", sent, most)
		}
		return
	}
	t.Fatalf("the fake has no sandbox %s", sb.Ref)
}

// TestSnapshotRefusesSymlinks: a directory reached through a symlink (the
// directory itself, or a parent) is not snapshotted: du, which does not
// follow it, would charge the quota for a link.
func TestSnapshotRefusesSymlinks(t *testing.T) {
	fake := startFake(t, modaltest.Config{})
	p := newProvider(t, fake, "sandgate-snap-links")
	sb := providertest.Create(t, p, spec(t, "small", time.Hour))
	providertest.Exec(t, p, sb, "sh", "-c", "mkdir -p /workspace/big/p && echo x >/workspace/big/p/f && ln -s /workspace/big /workspace/link && ln -s /workspace/big /workspace/up")
	for _, dir := range []string{"/workspace/link", "/workspace/up/p", "/workspace/link/"} {
		if _, err := p.Snapshot(t.Context(), sb, providers.SnapshotSpec{ID: "snap_link", Dir: dir}); !errors.Is(err, providers.ErrNotAFile) {
			t.Errorf("Snapshot of %s = %v; want ErrNotAFile", dir, err)
		}
	}
	if _, err := p.Snapshot(t.Context(), sb, providers.SnapshotSpec{ID: "snap_real", Dir: "/workspace/big/p/"}); err != nil {
		t.Errorf("Snapshot of the real directory = %v; want it stored", err)
	}
}
