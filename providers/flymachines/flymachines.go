// Package flymachines runs workspaces as Fly Machines over the Machines
// REST API, with a small client written from the vendor's fact sheet. Fly
// has no lifetime field, no domain egress control and no filesystem
// snapshots: the provider delivers the broker's agent (sandgate-guest)
// into every Machine as config.files; the agent's keeper is the Machine's
// main process and ends it at expires_at (auto_destroy, restart "no"),
// every command runs in the agent's jail, whose only way out is the
// keeper's forwarder to the broker's egress proxy, an app-wide network
// policy narrows egress to the proxy's port as a second layer, and
// snapshots go through exec into the broker's blob store. README.md's
// "Fly Machines" section says what is enforced where.
package flymachines

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/internal/tick"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/blobstore"
	"github.com/sandgate/sandgate/providers/execfile"
	"github.com/sandgate/sandgate/providers/execsnap"
	"github.com/sandgate/sandgate/providers/internal/uuid"
	"github.com/sandgate/sandgate/providers/runner"
)

// The vendor's environment variables and the broker's own for Fly.
const (
	EnvToken   = "FLY_API_TOKEN"
	EnvBaseURL = "FLY_FLAPS_BASE_URL"
	EnvApp     = "SANDGATE_FLY_APP"
	EnvOrg     = "SANDGATE_FLY_ORG"
	EnvRegion  = "SANDGATE_FLY_REGION"
)

// DefaultImage is the image of a workspace whose scope names none. Every
// image must have a POSIX sh, GNU coreutils (base64, head, timeout…),
// setsid, tar and gzip: exec, files, commands and snapshots run through them.
const DefaultImage = "docker.io/library/ubuntu:24.04"

// PolicyName is the app-wide network policy that denies all egress;
// ProxyPolicyName the one that allows only the egress proxy's port.
const (
	PolicyName      = "sandgate-deny-egress"
	ProxyPolicyName = "sandgate-egress-proxy"
)

// Settings is the kind-specific block of a `kind: fly-machines` provider.
// A zero field means the default noted beside it; the token is only ever
// named by environment variable.
type Settings struct {
	App          string        `yaml:"app"`           // "" means $SANDGATE_FLY_APP; required
	Org          string        `yaml:"org"`           // "" means $SANDGATE_FLY_ORG; needed to create the app
	Region       string        `yaml:"region"`        // "" means $SANDGATE_FLY_REGION, else Fly's default
	DefaultImage string        `yaml:"default_image"` // "" means DefaultImage
	TokenEnv     string        `yaml:"token_env"`     // "" means FLY_API_TOKEN
	Timeout      time.Duration `yaml:"timeout"`       // 0 means 30s per vendor call
	// Pool keeps Machines created but never started, per size and image,
	// for creates to start (pool.go); the zero value keeps none.
	Pool providers.PoolConfig `yaml:"pool"`
}

// Config configures New. A zero field means the default noted beside it.
type Config struct {
	BaseURL      string          // "" means DefaultBaseURL
	Token        sandgate.Secret // required
	App          string          // required
	Org          string          // required only when the app does not exist yet
	Region       string          // "" means Fly's default (near the caller)
	DefaultImage string          // "" means DefaultImage
	// Timeout bounds one vendor call other than exec and wait; 0 means 30s.
	Timeout time.Duration
	// DirectExecMax is the longest exec timeout run as one vendor exec;
	// longer ones go through package runner. 0 means 30s, the length past
	// which third parties report exec answering 408 (sheet §1.5).
	DirectExecMax time.Duration
	// StartTimeout bounds the wait for a new Machine to start; 0 means 5m.
	StartTimeout time.Duration
	// Pool keeps warm Machines (pool.go); the zero value keeps none.
	Pool providers.PoolConfig
	// BlobDir holds the snapshot blobs; "" means DATA_DIR/blobs.
	BlobDir string
	// Transport carries the requests; nil means a clone of
	// http.DefaultTransport, which trusts the system roots (and
	// SSL_CERT_FILE).
	Transport http.RoundTripper
}

