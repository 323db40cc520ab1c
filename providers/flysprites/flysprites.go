// Package flysprites runs workspaces on Fly Sprites: one sprite per
// workspace, every command over the exec WebSocket in a fresh jail of the
// broker's agent (sandgate-guest, delivered through the fs API), whose
// only way out is the agent's forwarder to the broker's egress proxy; the
// vendor's domain policy (set and read back before the first command)
// allows only the proxy's host, as a second layer; files are read and
// written in a fresh jail too (the fs API, outside every jail, could follow
// a tenant's symlink into the agent's directory), snapshots go through the
// shared blob store, and the hard lifetime
// is enforced inside the sprite by the agent's keeper plus the broker's
// reaper. Every vendor fact comes from the fact sheet
// ../shared/reference/fly-sprites.md; README.md ("Fly Sprites") says what
// is enforced where.
package flysprites

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/blobstore"
	"github.com/sandgate/sandgate/providers/execsnap"
	"github.com/sandgate/sandgate/providers/runner"
)

// Environment variables, named as the vendor names them (sheet §1).
const (
	EnvToken  = "SPRITE_TOKEN"
	EnvAPIURL = "SPRITES_API_URL"
)

// DefaultBaseURL is Sprites' API.
const DefaultBaseURL = "https://api.sprites.dev"

// Image is the one image: Sprites has no image choice on create.
const Image = "sprite"

// jailFile is what every jail of a sprite gets (jailOf, JSON), in the
// agent's directory (root's, mode 0600): read by a broker process that
// did not create the sprite.
const jailFile = providers.GuestDir + "/jail.json"

// Settings is the kind-specific block of a `kind: fly-sprites` provider.
// It has no fields: the token and the URL come from SPRITE_TOKEN and
// SPRITES_API_URL, so an unknown key is an error.
type Settings struct{}

// Open opens a Fly Sprites provider: SPRITE_TOKEN is required,
// SPRITES_API_URL replaces the default base URL, the system TLS roots
// (SSL_CERT_FILE included) are used, and snapshots go to
// data_dir/blobs.
func Open(ctx context.Context, name string, raw yaml.Node, env providers.Env) (providers.Provider, error) {
	return providers.OpenSettings(ctx, raw, env, func(ctx context.Context, _ Settings, getenv func(string) string) (*Provider, error) {
		tok := getenv(EnvToken)
		if tok == "" {
			return nil, fmt.Errorf("flysprites: %s is not set", EnvToken)
		}
		if env.DataDir == "" {
			return nil, errors.New("flysprites: no data directory for the snapshot blobs")
		}
		store, err := blobstore.NewDir(filepath.Join(env.DataDir, "blobs"))
		if err != nil {
			return nil, err
		}
		return New(ctx, Config{Name: name, BaseURL: getenv(EnvAPIURL), Token: sandgate.Secret(tok), Blobs: store}, env)
	})
}

// Config configures a Provider. A zero field means the default noted beside it.
type Config struct {
	// Name is the provider's name in the broker's config; with the broker
	// id it makes the name prefix of its sprites. "" means "fly-sprites".
	Name string
	// BaseURL is the API; "" means DefaultBaseURL.
	BaseURL string
	// Token is required; it is sent only as the Bearer token.
	Token sandgate.Secret
	// Blobs stores the snapshots; required.
	Blobs blobstore.Store
	// Timeout bounds each REST call; 0 means 30s, as sprites-go.
	Timeout time.Duration
	// HTTPClient makes every call; nil means one with the system roots.
	HTTPClient *http.Client
}

// Provider runs workspaces on Fly Sprites. Its methods are safe for
// concurrent use; any number of broker processes may share the account.
type Provider struct {
	c        *client
	prefix   string // every sprite name of this broker and provider starts with it
	name     string // the provider's name, for another broker id's prefix (ListBroker)
	brokerID string
	log      *slog.Logger
	clock    sandgate.Clock
	snap     *execsnap.Snapshotter
	runner   *runner.Runner
	agent    []byte                  // the sandgate-guest binary delivered into every sprite
	vendor   *providers.VendorEgress // nil: no egress proxy for guests, [] only

	mu    sync.Mutex
	jails map[string]jailOf // sprite name → its jails' settings, as loaded
}

