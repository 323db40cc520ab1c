package flysprites_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/internal/guesttest"
	"github.com/sandgate/sandgate/internal/logbuf"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/blobstore"
	"github.com/sandgate/sandgate/providers/flysprites"
	"github.com/sandgate/sandgate/providers/flysprites/spritetest"
	"github.com/sandgate/sandgate/providers/providertest"
	"github.com/sandgate/sandgate/providers/runner"
)

// newProvider returns a provider talking to srv, with its log captured.
func newProvider(t testing.TB, srv *spritetest.Server, brokerID string, log *logbuf.Buffer) *flysprites.Provider {
	t.Helper()
	store, err := blobstore.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	env := providers.Env{BrokerID: brokerID, GuestBinary: guesttest.Binary(t)}
	if log != nil {
		env.Logger = slog.New(slog.NewJSONHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	p, err := flysprites.New(t.Context(), flysprites.Config{
		BaseURL: srv.URL, Token: sandgate.Secret(srv.Token()), Blobs: store, HTTPClient: srv.Client(),
	}, env)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

// TestProvider runs the contract suite against the fake, and then checks
// that every sprite the suite made had its policy (no network: the deny
// rule alone) before its first command.
func TestProvider(t *testing.T) {
	srv := spritetest.Start(t)
	t.Cleanup(func() { // runs last, once every sprite is gone
		all := srv.AllEvents()
		if len(all) < 5 {
			t.Errorf("the suite made %d sprites; want several", len(all))
		}
		for name, evs := range all {
			checkPolicyFirst(t, name, evs, []string{"deny:*"})
		}
	})
	providertest.Run(t, func(t *testing.T) providers.Provider { return newProvider(t, srv, "broker-suite", nil) })
}

// checkPolicyFirst fails unless the sprite's first policy is want and
// came before its first exec.
func checkPolicyFirst(t *testing.T, name string, evs []spritetest.Event, want []string) {
	t.Helper()
	policy, exec := -1, -1
	for i, e := range evs {
		if e.Kind == "policy" && policy < 0 {
			policy = i
			if !slices.Equal(e.Rules, want) {
				t.Errorf("%s: policy = %v; want %v", name, e.Rules, want)
			}
		}
		if e.Kind == "exec" && exec < 0 {
			exec = i
		}
	}
	if policy < 0 || (exec >= 0 && policy > exec) {
		t.Errorf("%s: policy at event %d, first exec at %d; want the policy first", name, policy, exec)
	}
}

// registry stands for the broker's egress proxy: it registers every
// workspace with a fixed credential.
type registry struct{ registered, unregistered []string }

func (r *registry) Register(ws egress.Workspace) (string, error) {
	r.registered = append(r.registered, ws.ID)
	return "cred-" + ws.ID, nil
}
func (r *registry) Unregister(id string) { r.unregistered = append(r.unregistered, id) }

// TestPolicyBeforeFirstCommand: every sprite's policy is set before its
// first command runs: with domains, the broker's proxy host allowed and
// a final deny; without, the deny alone.
func TestPolicyBeforeFirstCommand(t *testing.T) {
	t.Parallel()
	srv := spritetest.Start(t)
	reg := &registry{}
	ve, err := providers.NewVendorEgress("https://proxy.sg.test:8443", nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	store, err := blobstore.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p, err := flysprites.New(t.Context(), flysprites.Config{BaseURL: srv.URL, Token: sandgate.Secret(srv.Token()), Blobs: store, HTTPClient: srv.Client()},
		providers.Env{BrokerID: "broker-policy", GuestBinary: guesttest.Binary(t), VendorEgress: ve})
	if err != nil {
		t.Fatal(err)
	}
	if c := p.Capabilities(); c.Egress != providers.EgressProxy {
		t.Errorf("egress with the proxy served to guests = %v; want proxy", c.Egress)
	}
	for _, tt := range []struct {
		allow []string
		want  []string
	}{
		{[]string{}, []string{"deny:*"}},
		{[]string{"github.com", "*.githubusercontent.com"}, []string{"allow:proxy.sg.test", "deny:*"}},
	} {
		spec := providertest.Spec(t)
		spec.Egress.AllowedDomains = tt.allow
		sb := providertest.Create(t, p, spec)
		providertest.Exec(t, p, sb, "true")
		checkPolicyFirst(t, sb.Ref, srv.Events(sb.Ref), tt.want)
	}
}

// TestLabelsCarryNoClientData: the sprite's labels are the broker's ids
// only, and neither the env nor anything else the client sent reaches the
// sprite record.
func TestLabelsCarryNoClientData(t *testing.T) {
	t.Parallel()
	srv := spritetest.Start(t)
	p := newProvider(t, srv, "broker-labels", nil)
	spec := providertest.Spec(t)
	spec.Env = map[string]string{"CLIENT_SECRET": "client-value-x1"}
	sb := providertest.Create(t, p, spec)
	info, ok := srv.Sprite(sb.Ref)
	if !ok {
		t.Fatalf("no sprite %s", sb.Ref)
	}
	want := []string{
		providers.LabelBroker + "=broker-labels",
		providers.LabelWorkspace + "=" + spec.WorkspaceID,
		providers.LabelInstance + "=" + spec.InstanceID,
	}
	if !slices.Equal(info.Labels, want) {
		t.Errorf("labels = %q; want %q", info.Labels, want)
	}
	if len(info.Environment) != 0 {
		t.Errorf("sprite record environment = %v; want none (the env stays inside the sprite)", info.Environment)
	}
	if info.CPUs != spec.Size.CPUCores || info.RAMMB != spec.Size.MemoryMiB {
		t.Errorf("config = %d cpus, %d MiB; want the tier's %d, %d", info.CPUs, info.RAMMB, spec.Size.CPUCores, spec.Size.MemoryMiB)
	}
	if res := providertest.Exec(t, p, sb, "sh", "-c", `printf %s "$CLIENT_SECRET"`); string(res.Stdout) != "client-value-x1" {
		t.Errorf("env in the sprite = %q; want the client's value", res.Stdout)
	}
}

// TestDeadlineWithoutBroker: with no broker process running at all, no
// workspace process runs past expires_at; the sprite stays (asleep, costing
// storage) for the reaper to delete.
func TestDeadlineWithoutBroker(t *testing.T) {
	t.Parallel()
	srv := spritetest.Start(t)
	p := newProvider(t, srv, "broker-deadline", nil)
	spec := providertest.Spec(t)
	// Room for the create, the command and the exec below, which must come
	// before the end, on a loaded machine.
	spec.ExpiresAt = time.Now().Add(20 * time.Second)
	sb := providertest.Create(t, p, spec)
	const hb = "/tmp/deadline-hb"
	heartbeat := `( i=0; while :; do i=$((i+1)); echo $i >"$1.tmp"; mv "$1.tmp" "$1"; sleep 0.1; done ) & sleep 300`
	// A durable command and a detached background process.
	if err := runner.For(p).StartCommand(t.Context(), sb, "deadline-cmd", providers.ExecSpec{
		Argv: []string{"sh", "-c", heartbeat, "sh", hb}, Timeout: 5 * time.Minute,
	}); err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
	if res := providertest.Exec(t, p, sb, "sh", "-c", `setsid sleep 333 </dev/null >/dev/null 2>&1 &`); res.ExitCode != 0 {
		t.Fatalf("background start: exit %d", res.ExitCode)
	}
	// Every broker process is gone from here on: only the fake runs.
	p.Close()
	ctx := t.Context()
	for start := time.Now(); beats(t, srv, sb.Ref, hb) == ""; time.Sleep(50 * time.Millisecond) {
		if time.Since(start) > time.Minute {
			t.Fatalf("the heartbeat does not run")
		}
	}
	time.Sleep(time.Until(spec.ExpiresAt))
	// The guest's keeper ends it at expires_at; a loaded machine may run
	// the heartbeat's last beats a moment later. One that never stops
	// still fails.
	for {
		a := beats(t, srv, sb.Ref, hb)
		time.Sleep(time.Second)
		b := beats(t, srv, sb.Ref, hb)
		if a == b {
			break
		}
		if late := time.Since(spec.ExpiresAt); late > 30*time.Second {
			t.Fatalf("heartbeat still advancing %v after expires_at (%s → %s)", late, a, b)
		}
	}
	ps, err := srv.Run(ctx, sb.Ref, "sh", "-c", `for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' <"$f"; echo; done 2>/dev/null`)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"sleep 300", "sleep 333"} {
		if strings.Contains(string(ps.Stdout), m) {
			t.Errorf("%q still runs after expires_at:\n%s", m, ps.Stdout)
		}
	}
	if _, ok := srv.Sprite(sb.Ref); !ok {
		t.Errorf("the sprite is gone; want it kept for the reaper")
	}
}

// beats reads the heartbeat file inside the sprite, bypassing the provider
// and every jail: the tenant wrote it on the jails' root, an overlay whose
// writes land under /.sandgate/root/LAYER/upper (docs/guest.md).
func beats(t *testing.T, srv *spritetest.Server, name, file string) string {
	t.Helper()
	res, err := srv.Run(t.Context(), name, "sudo", "-n", "sh", "-c", `for f in /.sandgate/root/*/upper"$1" /.sandgate/root/*/upper/"${1##*/}"; do [ -f "$f" ] && cat "$f"; done; true`, "sh", file)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(res.Stdout))
}

// TestListFindsOrphans: a sprite of this broker that no record knows (a
// create whose answer was lost) is listed across pages, with its labels;
// other brokers' sprites are not.
func TestListFindsOrphans(t *testing.T) {
	t.Parallel()
	srv := spritetest.Start(t)
	p := newProvider(t, srv, "broker-list", nil)
	other := newProvider(t, srv, "broker-other", nil)
	spec := providertest.Spec(t)
	sb := providertest.Create(t, p, spec)
	providertest.Create(t, other, providertest.Spec(t))
	var want []string
	want = append(want, sb.Ref)
	for range 51 { // more than one page of 50
		s := providertest.Spec(t)
		s.ExpiresAt = time.Time{}
		want = append(want, providertest.Create(t, p, s).Ref)
	}
	slices.Sort(want)
	refs := providertest.ListRefs(t, p, "broker-list")
	if !slices.Equal(refs, want) {
		t.Errorf("List = %d sprites; want the %d of this broker", len(refs), len(want))
	}
	if err := p.Terminate(t.Context(), sb); err != nil {
		t.Fatalf("Terminate of an orphan: %v", err)
	}
}

// TestCreateAfterUnclearAnswer: the create landed but its answer was a
// 500; the provider looks the name up and takes the sprite as its own
// instead of creating a second one.
func TestCreateAfterUnclearAnswer(t *testing.T) {
	t.Parallel()
	srv := spritetest.Start(t)
	p := newProvider(t, srv, "broker-unclear", nil)
	srv.InjectAfter(http.MethodPost, "/v1/sprites", http.StatusInternalServerError, `{"error":"internal"}`)
	sb := providertest.Create(t, p, providertest.Spec(t))
	if res := providertest.Exec(t, p, sb, "true"); res.ExitCode != 0 {
		t.Errorf("exec in the sprite = exit %d", res.ExitCode)
	}
	creates := 0
	for _, e := range srv.Events(sb.Ref) {
		if e.Kind == "create" {
			creates++
		}
	}
	if names := srv.Names(); creates != 1 || len(names) != 1 {
		t.Errorf("after an unclear create: %d creates, sprites %v; want one", creates, names)
	}
	// A name held by a sprite that is not this workspace's is refused.
	spec := providertest.Spec(t)
	name := flysprites.NamePrefix("broker-unclear", "fly-sprites") + strings.ReplaceAll(spec.WorkspaceID, "_", "-")
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/sprites",
		strings.NewReader(`{"name":"`+name+`","labels":["sandgate-broker=someone-else"]}`))
	req.Header.Set("Authorization", "Bearer "+srv.Token())
	req.Header.Set("Content-Type", "application/json")
	resp, err := srv.Client().Do(req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("creating a sprite at the fake: %v, %v", resp, err)
	}
	resp.Body.Close()
	if _, err := p.Create(t.Context(), spec); err == nil {
		t.Errorf("Create of a name another sprite holds succeeded; want an error")
	}
	if info, _ := srv.Sprite(name); !slices.Equal(info.Labels, []string{"sandgate-broker=someone-else"}) {
		t.Errorf("the other sprite's labels = %v; want it untouched", info.Labels)
	}
}

// TestRateLimitRetried: a 429 is retried after retry_after_seconds.
func TestRateLimitRetried(t *testing.T) {
	t.Parallel()
	srv := spritetest.Start(t)
	p := newProvider(t, srv, "broker-429", nil)
	srv.Inject(http.MethodPost, "/v1/sprites", http.StatusTooManyRequests,
		`{"error":"sprite_creation_rate_limited","message":"slow down","retry_after_seconds":1}`)
	start := time.Now()
	sb := providertest.Create(t, p, providertest.Spec(t))
	if d := time.Since(start); d < time.Second {
		t.Errorf("Create after a 429 took %v; want at least the 1s asked for", d)
	}
	providertest.Exec(t, p, sb, "true")
	// A concurrency limit is not cleared by waiting: no retry.
	srv.Inject(http.MethodPost, "/v1/sprites", http.StatusTooManyRequests,
		`{"error":"concurrent_sprite_limit_exceeded","retry_after_seconds":1}`)
	if _, err := p.Create(t.Context(), providertest.Spec(t)); err == nil || !strings.Contains(err.Error(), "429") {
		t.Errorf("Create at the concurrency limit = %v; want the 429", err)
	}
}

// TestPolicyMustTake: a policy the vendor does not keep refuses the workspace.
func TestPolicyMustTake(t *testing.T) {
	t.Parallel()
	srv := spritetest.Start(t)
	p := newProvider(t, srv, "broker-policy-fail", nil)
	srv.Inject(http.MethodGet, "/policy/network", http.StatusOK, `{"rules":[]}`)
	spec := providertest.Spec(t)
	if _, err := p.Create(t.Context(), spec); err == nil {
		t.Fatalf("Create with a policy that did not take succeeded")
	}
	if names := srv.Names(); len(names) != 0 {
		t.Errorf("sprites left after the refused create: %v", names)
	}
}

// TestNoSecretsInErrors: the token, argv, env and paths appear in no
// error and no log line.
func TestNoSecretsInErrors(t *testing.T) {
	t.Parallel()
	srv := spritetest.Start(t)
	log := &logbuf.Buffer{}
	p := newProvider(t, srv, "broker-secrets", log)
	spec := providertest.Spec(t)
	spec.Env = map[string]string{"SECRET_ENV": "secret-env-v1"}
	sb := providertest.Create(t, p, spec)
	var errs []error
	_, err := providers.ReadFileBytes(t.Context(), p, sb, "/tmp/secret-path-p1/x", 10)
	errs = append(errs, err)
	errs = append(errs, providers.WriteFileBytes(t.Context(), p, sb, "/tmp/secret-path-p1", nil))
	errs = append(errs, providers.WriteFileBytes(t.Context(), p, sb, "/tmp/secret-path-p1/below", nil))
	providertest.Exec(t, p, sb, "echo", "secret-argv-a1")
	p.Terminate(t.Context(), sb)
	_, err = p.Exec(t.Context(), sb, providers.ExecSpec{Argv: []string{"echo", "secret-argv-a1"}})
	errs = append(errs, err)
	bad, _ := flysprites.New(t.Context(), flysprites.Config{BaseURL: srv.URL, Token: "secret-token-t1",
		Blobs: blobstore.Store(nil), HTTPClient: srv.Client()}, providers.Env{})
	if bad != nil {
		t.Errorf("New without a blob store succeeded")
	}
	store, _ := blobstore.NewDir(t.TempDir())
	bad, _ = flysprites.New(t.Context(), flysprites.Config{BaseURL: srv.URL, Token: "secret-token-t1",
		Blobs: store, HTTPClient: srv.Client()}, providers.Env{GuestBinary: guesttest.Binary(t)})
	_, err = bad.Create(t.Context(), providertest.Spec(t))
	errs = append(errs, err)
	for _, e := range errs {
		if e == nil {
			continue
		}
		for _, s := range []string{"secret-", srv.Token()} {
			if strings.Contains(e.Error(), s) {
				t.Errorf("error %q holds %q", e, s)
			}
		}
	}
	for _, s := range []string{"secret-", srv.Token()} {
		if strings.Contains(log.String(), s) {
			t.Errorf("log holds %q:\n%s", s, log.String())
		}
	}
	if !errors.Is(errs[0], providers.ErrFileNotFound) {
		t.Errorf("ReadFile of a missing file = %v; want ErrFileNotFound", errs[0])
	}
	if !errors.Is(errs[3], providers.ErrSandboxGone) {
		t.Errorf("Exec after Terminate = %v; want ErrSandboxGone", errs[3])
	}
	_ = context.Background
}

// TestOpen: the token comes from SPRITE_TOKEN and its absence is an error
// naming it; SPRITES_API_URL must be an http(s) URL; settings have no keys.
func TestOpen(t *testing.T) {
	t.Parallel()
	env := func(vars map[string]string) providers.Env {
		return providers.Env{BrokerID: "b", GuestBinary: guesttest.Binary(t), DataDir: t.TempDir(), Getenv: func(k string) string { return vars[k] }}
	}
	var empty yaml.Node
	if _, err := flysprites.Open(t.Context(), "fly-sprites", empty, env(nil)); err == nil || !strings.Contains(err.Error(), "SPRITE_TOKEN") {
		t.Errorf("Open without SPRITE_TOKEN = %v; want an error naming it", err)
	}
	if _, err := flysprites.Open(t.Context(), "fly-sprites", empty, env(map[string]string{"SPRITE_TOKEN": "tok-open-1", "SPRITES_API_URL": "ftp://x"})); err == nil ||
		!strings.Contains(err.Error(), "SPRITES_API_URL") || strings.Contains(err.Error(), "tok-open-1") {
		t.Errorf("Open with a bad SPRITES_API_URL = %v; want an error naming it, without the token", err)
	}
	var settings yaml.Node
	if err := yaml.Unmarshal([]byte("token: x\n"), &settings); err != nil {
		t.Fatal(err)
	}
	if _, err := flysprites.Open(t.Context(), "fly-sprites", *settings.Content[0], env(map[string]string{"SPRITE_TOKEN": "t"})); err == nil {
		t.Errorf("Open with an unknown settings key succeeded")
	}
	p, err := flysprites.Open(t.Context(), "fly-sprites", empty, env(map[string]string{"SPRITE_TOKEN": "t"}))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	caps := p.Capabilities()
	// No egress proxy for guests: the vendor's DNS policy alone is not
	// trusted with an allowlist.
	if caps.Egress != providers.EgressNoneOnly || !caps.Snapshots || !caps.NativeCommands || caps.VendorLifetime || caps.VendorIdle || caps.DefaultImage != flysprites.Image {
		t.Errorf("Capabilities = %+v", caps)
	}
	if err := caps.CheckScope("fly-sprites", sandgate.Scope{EgressCeiling: []string{"github.com"}}); err == nil {
		t.Errorf("a domain ceiling without the egress proxy is enforceable; want refused")
	}
}

// TestCancelBeforeSessionInfo: a request canceled after its command
// started but before the vendor sent the session's id still ends the
// command and everything it started, instead of leaving it to the
// vendor's disconnect timer.
func TestCancelBeforeSessionInfo(t *testing.T) {
	srv := spritetest.StartWith(t, spritetest.Config{SessionInfoDelay: time.Second})
	providertest.RunContextCancel(t, func(t *testing.T) providers.Provider { return newProvider(t, srv, "broker-slow-info", nil) })
}

// TestFilesStayInTheJail: a tenant's symlink to the agent's directory
// leads a file read or write to what the tenant sees there (nothing), not
// to the agent's files outside every jail: a read must not show the
// jail's env, a write must not replace the binary the broker runs as
// root. Whether the vendor's fs API follows symlinks is not documented
// (the fake's does, as a root process of the guest would), so the broker
// must not depend on it.
func TestFilesStayInTheJail(t *testing.T) {
	t.Parallel()
	srv := spritetest.Start(t)
	p := newProvider(t, srv, "broker-links", nil)
	spec := providertest.Spec(t)
	spec.Env = map[string]string{"TENANT_SECRET": "s3cret-of-the-tenant"}
	sb := providertest.Create(t, p, spec)
	providertest.Exec(t, p, sb, "sh", "-c", "ln -s ../.sandgate /workspace/d && ln -s ../.sandgate/jail.json /workspace/jail")
	for _, f := range []string{"/workspace/d/jail.json", "/workspace/jail"} {
		if got, err := providers.ReadFileBytes(t.Context(), p, sb, f, 1<<20); err == nil || strings.Contains(string(got), "s3cret") {
			t.Errorf("read of %s (a link into the agent's directory) = %q, %v; want an error", f, got, err)
		}
	}
	_ = providers.WriteFileBytes(t.Context(), p, sb, "/workspace/d/sandgate-guest", []byte("#!/bin/sh\necho owned\n"))
	if r := providertest.Exec(t, p, sb, "echo", "still jailed"); string(r.Stdout) != "still jailed\n" {
		t.Errorf("exec after a write through a link to the agent's binary = %q; want the agent intact", r.Stdout)
	}
}

// TestDeadKeeperRefusesCommands: the sprite's lifetime rests on the
// detached keeper; once it is gone (killed from outside every jail), no
// command runs unbounded: the next is refused.
func TestDeadKeeperRefusesCommands(t *testing.T) {
	t.Parallel()
	srv := spritetest.Start(t)
	p := newProvider(t, srv, "broker-keeper", nil)
	sb := providertest.Create(t, p, providertest.Spec(t))
	// The jail's hostname and hosts name nothing of the vendor's.
	r := providertest.Exec(t, p, sb, "sh", "-c", "hostname; cat /etc/hostname /etc/hosts")
	if strings.Contains(string(r.Stdout), sb.Ref) || !strings.HasPrefix(string(r.Stdout), "sandbox\nsandbox\n") {
		t.Errorf("hostname and hosts in the jail = %q; want sandbox and nothing of the sprite's name", r.Stdout)
	}
	kill, err := srv.Run(t.Context(), sb.Ref, "sudo", "-n", "sh", "-c", `kill -9 "$(cut -d ' ' -f 1 /.sandgate/keeper)"`)
	if err != nil || kill.ExitCode != 0 {
		t.Fatalf("killing the keeper: %+v, %v", kill, err)
	}
	// A command that exits 125 itself, the keeper alive in another
	// sprite, is the command's status and nothing more.
	other := providertest.Create(t, p, providertest.Spec(t))
	if res := providertest.Exec(t, p, other, "sh", "-c", "exit 125"); res.ExitCode != 125 {
		t.Errorf("exit 125 of a tenant's command = %d", res.ExitCode)
	}
	if _, ok := srv.Sprite(other.Ref); !ok {
		t.Errorf("a sprite whose command exited 125 was deleted; its keeper lives")
	}
	// With the keeper gone nothing would end the sprite at expires_at:
	// the command does not run, the sprite is deleted, the workspace is
	// gone.
	res, err := p.Exec(t.Context(), sb, providers.ExecSpec{Argv: []string{"sh", "-c", "echo ran >/tmp/ran; echo ran"}, Timeout: 30 * time.Second, MaxOutputBytes: 1 << 10})
	if !errors.Is(err, providers.ErrSandboxGone) || len(res.Stdout) != 0 {
		t.Errorf("exec after the keeper died = %+v, %v; want ErrSandboxGone and nothing run", res, err)
	}
	if _, ok := srv.Sprite(sb.Ref); ok {
		t.Errorf("the sprite whose keeper died still exists; want it deleted")
	}
}