// setDefaults fills the zero fields.
func (c *Config) setDefaults(env providers.Env) {
	c.BaseURL = strings.TrimRight(cmp.Or(c.BaseURL, DefaultBaseURL), "/")
	c.DefaultImage = cmp.Or(c.DefaultImage, DefaultImage)
	c.Timeout = cmp.Or(c.Timeout, 30*time.Second)
	c.DirectExecMax = cmp.Or(c.DirectExecMax, 30*time.Second)
	c.StartTimeout = cmp.Or(c.StartTimeout, 5*time.Minute)
	if c.BlobDir == "" && env.DataDir != "" {
		c.BlobDir = filepath.Join(env.DataDir, "blobs")
	}
	if c.Transport == nil {
		// A transport of its own: Close may then drop its idle
		// connections without touching anyone else's.
		c.Transport = http.DefaultTransport.(*http.Transport).Clone()
	}
}

// Validate checks a Config with its defaults filled.
func (c *Config) Validate() error {
	switch {
	case c.Token == "":
		return errors.New("flymachines: no API token")
	case c.App == "":
		return errors.New("flymachines: no app")
	case c.BlobDir == "":
		return errors.New("flymachines: no data directory for the snapshot blobs")
	}
	if err := c.Pool.Validate(); err != nil {
		return fmt.Errorf("flymachines: %w", err)
	}
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return errors.New("flymachines: the base URL must be an http(s) URL")
	}
	return nil
}

// Open opens a fly-machines provider from its settings and the vendor's
// environment variables. A missing token or app is an error naming the
// variable.
func Open(ctx context.Context, name string, raw yaml.Node, env providers.Env) (providers.Provider, error) {
	return providers.OpenSettings(ctx, raw, env, func(ctx context.Context, s Settings, getenv func(string) string) (*Provider, error) {
		tokenEnv := cmp.Or(s.TokenEnv, EnvToken)
		c := Config{
			BaseURL:      getenv(EnvBaseURL),
			Token:        sandgate.Secret(getenv(tokenEnv)),
			App:          cmp.Or(s.App, getenv(EnvApp)),
			Org:          cmp.Or(s.Org, getenv(EnvOrg)),
			Region:       cmp.Or(s.Region, getenv(EnvRegion)),
			DefaultImage: s.DefaultImage,
			Timeout:      s.Timeout,
			Pool:         s.Pool,
		}
		if c.Token == "" {
			return nil, fmt.Errorf("flymachines: %s is not set", tokenEnv)
		}
		if c.App == "" {
			return nil, fmt.Errorf("flymachines: %s is not set (or settings.app)", EnvApp)
		}
		return New(ctx, c, env)
	})
}

// Provider runs workspaces as Fly Machines of one app. Safe for concurrent use.
type Provider struct {
	cfg      Config
	agent    []byte                  // the sandgate-guest binary delivered into every Machine
	vendor   *providers.VendorEgress // nil: no egress proxy for guests, [] only
	jails    jailCache
	c        *client
	log      *slog.Logger
	clock    sandgate.Clock
	brokerID string
	runner   *runner.Runner
	snap     *execsnap.Snapshotter
	http     *http.Client
	pool     *pool // nil: no warm Machines (pool.go)
	mdCache  labelCache
}