// jailOf is what every jail of a sprite gets: the workspace's env, and
// whether the keeper serves it egress.
type jailOf struct {
	Env    map[string]string `json:"env"`
	Egress bool              `json:"egress"`
}

// New returns a provider. It makes no call: the first Create or List
// shows whether the token works.
func New(_ context.Context, c Config, env providers.Env) (*Provider, error) {
	if c.Token == "" {
		return nil, fmt.Errorf("flysprites: %s is not set", EnvToken)
	}
	if c.Blobs == nil {
		return nil, errors.New("flysprites: no snapshot blob store")
	}
	base, err := url.Parse(cmp.Or(c.BaseURL, DefaultBaseURL))
	if err != nil || (base.Scheme != "https" && base.Scheme != "http") || base.Host == "" {
		return nil, fmt.Errorf("flysprites: %s must be an http(s) URL", EnvAPIURL)
	}
	agent, err := providers.ReadGuestBinary(env.GuestBinary)
	if err != nil {
		return nil, fmt.Errorf("flysprites: %w", err)
	}
	hc := c.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	p := &Provider{
		c: &client{base: base, token: c.Token, hc: hc, timeout: cmp.Or(c.Timeout, 30*time.Second),
			retries: 3, maxWait: time.Minute},
		prefix:   NamePrefix(env.BrokerID, cmp.Or(c.Name, "fly-sprites")),
		name:     cmp.Or(c.Name, "fly-sprites"),
		brokerID: env.BrokerID,
		log:      env.Logger,
		clock:    env.Clock,
		jails:    map[string]jailOf{},
		agent:    agent,
		vendor:   env.VendorEgress,
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.clock == nil {
		p.clock = sandgate.SystemClock{}
	}
	// Snapshots run in a jail without the workspace's env or egress; the
	// runner's scripts run as root outside every jail (their files are in
	// the agent's directory, which no jail sees) and start each command
	// in a jail of its own.
	p.snap = execsnap.New(jailExecer{p}, c.Blobs, execsnap.Config{})
	p.runner = runner.New(rootExecer{p}, providers.GuestCommandDir)
	return p, nil
}

// Capabilities implements providers.Provider. Egress is domain
// allowlists through the broker's egress proxy when guests reach it
// (egress.vendor_listen), else [] only: the vendor's policy filters DNS
// names and whether it blocks IP literals is not documented (sheet §8),
// so it is only a second layer. The lifetime is enforced inside the
// sprite by the agent's keeper, which no tenant process can see or
// signal, and by the reaper's delete, so it is not reported as the
// vendor's; idle is the reaper's. Snapshots go through the blob store,
// durable commands through package runner.
func (p *Provider) Capabilities() providers.Capabilities {
	return providers.Capabilities{
		Egress:         p.vendor.EgressMode(),
		Snapshots:      true,
		NativeCommands: true, // the provider implements Commander (package runner, each command in a jail)
		Sizes:          sandgate.StandardSizes,
		Images:         []string{Image},
		DefaultImage:   Image,
	}
}

// Close implements providers.Provider: sprites belong to the broker, not
// to the process, and keep running.
func (p *Provider) Close() error {
	if t, ok := p.c.hc.Transport.(interface{ CloseIdleConnections() }); ok {
		t.CloseIdleConnections()
	}
	return nil
}

// NamePrefix is the prefix of every sprite name of the provider called
// provider on the broker brokerID: "sg-", 8 hex digits of a hash of both,
// and "-". The list's only server-side filter is this prefix (sheet §4).
func NamePrefix(brokerID, provider string) string {
	sum := sha256.Sum256([]byte(brokerID + "\x00" + provider))
	return "sg-" + hex.EncodeToString(sum[:4]) + "-"
}

// spriteName is the broker-derived name of a workspace's sprite: the
// provider's prefix and the workspace id, lowercase with '-' for '_'.
func (p *Provider) spriteName(wsID string) (string, error) {
	if wsID == "" || len(wsID) > 40 {
		return "", errors.New("flysprites: create: workspace id is not a valid sprite name")
	}
	var b strings.Builder
	b.WriteString(p.prefix)
	for _, c := range []byte(wsID) {
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-':
			b.WriteByte(c)
		case 'A' <= c && c <= 'Z':
			b.WriteByte(c + 'a' - 'A')
		case c == '_':
			b.WriteByte('-')
		default:
			return "", errors.New("flysprites: create: workspace id is not a valid sprite name")
		}
	}
	return b.String(), nil
}

