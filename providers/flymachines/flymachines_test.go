package flymachines_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	stdmaps "maps"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/internal/guesttest"
	"github.com/sandgate/sandgate/internal/testpki"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/flymachines"
	"github.com/sandgate/sandgate/providers/flymachines/flytest"
	"github.com/sandgate/sandgate/providers/providertest"
)

const testToken = "fm2_flytest-token-7f3a"

// startFake starts a fake Machines API for the test.
func startFake(t testing.TB, o flytest.Options) *flytest.Server {
	t.Helper()
	if o.Token == "" {
		o.Token = testToken
	}
	if o.DataDir == "" {
		o.DataDir = t.TempDir()
	}
	s, err := flytest.New(t.Context(), o)
	if err != nil {
		t.Fatalf("flytest.New: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// config is a provider config against s.
func config(t testing.TB, s *flytest.Server) flymachines.Config {
	return flymachines.Config{
		BaseURL: s.URL(), Token: sandgate.Secret(testToken), App: "sandgate-test", Org: "personal",
		BlobDir: t.TempDir(), Transport: s.Transport(),
	}
}

func newProvider(t testing.TB, c flymachines.Config, broker string) *flymachines.Provider {
	t.Helper()
	p, err := flymachines.New(t.Context(), c, providers.Env{GuestBinary: guesttest.Binary(t), BrokerID: broker})
	if err != nil {
		t.Fatalf("flymachines.New: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestProviderSuite(t *testing.T) {
	s := startFake(t, flytest.Options{})
	cfg := config(t, s)
	providertest.Run(t, func(t *testing.T) providers.Provider { return newProvider(t, cfg, "broker-suite") })
}

// waitUntil polls cond for at most d.
func waitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestMachineConfig checks what the fake received: auto_destroy, restart
// "no", the lifetime-bound init, the broker's metadata and nothing the
// client sent but the env, and the tier's guest.
func TestMachineConfig(t *testing.T) {
	s := startFake(t, flytest.Options{})
	p := newProvider(t, config(t, s), "broker-cfg")
	for _, tt := range []struct {
		size     string
		kind     string
		cpus, mb int
	}{
		{"small", "shared", 2, 512},
		{"standard", "shared", 4, 2048},
		{"large", "shared", 8, 8192},
		{"xlarge", "performance", 16, 32768},
	} {
		t.Run(tt.size, func(t *testing.T) {
			spec := providertest.Spec(t)
			spec.Size, _ = sandgate.LookupSize(tt.size)
			if tt.size != "small" {
				// Only the config matters here; the fake would really run
				// an xlarge guest.
				cfg, err := p.MachineConfig(spec, time.Now(), "")
				if err != nil {
					t.Fatalf("MachineConfig: %v", err)
				}
				if g := cfg.Guest; g.CPUKind != tt.kind || g.CPUs != tt.cpus || g.MemoryMB != tt.mb {
					t.Errorf("guest of %s = %+v; want %s, %d vCPUs, %d MB", tt.size, *g, tt.kind, tt.cpus, tt.mb)
				}
				return
			}
			spec.ExpiresAt = time.Now().Add(10 * time.Minute).Truncate(time.Second)
			sb := providertest.Create(t, p, spec)
			m, ok := s.Machine(sb.Ref)
			if !ok {
				t.Fatalf("the fake has no machine %s", sb.Ref)
			}
			c := m.Config
			if !c.AutoDestroy || c.Restart == nil || c.Restart.Policy != "no" {
				t.Errorf("auto_destroy %v, restart %+v; want true, policy no", c.AutoDestroy, c.Restart)
			}
			if g := c.Guest; g == nil || g.CPUKind != tt.kind || g.CPUs != tt.cpus || g.MemoryMB != tt.mb {
				t.Errorf("guest = %+v; want %s, %d vCPUs, %d MB", g, tt.kind, tt.cpus, tt.mb)
			}
			wantMD := map[string]string{providers.LabelBroker: "broker-cfg", providers.LabelWorkspace: spec.WorkspaceID, providers.LabelInstance: spec.InstanceID}
			if len(c.Metadata) != len(wantMD) {
				t.Errorf("metadata = %v; want exactly %v", c.Metadata, wantMD)
			}
			for k, v := range wantMD {
				if c.Metadata[k] != v {
					t.Errorf("metadata[%s] = %q; want %q", k, c.Metadata[k], v)
				}
			}
			for k, v := range c.Metadata {
				if strings.Contains(v, providertest.EnvValue) || k == providertest.EnvVar {
					t.Errorf("metadata carries client data: %s=%s", k, v)
				}
			}
			// Fly gives config.env to every process of the guest, the
			// broker's root scripts too: the workspace's env is a file the
			// jails read.
			if len(c.Env) != 0 {
				t.Errorf("env = %v; want none (the workspace's env is a file)", c.Env)
			}
			if c.Init == nil || !slices.Equal(c.Init.Exec, []string{providers.GuestAgent, "keeper", "--until", strconvUnix(spec.ExpiresAt)}) {
				t.Errorf("init = %+v; want the agent's keeper ending at %d, without egress", c.Init, spec.ExpiresAt.Unix())
			}
			agent, err := os.ReadFile(guesttest.Binary(t))
			if err != nil {
				t.Fatal(err)
			}
			if len(c.Files) != 2 || c.Files[0].GuestPath != providers.GuestAgent || c.Files[0].Mode != 0o700 ||
				c.Files[0].RawValue == nil || *c.Files[0].RawValue != base64.StdEncoding.EncodeToString(agent) {
				t.Fatalf("files = %d entries; want the agent at %s, mode 0700, and the env file", len(c.Files), providers.GuestAgent)
			}
			f := c.Files[1]
			var env map[string]string
			if f.RawValue != nil {
				b, _ := base64.StdEncoding.DecodeString(*f.RawValue)
				json.Unmarshal(b, &env)
			}
			if f.GuestPath != providers.GuestDir+"/env.json" || f.Mode != 0o600 || fmt.Sprint(env) != fmt.Sprint(spec.Env) {
				t.Errorf("files[1] = %s mode %o, env %v; want the workspace's env %v at %s/env.json, mode 0600", f.GuestPath, f.Mode, env, spec.Env, providers.GuestDir)
			}
			if c.Image != flymachines.DefaultImage {
				t.Errorf("image = %q; want %q", c.Image, flymachines.DefaultImage)
			}
		})
	}
}

func strconvUnix(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }

// TestLifetimeWithoutBroker: with no broker process alive, the Machine's
// own main process ends at expires_at and Fly destroys it (auto_destroy).
func TestLifetimeWithoutBroker(t *testing.T) {
	t.Parallel() // mostly waiting on the clock: beside the others
	s := startFake(t, flytest.Options{})
	p, err := flymachines.New(t.Context(), config(t, s), providers.Env{GuestBinary: guesttest.Binary(t), BrokerID: "broker-life"})
	if err != nil {
		t.Fatal(err)
	}
	spec := providertest.Spec(t)
	// Long enough for a create on a loaded host (the agent's config.files
	// make a boot slower than a bare one).
	spec.ExpiresAt = time.Now().Add(45 * time.Second)
	sb, err := p.Create(t.Context(), spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	p.Close() // no broker from here on
	waitUntil(t, time.Until(spec.ExpiresAt)+60*time.Second, "machine destroyed at expires_at", func() bool {
		m, _ := s.Machine(sb.Ref)
		return m.State == "destroyed"
	})
	m, _ := s.Machine(sb.Ref)
	if m.DestroyedAt.Before(spec.ExpiresAt.Add(-time.Second)) {
		t.Errorf("destroyed at %v, before expires_at %v", m.DestroyedAt, spec.ExpiresAt)
	}
	if m.ExitCode == nil || *m.ExitCode != 0 {
		t.Errorf("main process exit = %v; want 0 (it ended by itself)", m.ExitCode)
	}
}

// TestEgressDenyAllBeforeFirstExec: the app's deny-all policy exists
// before any Machine, so every Machine starts under it.
func TestEgressDenyAllBeforeFirstExec(t *testing.T) {
	s := startFake(t, flytest.Options{})
	p := newProvider(t, config(t, s), "broker-egress")
	pols := s.Policies("sandgate-test")
	if len(pols) != 1 || pols[0].Name != flymachines.PolicyName || !pols[0].Selector.All ||
		len(pols[0].Rules) != 1 || pols[0].Rules[0].Direction != "egress" {
		t.Fatalf("policies = %+v; want the one deny-all egress policy for all machines", pols)
	}
	sb := providertest.Create(t, p, providertest.Spec(t))
	// The fake runs the Machine with no network at all: only lo.
	if res := providertest.Exec(t, p, sb, "cat", "/proc/net/dev"); strings.Count(string(res.Stdout), ":") != 1 || !strings.Contains(string(res.Stdout), "lo:") {
		t.Errorf("interfaces in the machine:\n%s\nwant only lo", res.Stdout)
	}
	m, _ := s.Machine(sb.Ref)
	if m.EgressAtFirstExec != "deny-all" {
		t.Errorf("egress at the first exec = %q; want deny-all", m.EgressAtFirstExec)
	}
	// A second broker process on the same app does not add another.
	newProvider(t, config(t, s), "broker-egress")
	if n := len(s.Policies("sandgate-test")); n != 1 {
		t.Errorf("%d policies after a second New; want 1", n)
	}
	spec := providertest.Spec(t)
	spec.Egress.AllowedDomains = []string{"example.com"}
	if _, err := p.Create(t.Context(), spec); err == nil {
		t.Errorf("Create with a domain allowlist succeeded; want a refusal")
	}
	if c := p.Capabilities(); c.Egress != providers.EgressNoneOnly || !c.VendorLifetime || c.VendorIdle || !c.Snapshots {
		t.Errorf("capabilities = %+v; want egress none, vendor lifetime, no vendor idle, snapshots", c)
	}
}

// registry stands for the broker's egress proxy: it registers every
// workspace with a fixed credential.
type registry struct {
	mu                       sync.Mutex
	registered, unregistered []string
}

func (r *registry) Register(ws egress.Workspace) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.registered = append(r.registered, ws.ID+"="+strings.Join(ws.AllowedDomains, ","))
	return "cred-" + ws.ID, nil
}

func (r *registry) Unregister(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unregistered = append(r.unregistered, id)
}

// proxyEgress is a VendorEgress of a proxy at proxy.sg.test:8443 (which
// no guest reaches), its registry and its CA.
func proxyEgress(t *testing.T) (*providers.VendorEgress, *registry, []byte) {
	reg := &registry{}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: testpki.Issue(t, "proxy CA", []string{"proxy.sg.test"}, nil).CADER})
	ve, err := providers.NewVendorEgress("https://proxy.sg.test:8443", ca, reg)
	if err != nil {
		t.Fatal(err)
	}
	return ve, reg, ca
}

// TestEgressThroughTheProxy: with the broker's proxy served to guests,
// the provider offers domain allowlists; the app's policy allows only the
// proxy's port; a workspace with domains is registered, gets its
// credential and the proxy's CA as config.files beside the agent and a
// keeper that forwards to the proxy, and is unregistered at terminate.
func TestEgressThroughTheProxy(t *testing.T) {
	s := startFake(t, flytest.Options{})
	ve, reg, ca := proxyEgress(t)
	p, err := flymachines.New(t.Context(), config(t, s), providers.Env{BrokerID: "broker-proxy", GuestBinary: guesttest.Binary(t), VendorEgress: ve})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if c := p.Capabilities(); c.Egress != providers.EgressProxy {
		t.Errorf("egress = %v; want proxy", c.Egress)
	}
	pols := s.Policies("sandgate-test")
	if len(pols) != 1 || pols[0].Name != flymachines.ProxyPolicyName || !pols[0].Selector.All || len(pols[0].Rules) != 1 ||
		pols[0].Rules[0].Action != "allow" || pols[0].Rules[0].Direction != "egress" || len(pols[0].Rules[0].Ports) != 1 ||
		pols[0].Rules[0].Ports[0].Protocol != "tcp" || pols[0].Rules[0].Ports[0].Port != 8443 {
		t.Fatalf("policies = %+v; want one egress policy for all machines allowing tcp 8443 only", pols)
	}
	spec := providertest.Spec(t)
	spec.Egress.AllowedDomains = []string{"example.com"}
	sb := providertest.Create(t, p, spec)
	if want := spec.WorkspaceID + "=example.com"; len(reg.registered) != 1 || reg.registered[0] != want {
		t.Errorf("registered %v; want %s", reg.registered, want)
	}
	m, _ := s.Machine(sb.Ref)
	files := map[string]string{}
	for _, f := range m.Config.Files {
		if f.RawValue != nil {
			b, _ := base64.StdEncoding.DecodeString(*f.RawValue)
			files[f.GuestPath+" "+strconv.FormatUint(uint64(f.Mode), 8)] = string(b)
		}
	}
	if len(files) != 4 || files[providers.GuestCredFile+" 600"] != "cred-"+spec.WorkspaceID+"\n" || files[providers.GuestCAFile+" 600"] != string(ca) ||
		len(files[providers.GuestAgent+" 700"]) == 0 || len(files[providers.GuestDir+"/env.json 600"]) == 0 {
		t.Errorf("files: %d; want the agent (0700), the env file, the credential and the CA (0600)", len(files))
	}
	want := []string{providers.GuestAgent, "keeper", "--until", strconvUnix(spec.ExpiresAt.Add(time.Second - 1)), "--egress-sock", providers.GuestEgressSock,
		"--egress-proxy", "proxy.sg.test:8443", "--egress-server-name", "proxy.sg.test", "--egress-user", spec.WorkspaceID,
		"--egress-cred-file", providers.GuestCredFile, "--egress-ca", providers.GuestCAFile}
	if m.Config.Init == nil || !slices.Equal(m.Config.Init.Exec, want) {
		t.Errorf("init = %+v; want %q", m.Config.Init, want)
	}
	if err := p.Terminate(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	if len(reg.unregistered) != 1 || reg.unregistered[0] != spec.WorkspaceID {
		t.Errorf("unregistered %v; want %s", reg.unregistered, spec.WorkspaceID)
	}
}

// TestAppCreatedOnce: a missing app is created in the org; an answer lost
// on the way is retried with the same idempotency key.
func TestAppCreatedOnce(t *testing.T) {
	s := startFake(t, flytest.Options{Orgs: []string{"personal"}})
	s.LoseAnswers("POST /v1/apps", 1)
	newProvider(t, config(t, s), "broker-app")
	var posts int
	for _, r := range s.Requests() {
		if r.Method == "POST" && r.Path == "/v1/apps" {
			posts++
		}
	}
	if posts != 2 {
		t.Errorf("%d app creates; want 2 (one answer lost, one retry)", posts)
	}
	c := config(t, s)
	c.App, c.Org = "sandgate-other", ""
	if _, err := flymachines.New(t.Context(), c, providers.Env{GuestBinary: guesttest.Binary(t), BrokerID: "b"}); err == nil || !strings.Contains(err.Error(), flymachines.EnvOrg) {
		t.Errorf("New without an org for a missing app = %v; want an error naming %s", err, flymachines.EnvOrg)
	}
}

// TestWaitDeadlineAnswers: Create waits through wait's 408 and through a
// 400 that says the deadline passed.
func TestWaitDeadlineAnswers(t *testing.T) {
	t.Parallel() // mostly waiting on the clock: beside the others
	for _, wait400 := range []bool{false, true} {
		// The start outlasts the create's answer, which carries the agent
		// (megabytes of JSON) and may be slow on a loaded host.
		s := startFake(t, flytest.Options{StartDelay: 10 * time.Second, MaxWait: 200 * time.Millisecond, Wait400: wait400})
		p := newProvider(t, config(t, s), "broker-wait")
		sb := providertest.Create(t, p, providertest.Spec(t))
		if res := providertest.Exec(t, p, sb, "echo", "up"); string(res.Stdout) != "up\n" {
			t.Errorf("wait400=%v: exec after start = %q", wait400, res.Stdout)
		}
		var deadlines int
		for _, r := range s.Requests() {
			if strings.HasSuffix(r.Path, "/wait") && (r.Status == 408 || r.Status == 400) {
				deadlines++
			}
			if strings.HasSuffix(r.Path, "/wait") && !strings.Contains(r.Query, "timeout=") {
				t.Errorf("wait without a timeout: %s", r.Query)
			}
		}
		if deadlines == 0 {
			t.Errorf("wait400=%v: no deadline answer was met; the test shows nothing", wait400)
		}
	}
}

// TestLongExecThroughRunner: an exec longer than one vendor exec may last
// runs as a durable command and is polled, instead of failing with 408.
func TestLongExecThroughRunner(t *testing.T) {
	t.Parallel() // mostly waiting on the clock: beside the others
	// The vendor's deadline and the direct execs' timeouts leave seconds
	// for an exec through the fake on a loaded machine; the long exec
	// outlasts both.
	s := startFake(t, flytest.Options{ExecDeadline: 10 * time.Second})
	c := config(t, s)
	c.DirectExecMax = 8 * time.Second
	p := newProvider(t, c, "broker-long")
	sb := providertest.Create(t, p, providertest.Spec(t))
	res, err := p.Exec(t.Context(), sb, providers.ExecSpec{
		Argv: []string{"sh", "-c", "sleep 12; printf 'done\\377'; exit 5"}, Timeout: time.Minute, MaxOutputBytes: 100,
	})
	if err != nil || res.ExitCode != 5 || string(res.Stdout) != "done\xff" {
		t.Fatalf("long exec = %+v, %v; want exit 5, %q", res, err, "done\xff")
	}
	// Rate-limited execs are sent again; the command runs once.
	s.RateLimit("POST /v1/apps/{app}/machines/{id}/exec", 2)
	res, err = p.Exec(t.Context(), sb, providers.ExecSpec{Argv: []string{"sh", "-c", "echo x >>/tmp/once; cat /tmp/once"}, Timeout: c.DirectExecMax, MaxOutputBytes: 100})
	if err != nil || string(res.Stdout) != "x\n" {
		t.Errorf("exec after two 429s = %+v, %v; want it run once", res, err)
	}
	// A direct exec within the vendor's deadline still answers directly.
	res, err = p.Exec(t.Context(), sb, providers.ExecSpec{Argv: []string{"echo", "quick"}, Timeout: c.DirectExecMax, MaxOutputBytes: 100})
	if err != nil || string(res.Stdout) != "quick\n" {
		t.Errorf("short exec = %+v, %v", res, err)
	}
}

// TestListAndOrphans: List finds the broker's Machines by their metadata
// (paginated or not), never another broker's; a create whose answer was
// lost is found by its metadata and destroyed; an orphan found by List is
// terminated.
func TestListAndOrphans(t *testing.T) {
	s := startFake(t, flytest.Options{PageSize: 1})
	p := newProvider(t, config(t, s), "broker-a")
	other := newProvider(t, config(t, s), "broker-b")
	a1 := providertest.Create(t, p, providertest.Spec(t))
	a2 := providertest.Create(t, p, providertest.Spec(t))
	providertest.Create(t, other, providertest.Spec(t))
	refs := providertest.ListRefs(t, p, "broker-a")
	slices.Sort(refs)
	want := []string{a1.Ref, a2.Ref}
	slices.Sort(want)
	if !slices.Equal(refs, want) {
		t.Errorf("List = %v; want %v", refs, want)
	}
	var filtered bool
	for _, r := range s.Requests() {
		if r.Method == "GET" && strings.HasSuffix(r.Path, "/machines") && strings.Contains(r.Query, "metadata.sandgate-broker=broker-a") {
			filtered = true
		}
	}
	if !filtered {
		t.Errorf("List did not use the server-side metadata filter")
	}

	// Every config carries the agent, megabytes that Fly echoes in each
	// Machine of a full list: List asks for summaries and reads each
	// Machine's labels from its metadata, once for a workspace's.
	sbs, err := p.List(t.Context())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, sb := range sbs {
		if want := map[string]string{a1.Ref: a1.Labels[providers.LabelWorkspace], a2.Ref: a2.Labels[providers.LabelWorkspace]}[sb.Ref]; want == "" || sb.Labels[providers.LabelWorkspace] != want || sb.Labels[providers.LabelBroker] != "broker-a" {
			t.Errorf("List: %s labelled %v; want workspace %q of broker-a", sb.Ref, sb.Labels, want)
		}
	}
	var createBytes, listBytes int64
	metadataReads := map[string]int{}
	for _, r := range s.Requests() {
		switch {
		case r.Method == "POST" && strings.HasSuffix(r.Path, "/machines"):
			createBytes = max(createBytes, r.BodyBytes)
		case r.Method == "GET" && strings.HasSuffix(r.Path, "/machines"):
			listBytes = max(listBytes, r.AnswerBytes)
			if !strings.Contains(r.Query, "summary=true") {
				t.Errorf("a list without summary=true: %s", r.Query)
			}
		case r.Method == "GET" && strings.HasSuffix(r.Path, "/metadata"):
			metadataReads[path.Base(path.Dir(r.Path))]++
		}
	}
	if createBytes < 1<<20 || listBytes > 16<<10 {
		t.Errorf("largest create body %d bytes, largest list answer %d; want the agent's megabytes in the create and none in a list", createBytes, listBytes)
	}
	for _, sb := range []providers.Sandbox{a1, a2} {
		if n := metadataReads[sb.Ref]; n != 1 {
			t.Errorf("metadata of %s read %d times in two lists; want once", sb.Ref, n)
		}
	}

	// An orphan: a Machine the broker has no record of is swept by id.
	if err := p.Terminate(t.Context(), a2); err != nil {
		t.Fatalf("Terminate: %v", err)
	}
	if m, _ := s.Machine(a2.Ref); m.State != "destroyed" {
		t.Errorf("swept orphan is %s; want destroyed", m.State)
	}

	// A create whose answer is lost leaves no Machine behind.
	s.LoseAnswers("POST /v1/apps/{app}/machines", 1)
	spec := providertest.Spec(t)
	if _, err := p.Create(t.Context(), spec); err == nil {
		t.Fatalf("Create with its answer lost succeeded")
	}
	for _, m := range s.Machines() {
		if m.Config.Metadata[providers.LabelWorkspace] == spec.WorkspaceID && m.State != "destroyed" {
			t.Errorf("the unconfirmed create's machine is %s; want destroyed", m.State)
		}
	}
}

func TestAuthAndErrors(t *testing.T) {
	s := startFake(t, flytest.Options{})
	c := config(t, s)
	c.Token = "fm2_wrong-secret-token"
	_, err := flymachines.New(t.Context(), c, providers.Env{GuestBinary: guesttest.Binary(t), BrokerID: "b"})
	var ae *flymachines.APIError
	if !errors.As(err, &ae) || ae.StatusCode != 401 {
		t.Fatalf("New with a wrong token = %v; want a 401 APIError", err)
	}
	if strings.Contains(err.Error(), "wrong-secret-token") {
		t.Errorf("error %q carries the token", err)
	}
	// The token as `fly tokens create` prints it works too.
	c.Token = sandgate.Secret("FlyV1 " + testToken)
	newProvider(t, c, "b")
}

func TestOpenFromEnvironment(t *testing.T) {
	s := startFake(t, flytest.Options{})
	env := map[string]string{
		flymachines.EnvToken: testToken, flymachines.EnvBaseURL: s.URL(),
		flymachines.EnvApp: "sandgate-open", flymachines.EnvOrg: "personal",
	}
	t.Setenv("SSL_CERT_FILE", s.CAFile()) // read once per process: only if nothing read the roots before
	for _, missing := range []string{flymachines.EnvToken, flymachines.EnvApp} {
		e := maps(env)
		delete(e, missing)
		_, err := flymachines.Open(t.Context(), "fly-machines", yaml.Node{}, providers.Env{GuestBinary: guesttest.Binary(t), BrokerID: "b", DataDir: t.TempDir(), Getenv: func(k string) string { return e[k] }})
		if err == nil || !strings.Contains(err.Error(), missing) {
			t.Errorf("Open without %s = %v; want an error naming it", missing, err)
		}
	}
	if _, err := os.Stat(s.CAFile()); err != nil {
		t.Errorf("CA file: %v", err)
	}
}

func maps(m map[string]string) map[string]string { return stdmaps.Clone(m) }

// TestFakeExecAnswersJSONStrings shows why the provider base64-encodes in
// the guest: like Fly, the fake answers exec output as JSON strings, in
// which a byte that is not UTF-8 does not survive.
func TestFakeExecAnswersJSONStrings(t *testing.T) {
	s := startFake(t, flytest.Options{})
	p := newProvider(t, config(t, s), "broker-json")
	sb := providertest.Create(t, p, providertest.Spec(t))
	body := strings.NewReader(`{"command":["printf","\\377ok"],"timeout":10}`)
	req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/apps/sandgate-test/machines/"+sb.Ref+"/exec", body)
	req.Header.Set("Authorization", "FlyV1 "+testToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: s.Transport()}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Stdout   string `json:"stdout"`
		ExitCode int    `json:"exit_code"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("raw exec: HTTP %d, %v", resp.StatusCode, err)
	}
	if out.Stdout != "\ufffdok" || out.ExitCode != 0 {
		t.Errorf("raw exec stdout = %q, exit %d; want %q, 0 (the byte 0xff lost)", out.Stdout, out.ExitCode, "\ufffdok")
	}
	if res := providertest.Exec(t, p, sb, "printf", `\377ok`); string(res.Stdout) != "\xffok" {
		t.Errorf("the provider's exec stdout = %q; want %q", res.Stdout, "\xffok")
	}
}

// TestExecOctetStream: an exec answered as raw output (the OpenAPI's
// other content type, without an exit status) still gives the whole
// result, since the guest wrapper's own answer carries it.
func TestExecOctetStream(t *testing.T) {
	s := startFake(t, flytest.Options{ExecOctetStream: true})
	p := newProvider(t, config(t, s), "broker-raw")
	sb := providertest.Create(t, p, providertest.Spec(t))
	res := providertest.ExecWith(t, p, sb, providers.ExecSpec{Argv: []string{"sh", "-c", `printf '\000\377'; printf e >&2; exit 4`}})
	if res.ExitCode != 4 || string(res.Stdout) != "\x00\xff" || string(res.Stderr) != "e" {
		t.Errorf("exec over octet-stream = %+v; want exit 4, %q, %q", res, "\x00\xff", "e")
	}
}

// TestStagedStdinFails: a large stdin is staged in pieces before the
// command runs; when a piece fails in the guest, the exec fails, also when
// the vendor answers as raw output with no exit status. Before, over
// octet-stream the failed piece went unnoticed, and the command ran on
// the part of its stdin that was staged.
func TestStagedStdinFails(t *testing.T) {
	for _, octet := range []bool{false, true} {
		s := startFake(t, flytest.Options{ExecOctetStream: octet})
		p := newProvider(t, config(t, s), "broker-stage")
		sb := providertest.Create(t, p, providertest.Spec(t))
		s.FailCommands(1, 91) // the first piece's
		stdin := bytes.Repeat([]byte("x"), 768<<10+128<<10)
		res, err := p.Exec(t.Context(), sb, providers.ExecSpec{Argv: []string{"wc", "-c"}, Stdin: stdin, Timeout: 20 * time.Second})
		if err == nil {
			t.Errorf("octet-stream %v: exec whose first stdin piece failed = exit %d, stdout %q; want an error", octet, res.ExitCode, res.Stdout)
		}
		res = providertest.ExecWith(t, p, sb, providers.ExecSpec{Argv: []string{"wc", "-c"}, Stdin: stdin, Timeout: 20 * time.Second})
		if got := strings.TrimSpace(string(res.Stdout)); got != strconv.Itoa(len(stdin)) {
			t.Errorf("octet-stream %v: wc -c of the whole stdin staged = %q; want %d", octet, got, len(stdin))
		}
	}
}

// rawExec runs argv in the Machine through the fake's exec route,
// bypassing the provider: as the guest's root, outside every jail, with
// the Machine's environment, where the broker's own scripts run.
func rawExec(t *testing.T, s *flytest.Server, id string, argv ...string) string {
	t.Helper()
	b, _ := json.Marshal(flymachines.ExecRequest{Command: argv, Timeout: 30})
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL()+"/v1/apps/sandgate-test/machines/"+id+"/exec", bytes.NewReader(b))
	req.Header.Set("Authorization", "FlyV1 "+testToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: s.Transport()}).Do(req)
	if err != nil {
		t.Fatalf("raw exec: %v", err)
	}
	defer resp.Body.Close()
	var er flymachines.ExecResponse
	if err := json.NewDecoder(resp.Body).Decode(&er); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("raw exec: status %d, %v", resp.StatusCode, err)
	}
	return er.Stdout
}

// TestTenantCannotReachTheBrokersScripts: a client's env puts a directory
// the tenant writes first in PATH, and the tenant, root in its jail,
// plants tools there and overwrites the ones the broker's outside scripts
// call (head, base64, sh, timeout, env, rm), each leaving a marker in the
// guest's own root. Then file operations, a snapshot and more execs
// (direct and durable) run: all work, and no marker appears outside the
// jail's view. (File operations and snapshots run their scripts in a
// jail, with the tenant's own tools: they run before the tenant breaks
// its own head and base64.)
func TestTenantCannotReachTheBrokersScripts(t *testing.T) {
	s := startFake(t, flytest.Options{ExecDeadline: 3 * time.Second})
	c := config(t, s)
	c.DirectExecMax = 2 * time.Second
	p := newProvider(t, c, "broker-poison")
	spec := providertest.Spec(t)
	spec.Env = map[string]string{"PATH": "/tmp/p:/usr/local/bin:/usr/bin:/bin"}
	sb := providertest.Create(t, p, spec)
	exec := func(argv []string, timeout time.Duration) providers.ExecResult {
		t.Helper()
		res, err := p.Exec(t.Context(), sb, providers.ExecSpec{Argv: argv, Timeout: timeout, MaxOutputBytes: 1 << 10})
		if err != nil {
			t.Fatalf("exec %q: %v", argv, err)
		}
		return res
	}
	poison := func(paths string) {
		t.Helper()
		script := `trap='#!/bin/sh
touch /.sandgate-pwned-$(basename "$0")
'
for p in ` + paths + `; do
	mkdir -p "${p%/*}" && printf '%s' "$trap" > "$p" && chmod 755 "$p" || exit 1
done
echo poisoned`
		if res := exec([]string{"/bin/sh", "-c", script}, time.Second); res.ExitCode != 0 || string(res.Stdout) != "poisoned\n" {
			t.Fatalf("poison = %+v", res)
		}
	}
	poison("/tmp/p/head /tmp/p/sh /tmp/p/base64 /tmp/p/timeout /tmp/p/env /tmp/p/rm /usr/bin/timeout /usr/local/bin/sudo")
	if err := p.WriteFile(t.Context(), sb, "/workspace/f", strings.NewReader("content")); err != nil {
		t.Errorf("WriteFile after the poison: %v", err)
	}
	var got bytes.Buffer
	if _, err := p.ReadFile(t.Context(), sb, "/workspace/f", 1<<10, &got); err != nil || got.String() != "content" {
		t.Errorf("ReadFile after the poison = %q, %v", got.String(), err)
	}
	if _, err := p.Snapshot(t.Context(), sb, providers.SnapshotSpec{ID: "snap-poison", InstanceID: spec.InstanceID, Dir: "/workspace"}); err != nil {
		t.Errorf("Snapshot after the poison: %v", err)
	}
	poison("/usr/bin/head /usr/bin/base64 /usr/local/bin/sh /usr/local/bin/env /usr/local/bin/rm /usr/local/bin/mkfifo")
	if res := exec([]string{"/bin/echo", "direct"}, time.Second); string(res.Stdout) != "direct\n" {
		t.Errorf("direct exec after the poison = %+v", res)
	}
	if res := exec([]string{"/bin/sh", "-c", "/bin/sleep 3; /bin/echo durable"}, 20*time.Second); string(res.Stdout) != "durable\n" {
		t.Errorf("durable exec after the poison = %+v", res)
	}
	// The guest's own root, as the vendor's exec (and the broker's
	// scripts) see it.
	if out := rawExec(t, s, sb.Ref, "/bin/sh", "-c", "ls -a / | grep sandgate-pwned; test -e /tmp/p && echo tmp-p; true"); out != "" {
		t.Errorf("outside the jail: %q; want no marker and no /tmp/p", out)
	}
}