// New returns a provider over the app c.App: it creates the app in c.Org
// when it is missing and makes sure the deny-all egress policy exists,
// before any Machine is created.
func New(ctx context.Context, c Config, env providers.Env) (*Provider, error) {
	c.setDefaults(env)
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if env.BrokerID == "" {
		return nil, errors.New("flymachines: no broker id")
	}
	store, err := blobstore.NewDir(c.BlobDir)
	if err != nil {
		return nil, fmt.Errorf("flymachines: %w", err)
	}
	agent, err := providers.ReadGuestBinary(env.GuestBinary)
	if err != nil {
		return nil, fmt.Errorf("flymachines: %w", err)
	}
	p := &Provider{cfg: c, agent: agent, vendor: env.VendorEgress, log: env.Logger, clock: env.Clock, brokerID: env.BrokerID}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.clock == nil {
		p.clock = sandgate.SystemClock{}
	}
	p.http = &http.Client{Transport: c.Transport}
	p.c = &client{base: c.BaseURL, auth: sandgate.Secret(authHeader(c.Token.Reveal())), http: p.http, log: p.log, sleep: tick.Sleep}
	// The runner's scripts run outside the jail (their files are under the
	// agent's directory, which no jail sees); the commands they start, and
	// the file and snapshot scripts, run in one.
	p.runner = runner.New(directExecer{p: p}, providers.GuestCommandDir)
	p.snap = execsnap.New(directExecer{p: p, jail: true}, store, execsnap.Config{ChunkBytes: snapChunk, OpTimeout: c.DirectExecMax})
	if err := p.ensureApp(ctx); err != nil {
		p.http.CloseIdleConnections()
		return nil, err
	}
	if err := p.ensurePolicy(ctx); err != nil {
		p.http.CloseIdleConnections()
		return nil, err
	}
	p.startPool()
	return p, nil
}

// createTimeout is the least bound of a create call (Config.Timeout when
// longer): its body and answer hold the agent.
const createTimeout = 2 * time.Minute

// snapChunk is what one exec moves of a snapshot: well below any output
// or request size a vendor would allow, once base64 adds a third.
const snapChunk = 512 << 10

func (p *Provider) appPath() string { return "/apps/" + url.PathEscape(p.cfg.App) }

func (p *Provider) machinePath(id string) string {
	return p.appPath() + "/machines/" + url.PathEscape(id)
}

// callCtx bounds one vendor call by cfg.Timeout.
func (p *Provider) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, p.cfg.Timeout)
}

// ensureApp creates the app when GET answers 404. The create carries one
// idempotency key, reused on its retries; a 422 name_taken is answered by
// reading the app again, since it may be an earlier attempt of our own.
func (p *Provider) ensureApp(ctx context.Context) error {
	get := func() error {
		ctx, cancel := p.callCtx(ctx)
		defer cancel()
		return p.c.call(ctx, "get app", http.MethodGet, p.appPath(), nil, nil, nil)
	}
	err := get()
	if err == nil {
		return nil
	}
	if !statusIs(err, http.StatusNotFound) {
		return fmt.Errorf("flymachines: app: %w", err)
	}
	if p.cfg.Org == "" {
		return fmt.Errorf("flymachines: app does not exist and %s is not set to create it in", EnvOrg)
	}
	req := CreateAppRequest{Name: p.cfg.App, OrgSlug: p.cfg.Org, IdempotencyKey: uuid.New()}
	for attempt := range 4 {
		if attempt > 0 {
			if err := tick.Sleep(ctx, backoff(attempt)); err != nil {
				return fmt.Errorf("flymachines: create app: %w", err)
			}
		}
		cctx, cancel := p.callCtx(ctx)
		err = p.c.do(cctx, "create app", http.MethodPost, "/apps", nil, req, nil, maxBody)
		cancel()
		var ae *APIError
		switch {
		case err == nil:
			p.log.Info("fly app created", "org_slug", p.cfg.Org)
			return nil
		case statusIs(err, http.StatusUnprocessableEntity) && errors.As(err, &ae) &&
			(ae.Status == "name_taken" || strings.Contains(strings.ToLower(ae.Message), "already been taken")):
			if gerr := get(); gerr == nil {
				return nil
			}
			return fmt.Errorf("flymachines: create app: the name is taken by an app this token cannot read: %w", err)
		case errors.As(err, &ae) && !retryable(err):
			return fmt.Errorf("flymachines: create app: %w", err)
		case ctx.Err() != nil:
			return fmt.Errorf("flymachines: create app: %w", err)
		}
		// A transport error or a retryable status: same request, same key.
	}
	return fmt.Errorf("flymachines: create app: %w", err)
}