// labels are the broker's identifiers, as `key=value` strings: the
// vendor's labels are an array of strings with no structure of their own
// (sheet §4), so key=value is our convention. Nothing a client sent is
// ever one of them.
func (p *Provider) labels(spec providers.CreateSpec) []string {
	return []string{
		providers.LabelBroker + "=" + p.brokerID,
		providers.LabelWorkspace + "=" + spec.WorkspaceID,
		providers.LabelInstance + "=" + spec.InstanceID,
	}
}

func parseLabels(ls []string) map[string]string {
	m := map[string]string{}
	for _, l := range ls {
		if k, v, ok := strings.Cut(l, "="); ok {
			m[k] = v
		}
	}
	return m
}

// policyFor is the network policy of a sprite: with egress, the broker's
// proxy host allowed, then a final deny of everything (sheet §8: keep a
// final `*` deny rule); without, the deny rule alone. The jail is what
// keeps a workspace to its allowlist: this only narrows the guest.
func policyFor(ve *providers.VendorEgress, egress bool) networkPolicy {
	var rules []rule
	if egress {
		rules = append(rules, rule{Domain: ve.ServerName, Action: "allow"})
	}
	return networkPolicy{Rules: append(rules, rule{Domain: "*", Action: "deny"})}
}

// Create implements providers.Provider. A workspace with domains to reach
// is registered with the broker's egress proxy first (refused when
// guests cannot reach it). It creates the sprite (the name is the
// idempotency key: after an unclear answer it looks the name up before
// creating again), sets the network policy and reads it back before any
// command runs, writes the agent, the credential and the jails' settings
// into the sprite, and starts the agent's keeper. A failure after the
// sprite exists deletes it again; a failure unregisters the workspace.
func (p *Provider) Create(ctx context.Context, spec providers.CreateSpec) (_ providers.Sandbox, err error) {
	if spec.Image != "" && spec.Image != Image {
		return providers.Sandbox{}, errors.New("flysprites: create: unknown image; the only image is " + Image)
	}
	for k := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(spec.Env[k], 0) >= 0 {
			return providers.Sandbox{}, errors.New("flysprites: create: env holds an invalid name or a NUL byte")
		}
	}
	name, err := p.spriteName(spec.WorkspaceID)
	if err != nil {
		return providers.Sandbox{}, err
	}
	cred, unregister, err := providers.RegisterVendorEgress(p.vendor, spec)
	if err != nil {
		return providers.Sandbox{}, fmt.Errorf("flysprites: create: %w", err)
	}
	defer func() {
		if err != nil {
			unregister()
		}
	}()
	labels := p.labels(spec)
	req := createRequest{Name: name, Labels: labels,
		Config: &spriteConfig{CPUs: spec.Size.CPUCores, RAMMB: spec.Size.MemoryMiB}}
	if err := p.createOnce(ctx, req, spec.WorkspaceID); err != nil {
		return providers.Sandbox{}, err
	}
	sb := providers.Sandbox{Ref: name, Labels: parseLabels(labels)}
	fail := func(err error) (providers.Sandbox, error) {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if derr := p.c.delete(dctx, name); derr != nil {
			// The orphan sweep deletes it later: it carries our labels.
			p.log.Error("sprite not deleted after a failed create", sandgate.WorkspaceAttr(spec.WorkspaceID), sandgate.KeyError, derr)
		}
		p.forget(name)
		return providers.Sandbox{}, err
	}
	info, err := p.c.get(ctx, name)
	if err != nil {
		return fail(fmt.Errorf("flysprites: create: %w", err))
	}
	sb.StartedAt = info.CreatedAt
	if sb.StartedAt.IsZero() {
		sb.StartedAt = p.clock.Now()
	}
	if err := p.setPolicy(ctx, name, policyFor(p.vendor, cred != "")); err != nil {
		return fail(err)
	}
	// From here on commands run: the policy is in place.
	if err := p.checkTools(ctx, name); err != nil {
		return fail(err)
	}
	j := jailOf{Env: spec.Env, Egress: cred != ""}
	if err := p.deliver(ctx, name, j, cred); err != nil {
		return fail(err)
	}
	p.remember(name, j)
	if spec.ExpiresAt.IsZero() && cred != "" {
		// The keeper serves the forwarder; the broker always sets a deadline.
		return fail(errors.New("flysprites: create: no expires_at: the sprite's keeper needs one"))
	}
	if err := p.startKeeper(ctx, name, spec.ExpiresAt, spec.WorkspaceID, cred != ""); err != nil {
		return fail(err)
	}
	reported := spriteConfig{}
	if info.Config != nil {
		reported = *info.Config
	}
	p.log.Info("sandbox created", sandgate.WorkspaceAttr(spec.WorkspaceID), sandgate.InstanceAttr(spec.InstanceID),
		"cpus_asked", spec.Size.CPUCores, "ram_mb_asked", spec.Size.MemoryMiB,
		"cpus_reported", reported.CPUs, "ram_mb_reported", reported.RAMMB,
		"env_count", len(spec.Env), "egress_domains", len(spec.Egress.AllowedDomains))
	return sb, nil
}