// denyEgress is the deny-all policy. The first egress rule makes egress
// default-deny (sheet §1.11). The rule must allow something, and whether
// an empty port list means "no port" or "every port" is not documented:
// it allows TCP port 0 only, which no connection can use. A vendor that
// refuses port 0 refuses the policy, and then the provider does not open
// (fail closed), rather than risking the other reading of [].
func denyEgress() NetworkPolicy {
	return NetworkPolicy{
		Name:     PolicyName,
		Selector: PolicySelector{All: true},
		Rules: []PolicyRule{{Action: "allow", Direction: "egress",
			Ports: []PolicyPort{{Protocol: "tcp", Port: 0}}}},
	}
}

// proxyEgress is the policy of a provider whose guests reach the broker's
// egress proxy: egress to the proxy's TCP port only. It is a second layer:
// the jail, whose only way out is the forwarder, is what keeps a
// workspace to its allowlist.
func proxyEgress(port int) NetworkPolicy {
	return NetworkPolicy{
		Name:     ProxyPolicyName,
		Selector: PolicySelector{All: true},
		Rules: []PolicyRule{{Action: "allow", Direction: "egress",
			Ports: []PolicyPort{{Protocol: "tcp", Port: port}}}},
	}
}

// wantPolicy is the app's egress policy: the proxy's port when guests
// reach the proxy, else deny-all.
func (p *Provider) wantPolicy() NetworkPolicy {
	if p.vendor != nil {
		if _, port, err := net.SplitHostPort(p.vendor.Addr); err == nil {
			if n, err := strconv.Atoi(port); err == nil {
				return proxyEgress(n)
			}
		}
	}
	return denyEgress()
}

// ensurePolicy makes sure the app has its egress policy (wantPolicy).
// Policies take effect when a Machine starts, so this runs before any
// Create.
func (p *Provider) ensurePolicy(ctx context.Context) error {
	have, err := p.policies(ctx)
	if err != nil {
		return err
	}
	want := p.wantPolicy()
	for _, np := range have {
		if np.Name == want.Name && samePolicy(np, want) {
			return nil
		}
	}
	cctx, cancel := p.callCtx(ctx)
	defer cancel()
	if err := p.c.do(cctx, "create network policy", http.MethodPost, p.appPath()+"/network_policies", nil, want, nil, maxBody); err != nil {
		return fmt.Errorf("flymachines: egress policy: %w", err)
	}
	p.log.Info("fly network policy created", "policy", want.Name)
	return nil
}

// policies lists the app's network policies. The list's shape is not in
// the sheet: a bare array or an object holding one are both read.
func (p *Provider) policies(ctx context.Context) ([]NetworkPolicy, error) {
	cctx, cancel := p.callCtx(ctx)
	defer cancel()
	var raw rawAnswer
	if err := p.c.call(cctx, "list network policies", http.MethodGet, p.appPath()+"/network_policies/", nil, nil, &raw); err != nil {
		return nil, fmt.Errorf("flymachines: network policies: %w", err)
	}
	return decodePolicies(raw.body), nil
}

func samePolicy(a, b NetworkPolicy) bool {
	if a.Selector.All != b.Selector.All || len(a.Selector.Machines) > 0 || len(a.Selector.Metadata) > 0 || len(a.Rules) != len(b.Rules) {
		return false
	}
	for i := range a.Rules {
		ra, rb := a.Rules[i], b.Rules[i]
		if ra.Action != rb.Action || ra.Direction != rb.Direction || len(ra.Ports) != len(rb.Ports) {
			return false
		}
		for j := range ra.Ports {
			if ra.Ports[j] != rb.Ports[j] {
				return false
			}
		}
	}
	return true
}

// Labels of the Machine of spec: the broker's identifiers and nothing the
// client sent.
func (p *Provider) labels(spec providers.CreateSpec) map[string]string {
	return map[string]string{
		providers.LabelBroker:    p.brokerID,
		providers.LabelWorkspace: spec.WorkspaceID,
		providers.LabelInstance:  spec.InstanceID,
	}
}

// MachineConfig returns the config Create sends for spec at now, cred
// being the workspace's egress-proxy credential ("" for no egress). The
// agent, the credential and the proxy's CA are config.files under
// /.sandgate; the main process is the agent's keeper, which ends the
// Machine at expires_at (then Fly destroys it: auto_destroy, restart
// "no"), with or without a broker alive. Tests check it field by field.
func (p *Provider) MachineConfig(spec providers.CreateSpec, now time.Time, cred string) (MachineConfig, error) {
	if spec.ExpiresAt.IsZero() {
		return MachineConfig{}, errors.New("flymachines: create: no expires_at: the Machine's lifetime needs one")
	}
	left := spec.ExpiresAt.Sub(now)
	if left <= 0 {
		return MachineConfig{}, errors.New("flymachines: create: expires_at has passed")
	}
	g, err := guestFor(tierOf(spec.Size))
	if err != nil {
		return MachineConfig{}, err
	}
	envFile, err := jailEnvFile(spec.Env)
	if err != nil {
		return MachineConfig{}, err
	}
	files := []File{{GuestPath: providers.GuestAgent, RawValue: base64.StdEncoding.EncodeToString(p.agent), Mode: 0o700}, envFile}
	var ve *providers.VendorEgress
	if cred != "" {
		ve = p.vendor
		files = append(files, File{GuestPath: providers.GuestCredFile, RawValue: base64.StdEncoding.EncodeToString([]byte(cred + "\n")), Mode: 0o600})
		if len(ve.CA) > 0 {
			files = append(files, File{GuestPath: providers.GuestCAFile, RawValue: base64.StdEncoding.EncodeToString(ve.CA), Mode: 0o600})
		}
	}
	return MachineConfig{
		Image: cmp.Or(spec.Image, p.cfg.DefaultImage),
		Guest: &g,
		Init:  &Init{Exec: providers.GuestKeeperArgv(spec.ExpiresAt, ve, spec.WorkspaceID, false)},
		// No env: Fly gives config.env to every process of the guest,
		// the broker's own root scripts too. The workspace's env is a
		// file only the jails read (jailEnvFile).
		Files:       files,
		Metadata:    p.labels(spec),
		AutoDestroy: true,
		Restart:     &Restart{Policy: "no"},
	}, nil
}

// Create creates the workspace's Machine and waits until it has started.
// A workspace with domains to reach is registered with the broker's
// egress proxy first (refused when guests cannot reach it) and
// unregistered again when the create fails. A Machine whose start fails or
// cannot be confirmed is destroyed again.
func (p *Provider) Create(ctx context.Context, spec providers.CreateSpec) (_ providers.Sandbox, err error) {
	cred, unregister, err := providers.RegisterVendorEgress(p.vendor, spec)
	if err != nil {
		return providers.Sandbox{}, fmt.Errorf("flymachines: create: %w", err)
	}
	defer func() {
		if err != nil {
			unregister()
		}
	}()
	now := p.clock.Now()
	if p.pool != nil {
		bind, err := p.bindArgs(spec, now, cred)
		if err != nil {
			return providers.Sandbox{}, err
		}
		if m, ok := p.takePooled(ctx, spec); ok {
			g, _ := guestFor(tierOf(spec.Size))
			sb := p.created(spec, m, g, cred, bind)
			p.settleTake(sb, m.InstanceID)
			return sb, nil
		}
	}
	cfg, err := p.MachineConfig(spec, now, cred)
	if err != nil {
		return providers.Sandbox{}, err
	}
	req := CreateMachineRequest{Config: cfg, Region: p.cfg.Region, SkipServiceRegistration: true}
	var m Machine
	// The request and its answer carry the agent (config.files, some
	// megabytes each way): more than an ordinary call's bound.
	cctx, cancel := context.WithTimeout(ctx, max(p.cfg.Timeout, createTimeout))
	err = p.c.do(cctx, "create machine", http.MethodPost, p.appPath()+"/machines", nil, req, &m, maxBody)
	cancel()
	if err != nil {
		var ae *APIError
		if !errors.As(err, &ae) || ae.StatusCode >= 500 || ae.StatusCode == http.StatusRequestTimeout {
			// The create may have happened: find it by its metadata and
			// destroy it, never create again blindly.
			p.destroyByWorkspace(context.WithoutCancel(ctx), spec.WorkspaceID)
		}
		return providers.Sandbox{}, fmt.Errorf("flymachines: create: %w", err)
	}
	if m.ID == "" {
		return providers.Sandbox{}, errors.New("flymachines: create: the answer has no machine id")
	}
	if err := p.waitStarted(ctx, m); err != nil {
		p.destroy(context.WithoutCancel(ctx), m.ID)
		return providers.Sandbox{}, fmt.Errorf("flymachines: create: %w", err)
	}
	return p.created(spec, m, *cfg.Guest, cred, nil), nil
}