// createOnce creates the sprite. Create has no idempotency key, so the
// name is the key (sheet §9): after an unclear answer (a transport error,
// a timeout or a 5xx), or a refusal that may mean the name is taken (409
// or 400, UNCERTAIN which), it looks the name up and takes a sprite that
// carries this workspace's labels as its own; a 404 there means the first
// try did not land, and it tries once more.
func (p *Provider) createOnce(ctx context.Context, req createRequest, wsID string) error {
	for attempt := 0; ; attempt++ {
		err := p.c.create(ctx, req)
		if err == nil {
			return nil
		}
		s := statusOf(err)
		if ctx.Err() != nil || (s != 0 && s < 500 && s != http.StatusConflict && s != http.StatusBadRequest) {
			return fmt.Errorf("flysprites: create: %w", err)
		}
		info, gerr := p.c.get(ctx, req.Name)
		switch {
		case gerr == nil:
			l := parseLabels(info.Labels)
			if l[providers.LabelWorkspace] == wsID && l[providers.LabelBroker] == p.brokerID {
				return nil
			}
			return fmt.Errorf("flysprites: create: the sprite name is taken by another sprite: %w", err)
		case statusOf(gerr) == http.StatusNotFound && attempt == 0 && s != http.StatusBadRequest:
			continue
		}
		return fmt.Errorf("flysprites: create: %w", err)
	}
}

// setPolicy sets the network policy and reads it back; a policy that did
// not take is an error, and the workspace is not handed out.
func (p *Provider) setPolicy(ctx context.Context, name string, want networkPolicy) error {
	if err := p.c.setPolicy(ctx, name, want); err != nil {
		return fmt.Errorf("flysprites: create: %w", err)
	}
	got, err := p.c.getPolicy(ctx, name)
	if err != nil {
		return fmt.Errorf("flysprites: create: read back the network policy: %w", err)
	}
	if !slices.Equal(got.Rules, want.Rules) {
		return errors.New("flysprites: create: the network policy read back differs from the one set")
	}
	return nil
}

// checkTools checks that the sprite has the tools the broker runs in it
// outside the agent (sudo for root, setsid for durable commands, timeout
// for an exec's deadline, tar and gzip for snapshots).
func (p *Provider) checkTools(ctx context.Context, name string) error {
	r, err := p.c.run(ctx, name, wsCommand{argv: []string{"sh", "-c", toolsScript}, max: 1 << 10, killAfter: time.Minute})
	if err != nil {
		return fmt.Errorf("flysprites: create: check the guest's tools: %w", err)
	}
	if r.res.ExitCode == exitNoTools {
		return errors.New("flysprites: create: the sprite lacks a tool the broker needs (sudo, setsid, timeout, tar, gzip)")
	}
	if r.res.ExitCode != 0 {
		return fmt.Errorf("flysprites: create: check the guest's tools: exit %d", r.res.ExitCode)
	}
	return nil
}