// created is the sandbox of spec's Machine m, started with guest g; bind
// is the bind a taken pooled Machine still needs (pool.go).
func (p *Provider) created(spec providers.CreateSpec, m Machine, g Guest, cred string, bind []string) providers.Sandbox {
	sb := providers.Sandbox{Ref: m.ID, Labels: p.labels(spec), StartedAt: p.clock.Now()}
	p.jails.put(m.ID, jailOf{env: maps.Clone(spec.Env), egress: cred != "", bind: bind})
	p.log.Info("sandbox created", sandgate.WorkspaceAttr(spec.WorkspaceID), sandgate.InstanceAttr(spec.InstanceID),
		"fly_cpus", g.CPUs, "fly_memory_mb", g.MemoryMB, "env_count", len(spec.Env), "pooled", bind != nil)
	return sb
}

// goneStates are the states of a Machine that will never run a command
// again: the broker never stops one, so a stopped Machine has ended (its
// lifetime, or a stop from outside) and auto_destroy removes it.
var goneStates = map[string]bool{
	"destroyed": true, "destroying": true, "stopped": true, "stopping": true, "failed": true,
	"launch_failed": true, "replaced": true, "migrated": true, "suspended": true, "suspending": true,
}

// waitStarted waits until m has started, looping on the wait endpoint's
// deadline answers (408, or a 400 that says the deadline passed) and
// re-reading the Machine between rounds, for at most cfg.StartTimeout.
func (p *Provider) waitStarted(ctx context.Context, m Machine) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	if m.State == "started" {
		return nil
	}
	for {
		left := time.Until(deadlineOf(ctx))
		secs := min(max(int(left/time.Second), 1), 60)
		q := url.Values{"state": {"started"}, "timeout": {strconv.Itoa(secs)}}
		if m.InstanceID != "" {
			q.Set("version", m.InstanceID)
		}
		var w WaitResponse
		wctx, wcancel := context.WithTimeout(ctx, time.Duration(secs+15)*time.Second)
		err := p.c.do(wctx, "wait machine", http.MethodGet, p.machinePath(m.ID)+"/wait", q, nil, &w, maxBody)
		wcancel()
		switch {
		case err == nil && (w.State == "" || w.State == "started"):
			return nil
		case err == nil:
			return fmt.Errorf("machine is %s, not started", w.State)
		case ctx.Err() != nil:
			return fmt.Errorf("wait for start: %w", context.Cause(ctx))
		case !waitDeadline(err) && !retryable(err):
			var ae *APIError
			if errors.As(err, &ae) {
				return fmt.Errorf("wait for start: %w", err)
			}
			// A transport error: read the Machine and wait again.
		}
		cur, gerr := p.get(ctx, m.ID)
		switch {
		case statusIs(gerr, http.StatusNotFound):
			return errors.New("machine gone before it started")
		case gerr == nil && cur.State == "started":
			return nil
		case gerr == nil && goneStates[cur.State]:
			return fmt.Errorf("machine is %s, not started", cur.State)
		case gerr == nil && cur.InstanceID != "":
			m.InstanceID = cur.InstanceID
		}
		if err := tick.Sleep(ctx, 200*time.Millisecond); err != nil {
			return fmt.Errorf("wait for start: %w", err)
		}
	}
}