// toolsScript checks for the tools the broker runs in the guest.
var toolsScript = `for t in sudo setsid timeout tar gzip; do command -v "$t" >/dev/null 2>&1 || exit ` + strconv.Itoa(exitNoTools) + `; done
exit 0
`

const exitNoTools = 85

// deliver writes the agent, the workspace's egress credential and the
// proxy's CA (with egress) and the jails' settings into the sprite's
// agent directory; the keeper's start makes them root's.
func (p *Provider) deliver(ctx context.Context, name string, j jailOf, cred string) error {
	js, err := json.Marshal(j)
	if err != nil {
		return err
	}
	type file struct {
		path, mode string
		data       []byte
	}
	files := []file{{providers.GuestAgent, "0700", p.agent}, {jailFile, "0600", js}}
	if cred != "" {
		files = append(files, file{providers.GuestCredFile, "0600", []byte(cred + "\n")})
		if len(p.vendor.CA) > 0 {
			files = append(files, file{providers.GuestCAFile, "0600", p.vendor.CA})
		}
	}
	for _, f := range files {
		if err := p.c.fsWrite(ctx, name, f.path, f.mode, f.data); err != nil {
			return fmt.Errorf("flysprites: create: deliver the agent's files: %w", err)
		}
	}
	return nil
}

func (p *Provider) remember(name string, j jailOf) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.jails[name] = j
}

func (p *Provider) forget(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.jails, name)
}

// jailFor returns the jail settings of the sprite: from memory, or (in
// another broker process) from the file Create wrote in the sprite.
func (p *Provider) jailFor(ctx context.Context, name string) (jailOf, error) {
	p.mu.Lock()
	j, ok := p.jails[name]
	p.mu.Unlock()
	if ok {
		return j, nil
	}
	body, err := p.c.fsRead(ctx, name, jailFile)
	if statusOf(err) == http.StatusNotFound {
		return jailOf{}, p.goneOr(ctx, name, errors.New("flysprites: the jail's settings are missing in the sprite"))
	}
	if err != nil {
		return jailOf{}, err
	}
	defer body.Close()
	if err := json.NewDecoder(io.LimitReader(body, 4<<20)).Decode(&j); err != nil {
		return jailOf{}, fmt.Errorf("flysprites: the jail's settings in the sprite: %w", err)
	}
	p.remember(name, j)
	return j, nil
}

// waitScript runs its arguments as one command (never interpreted by
// the shell) and exits with its status, 128+n when signal n killed it: the
// exit byte's coding of a signal death is not documented (sheet §5.2,
// UNCERTAIN), so the vendor only ever sees a normal exit. It passes TERM,
// INT and HUP on to the command (the guest's timeout then passes them to
// the command's whole group) and keeps stdin, which sh would otherwise
// replace by /dev/null for a background command.
const waitScript = `trap 'kill -TERM "$p" 2>/dev/null' TERM INT HUP
exec 3<&0
"$@" <&3 3<&- &
p=$!
exec 3<&-
while :; do
	wait "$p"
	s=$?
	kill -0 "$p" 2>/dev/null || break
done
exit "$s"
`

// Exec implements providers.Provider. The argv goes as the vendor's cmd
// parameters, after waitScript's, and is never interpreted by a shell; a
// timeout wraps it in the guest's
// `timeout -s KILL` (sheet §9), so the command and its process group are
// killed at the deadline even if the broker is gone, and the session is
// killed through the kill route if the exit has not come shortly after.
// A canceled ctx kills the session (TERM, then KILL).
func (p *Provider) Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	if len(spec.Argv) == 0 {
		return providers.ExecResult{}, errors.New("flysprites: exec: empty argv")
	}
	j, err := p.jailFor(ctx, sb.Ref)
	if err != nil {
		return providers.ExecResult{}, fmt.Errorf("flysprites: exec: %w", err)
	}
	return p.execJail(ctx, sb, spec, providers.GuestRunArgv(j.Env, spec.Dir, j.Egress, spec.Argv))
}