func deadlineOf(ctx context.Context) time.Time {
	d, ok := ctx.Deadline()
	if !ok {
		return time.Now().Add(time.Minute)
	}
	return d
}

// waitDeadline reports whether err is the wait endpoint running out of
// time: a 408, or a 400 whose body says the deadline passed (the exact
// 400 text is not documented; sheet §1.6). A 400 that names an argument
// problem ("invalid_argument", "timeout must be …") is not, even when it
// speaks of the timeout: waiting again would only repeat it.
func waitDeadline(err error) bool {
	var ae *APIError
	if !errors.As(err, &ae) {
		return false
	}
	if ae.StatusCode == http.StatusRequestTimeout {
		return true
	}
	if ae.StatusCode != http.StatusBadRequest {
		return false
	}
	s := strings.ToLower(ae.Status + " " + ae.Message)
	if strings.Contains(s, "invalid") || strings.Contains(s, "must be") {
		return false
	}
	return strings.Contains(s, "deadline") || strings.Contains(s, "timeout") || strings.Contains(s, "timed out")
}

// get reads one Machine.
func (p *Provider) get(ctx context.Context, id string) (Machine, error) {
	cctx, cancel := p.callCtx(ctx)
	defer cancel()
	var m Machine
	err := p.c.call(cctx, "get machine", http.MethodGet, p.machinePath(id), nil, nil, &m)
	return m, err
}

// destroy force-destroys a Machine; gone already is success. fly-go sends
// kill=true where the docs and the OpenAPI say force=true (sheet §1.3,
// UNCERTAIN): both are sent.
func (p *Provider) destroy(ctx context.Context, id string) error {
	cctx, cancel := p.callCtx(ctx)
	defer cancel()
	q := url.Values{"force": {"true"}, "kill": {"true"}}
	err := p.c.do(cctx, "destroy machine", http.MethodDelete, p.machinePath(id), q, nil, nil, maxBody)
	if err == nil || statusIs(err, http.StatusNotFound) {
		return nil
	}
	// Some other refusal of a Machine that is already going away.
	if m, gerr := p.get(ctx, id); statusIs(gerr, http.StatusNotFound) || (gerr == nil && (m.State == "destroyed" || m.State == "destroying")) {
		return nil
	}
	return err
}

// destroyByWorkspace destroys every Machine of the broker labelled with
// the workspace id: the cleanup of a create whose answer was lost.
func (p *Provider) destroyByWorkspace(ctx context.Context, wsID string) {
	ms, err := p.list(ctx, url.Values{"metadata." + providers.LabelWorkspace: {wsID}})
	if err != nil {
		p.log.Error("unconfirmed create not looked up", sandgate.WorkspaceAttr(wsID), sandgate.KeyError, err)
		return
	}
	for _, m := range ms {
		if err := p.destroy(ctx, m.ID); err != nil {
			p.log.Error("unconfirmed create not destroyed", sandgate.WorkspaceAttr(wsID), sandgate.KeyError, err)
		}
	}
}

// Terminate force-destroys the Machine, one already gone being success,
// and revokes the workspace's egress credential.
func (p *Provider) Terminate(ctx context.Context, sb providers.Sandbox) error {
	if sb.Ref == "" {
		return nil
	}
	if err := p.destroy(ctx, sb.Ref); err != nil {
		return fmt.Errorf("flymachines: terminate: %w", err)
	}
	if p.vendor != nil && sb.Labels[providers.LabelWorkspace] != "" {
		p.vendor.Proxy.Unregister(sb.Labels[providers.LabelWorkspace])
	}
	p.jails.drop(sb.Ref)
	p.mdCache.drop(sb.Ref)
	if p.pool != nil {
		p.pool.mu.Lock()
		delete(p.pool.taken, sb.Ref)
		p.pool.mu.Unlock()
	}
	p.log.Info("sandbox terminated", "fly_machine_id", sb.Ref)
	return nil
}