// execJail runs argv, a jail's, as execAs does. A jail the agent refused
// to start may be a sprite whose lifetime keeper is gone: nothing would
// end it at expires_at, and every later command would be refused too, so
// the sprite is deleted and the workspace is gone.
func (p *Provider) execJail(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec, argv []string) (providers.ExecResult, error) {
	res, err := p.execAs(ctx, sb, spec, argv)
	if err != nil || res.ExitCode != providers.GuestJailFailure || res.TimedOut {
		return res, err
	}
	st, err := p.execAs(ctx, sb, providers.ExecSpec{Timeout: time.Minute, MaxOutputBytes: 4 << 10}, providers.GuestKeeperStatusArgv())
	if err != nil || st.ExitCode != providers.GuestKeeperGone {
		return res, nil // the keeper lives: the 125 is the command's, or the jail's own failure
	}
	p.log.Warn("sprite's lifetime keeper is gone: ending the workspace", sandgate.WorkspaceAttr(sb.Labels[providers.LabelWorkspace]))
	if err := p.Terminate(context.WithoutCancel(ctx), sb); err != nil {
		return providers.ExecResult{}, fmt.Errorf("flysprites: exec: the guest's lifetime keeper is gone and the sprite could not be deleted: %w", err)
	}
	return providers.ExecResult{}, fmt.Errorf("flysprites: exec: the guest's lifetime keeper is gone, so the sprite was deleted: %w", providers.ErrSandboxGone)
}

// execAs runs argv (a jail's, or a script of the broker's) as root of the
// sprite, for spec's stdin, timeout and output bound.
func (p *Provider) execAs(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec, argv []string) (providers.ExecResult, error) {
	if spec.Timeout > 0 {
		secs := strconv.FormatFloat(spec.Timeout.Seconds(), 'f', 3, 64)
		// -k 1: a TERM from the kill route (a canceled request) reaches
		// the whole group, and KILL follows a second later. The jail's
		// init dies with the agent that started it.
		argv = append([]string{"timeout", "-s", "KILL", "-k", "1", secs}, argv...)
	}
	// Exec runs as the sprite's user: sudo makes it root, which the jail
	// and the agent's directory need. The vendor's default environment
	// reaches sudo, never the jail.
	argv = append([]string{"sudo", "-n"}, argv...)
	cmd := wsCommand{argv: append([]string{"sh", "-c", waitScript, "sh"}, argv...),
		stdin: spec.Stdin, max: max(spec.MaxOutputBytes, 0)}
	if spec.Timeout > 0 {
		cmd.killAfter = spec.Timeout + killGrace
	}
	start := time.Now()
	r, err := p.c.run(ctx, sb.Ref, cmd)
	switch {
	case statusOf(err) == http.StatusNotFound:
		return providers.ExecResult{}, fmt.Errorf("flysprites: exec: %w", providers.ErrSandboxGone)
	case errors.Is(err, errNoExit):
		return providers.ExecResult{}, fmt.Errorf("flysprites: exec: %w", p.goneOr(context.WithoutCancel(ctx), sb.Ref, err))
	case err != nil:
		return providers.ExecResult{}, fmt.Errorf("flysprites: exec: %w", err)
	}
	res := r.res
	// `timeout -s KILL` dies with its group, so a kill at the deadline
	// reads as 137 after at least the timeout.
	if r.killed || (spec.Timeout > 0 && res.ExitCode == 137 && time.Since(start) >= spec.Timeout) {
		res.TimedOut, res.ExitCode = true, 137
	}
	return res, nil
}

// Terminate implements providers.Provider: the sprite is deleted, with its
// checkpoints and every process in it; one already gone is success.
func (p *Provider) Terminate(ctx context.Context, sb providers.Sandbox) error {
	if !strings.HasPrefix(sb.Ref, p.prefix) {
		return nil // no sprite of ours can have this name
	}
	if err := p.c.delete(ctx, sb.Ref); err != nil {
		return fmt.Errorf("flysprites: terminate: %w", err)
	}
	if p.vendor != nil && sb.Labels[providers.LabelWorkspace] != "" {
		p.vendor.Proxy.Unregister(sb.Labels[providers.LabelWorkspace])
	}
	p.forget(sb.Ref)
	p.log.Info("sandbox terminated", "sprite", sb.Ref)
	return nil
}