// List returns the broker's Machines that are not destroyed, found by the
// vendor's server-side metadata filter and checked again here.
func (p *Provider) List(ctx context.Context) ([]providers.Sandbox, error) {
	return p.ListBroker(ctx, p.brokerID)
}

// ListBroker implements providers.BrokerLister: the app's Machines that
// broker id labelled.
func (p *Provider) ListBroker(ctx context.Context, id string) ([]providers.Sandbox, error) {
	ms, err := p.listBroker(ctx, id, nil)
	if err != nil {
		return nil, fmt.Errorf("flymachines: list: %w", err)
	}
	out := make([]providers.Sandbox, 0, len(ms))
	for _, m := range ms {
		md := m.metadata()
		if p.ownPooled(md) {
			l, taken := p.takenLabels(m.ID)
			if !taken {
				continue // warm, not a workspace; a gone Provider's are orphans to reap
			}
			md = l // taken, its relabel in flight
		}
		sb := providers.Sandbox{Ref: m.ID, Labels: map[string]string{
			providers.LabelBroker:    md[providers.LabelBroker],
			providers.LabelWorkspace: md[providers.LabelWorkspace],
			providers.LabelInstance:  md[providers.LabelInstance],
		}}
		if t, err := time.Parse(time.RFC3339Nano, m.CreatedAt); err == nil {
			sb.StartedAt = t
		}
		out = append(out, sb)
	}
	return out, nil
}

// ReadFile reads a file in the Machine; see [execfile.ReadFile].
func (p *Provider) ReadFile(ctx context.Context, sb providers.Sandbox, path string, max int64, w io.Writer) (int64, error) {
	return execfile.ReadFile(ctx, directExecer{p: p, jail: true}, sb, path, max, w)
}

// WriteFile writes a file in the Machine; see [execfile.WriteFile].
func (p *Provider) WriteFile(ctx context.Context, sb providers.Sandbox, path string, r io.Reader) error {
	return execfile.WriteFile(ctx, directExecer{p: p, jail: true}, sb, path, r)
}

// Snapshot archives spec.Dir in the Machine and stores it in the blob
// store, in bounded chunks through exec; see [execsnap.Snapshotter].
func (p *Provider) Snapshot(ctx context.Context, sb providers.Sandbox, spec providers.SnapshotSpec) (providers.SnapshotRef, error) {
	return p.snap.Snapshot(ctx, sb, spec)
}

// Restore writes a stored snapshot into the Machine at dir.
func (p *Provider) Restore(ctx context.Context, sb providers.Sandbox, ref providers.SnapshotRef, dir string) error {
	return p.snap.Restore(ctx, sb, ref, dir)
}

// DeleteSnapshot deletes the snapshot's blob; one already gone is success.
func (p *Provider) DeleteSnapshot(ctx context.Context, ref providers.SnapshotRef) error {
	return p.snap.Delete(ctx, ref)
}

// Capabilities implements providers.Provider: domain allowlists through
// the broker's egress proxy when guests reach it (egress.vendor_listen),
// else [] only; a vendor-side lifetime (the agent's keeper, the main
// process, ends at expires_at and Fly destroys the Machine), the idle
// timeout by the broker's reaper, snapshots through the blob store,
// durable commands by package runner.
func (p *Provider) Capabilities() providers.Capabilities {
	return providers.Capabilities{
		Egress:         p.vendor.EgressMode(),
		VendorLifetime: true,
		VendorIdle:     false,
		Snapshots:      true,
		NativeCommands: true, // the provider implements Commander (package runner over exec)
		Sizes:          Sizes(),
		Images:         nil,
		DefaultImage:   p.cfg.DefaultImage,
	}
}

// Close releases idle connections. Machines keep running until their
// lifetime ends or the broker terminates them.
func (p *Provider) Close() error {
	p.closePool()
	p.http.CloseIdleConnections()
	return nil
}

func randRead(b []byte) { rand.Read(b) }

// Interface guards
var (
	_ providers.Provider     = (*Provider)(nil)
	_ providers.Commander    = (*Provider)(nil)
	_ providers.BrokerLister = (*Provider)(nil)
)