// List implements providers.Provider: every sprite under the provider's
// name prefix (the only server-side filter, sheet §4), all pages, whose
// broker label is this broker's.
func (p *Provider) List(ctx context.Context) ([]providers.Sandbox, error) {
	return p.ListBroker(ctx, p.brokerID)
}

// ListBroker implements providers.BrokerLister: the sprites of this
// provider that broker id named and labelled.
func (p *Provider) ListBroker(ctx context.Context, id string) ([]providers.Sandbox, error) {
	prefix := NamePrefix(id, p.name)
	all, err := p.c.list(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("flysprites: list: %w", err)
	}
	var out []providers.Sandbox
	for _, s := range all {
		l := parseLabels(s.Labels)
		if !strings.HasPrefix(s.Name, prefix) || l[providers.LabelBroker] != id {
			continue
		}
		out = append(out, providers.Sandbox{Ref: s.Name, Labels: l, StartedAt: s.CreatedAt})
	}
	slices.SortFunc(out, func(a, b providers.Sandbox) int { return strings.Compare(a.Ref, b.Ref) })
	return out, nil
}

// DeleteSnapshot implements providers.Provider: the blob is deleted.
func (p *Provider) DeleteSnapshot(ctx context.Context, ref providers.SnapshotRef) error {
	if err := p.snap.Delete(ctx, ref); err != nil {
		return fmt.Errorf("flysprites: delete snapshot: %w", err)
	}
	return nil
}

// Interface guards
var (
	_ providers.Provider     = (*Provider)(nil)
	_ execsnap.Execer        = (*Provider)(nil)
	_ providers.Commander    = (*Provider)(nil)
	_ providers.BrokerLister = (*Provider)(nil)
)

// jailExecer runs scripts of the broker's (snapshots) in a fresh jail
// without the workspace's env or egress, so a path resolves as the tenant
// sees it.
type jailExecer struct{ p *Provider }

func (e jailExecer) Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	if len(spec.Argv) == 0 {
		return providers.ExecResult{}, errors.New("flysprites: exec: empty argv")
	}
	return e.p.execJail(ctx, sb, spec, providers.GuestRunArgv(nil, spec.Dir, false, spec.Argv))
}

// rootExecer runs package runner's scripts as root outside every jail.
type rootExecer struct{ p *Provider }

func (e rootExecer) Exec(ctx context.Context, sb providers.Sandbox, spec providers.ExecSpec) (providers.ExecResult, error) {
	if len(spec.Argv) == 0 {
		return providers.ExecResult{}, errors.New("flysprites: exec: empty argv")
	}
	if spec.Dir != "" {
		return providers.ExecResult{}, errors.New("flysprites: exec: the runner's scripts run in the default directory")
	}
	return e.p.execAs(ctx, sb, spec, spec.Argv)
}

// StartCommand launches a durable command in a fresh jail; see
// [providers.Commander].
func (p *Provider) StartCommand(ctx context.Context, sb providers.Sandbox, id string, spec providers.ExecSpec) error {
	if len(spec.Argv) == 0 {
		return fmt.Errorf("flysprites: start: empty argv: %w", providers.ErrCommandNotStarted)
	}
	j, err := p.jailFor(ctx, sb.Ref)
	if err != nil {
		return fmt.Errorf("flysprites: start: %w", err)
	}
	spec.Argv = providers.GuestRunArgv(j.Env, spec.Dir, j.Egress, spec.Argv)
	spec.Dir = ""
	return p.runner.StartCommand(ctx, sb, id, spec)
}

// ReadCommand reads a durable command; see [providers.Commander].
func (p *Provider) ReadCommand(ctx context.Context, sb providers.Sandbox, id string, maxOut int64) (providers.CommandStatus, error) {
	return p.runner.ReadCommand(ctx, sb, id, maxOut)
}

// CancelCommand cancels a durable command; see [providers.Commander].
func (p *Provider) CancelCommand(ctx context.Context, sb providers.Sandbox, id string) error {
	return p.runner.CancelCommand(ctx, sb, id)
}
