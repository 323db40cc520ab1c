// Package flysprites runs workspaces on Fly Sprites: one sprite per
// workspace, its egress filtered by the vendor's domain policy (set and
// read back before the first command), commands over the exec WebSocket,
// files through the fs API, snapshots through the shared blob store, and
// the hard lifetime enforced inside the sprite by a deadline process plus
// the broker's reaper. Every vendor fact comes from the fact sheet
// ../shared/reference/fly-sprites.md; README.md ("Fly Sprites") says what
// is enforced where.
package flysprites

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
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

// Guest paths the broker owns inside every sprite; no client is told of them.
const (
	guestDir     = "/tmp/.sandgate"
	guestEnvFile = guestDir + "/env" // the workspace's environment, NUL-separated, 0600
)

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

	mu  sync.Mutex
	env map[string][]string // sprite name → the env sent with every exec, as loaded
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
		env:      map[string][]string{},
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.clock == nil {
		p.clock = sandgate.SystemClock{}
	}
	p.snap = execsnap.New(p, c.Blobs, execsnap.Config{})
	return p, nil
}

// Capabilities implements providers.Provider. Egress is the vendor's own
// domain policy (native); the vendor documents it as DNS filtering, and
// whether a connection to a literal IP address is blocked is not
// documented (sheet §8): README.md states that gap. The lifetime is
// enforced inside the sprite by the deadline process (a command that
// clears its environment or kills that process escapes it) and by the
// reaper's delete, so it is not reported as the vendor's; idle is the
// reaper's. Snapshots go through the blob store.
func (p *Provider) Capabilities() providers.Capabilities {
	return providers.Capabilities{
		Egress:       providers.EgressNative,
		Snapshots:    true,
		Sizes:        sandgate.StandardSizes,
		Images:       []string{Image},
		DefaultImage: Image,
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

// policyFor is the network policy of an egress allowlist: each domain an
// allow rule, then a final deny of everything (sheet §8: keep a final `*`
// deny rule); [] is the deny rule alone.
func policyFor(eg sandgate.EgressPolicy) networkPolicy {
	var rules []rule
	for _, d := range eg.AllowedDomains {
		rules = append(rules, rule{Domain: d, Action: "allow"})
	}
	return networkPolicy{Rules: append(rules, rule{Domain: "*", Action: "deny"})}
}

// Create implements providers.Provider. It creates the sprite (the name is
// the idempotency key: after an unclear answer it looks the name up before
// creating again), sets the network policy and reads it back before any
// command runs, records the environment inside the sprite, and starts the
// deadline process. A failure after the sprite exists deletes it again.
func (p *Provider) Create(ctx context.Context, spec providers.CreateSpec) (providers.Sandbox, error) {
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
	if err := p.setPolicy(ctx, name, policyFor(spec.Egress)); err != nil {
		return fail(err)
	}
	// From here on commands run: the policy is in place.
	base, err := p.defaultEnv(ctx, name)
	if err != nil {
		return fail(err)
	}
	env := mergeEnv(base, spec.Env, markerVar+"="+name)
	if err := p.c.fsWrite(ctx, name, guestEnvFile, "0600", encodeEnv(env)); err != nil {
		return fail(fmt.Errorf("flysprites: create: record the environment: %w", err))
	}
	p.remember(name, env)
	if !spec.ExpiresAt.IsZero() {
		if err := p.startDeadline(ctx, name, base, spec.ExpiresAt); err != nil {
			return fail(err)
		}
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

// markerVar is in the environment of every command the broker starts in
// a sprite; the deadline process kills every process that carries it.
const markerVar = "SANDGATE_SPRITE"

// defaultEnv reads the sprite's default environment: the exec env
// parameter replaces it (sheet §5.1), so every exec sends it along with
// the workspace's.
func (p *Provider) defaultEnv(ctx context.Context, name string) ([]string, error) {
	r, err := p.c.run(ctx, name, wsCommand{argv: []string{"sh", "-c", toolsScript}, max: 1 << 20, killAfter: time.Minute})
	if err != nil {
		return nil, fmt.Errorf("flysprites: create: read the default environment: %w", err)
	}
	if r.res.ExitCode == exitNoTools {
		return nil, errors.New("flysprites: create: the sprite lacks a tool the broker needs (timeout, setsid, tar, gzip, grep)")
	}
	if r.res.ExitCode != 0 || r.res.StdoutTruncated {
		return nil, fmt.Errorf("flysprites: create: read the default environment: exit %d", r.res.ExitCode)
	}
	var env []string
	for _, kv := range bytes.Split(r.res.Stdout, []byte{0}) {
		if k, _, ok := strings.Cut(string(kv), "="); ok && k != "" && k != markerVar && !shellVars[k] {
			env = append(env, string(kv))
		}
	}
	return env, nil
}

// toolsScript checks for the tools the broker runs in the guest (the exec
// wrapper, the deadline process, snapshots), then prints the default
// environment, NUL-separated.
var toolsScript = `for t in timeout setsid tar gzip grep; do command -v "$t" >/dev/null 2>&1 || exit ` + strconv.Itoa(exitNoTools) + `; done
exec cat /proc/self/environ
`

const exitNoTools = 85

// shellVars are what the shell of toolsScript may add to the environment
// it passes on; they are not the sprite's.
var shellVars = map[string]bool{"PWD": true, "OLDPWD": true, "SHLVL": true, "_": true}

// mergeEnv returns base with ws's variables set over it, and extra last.
func mergeEnv(base []string, ws map[string]string, extra ...string) []string {
	var out []string
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, over := ws[k]; !over {
			out = append(out, kv)
		}
	}
	keys := make([]string, 0, len(ws))
	for k := range ws {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		out = append(out, k+"="+ws[k])
	}
	return append(out, extra...)
}

func encodeEnv(env []string) []byte {
	var b bytes.Buffer
	for _, kv := range env {
		b.WriteString(kv)
		b.WriteByte(0)
	}
	return b.Bytes()
}

func (p *Provider) remember(name string, env []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.env[name] = env
}

func (p *Provider) forget(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.env, name)
}

// envOf returns the environment of the sprite's commands: from memory,
// or (in another broker process) from the file Create wrote in the sprite.
func (p *Provider) envOf(ctx context.Context, name string) ([]string, error) {
	p.mu.Lock()
	env, ok := p.env[name]
	p.mu.Unlock()
	if ok {
		return env, nil
	}
	body, err := p.c.fsRead(ctx, name, guestEnvFile)
	if statusOf(err) == http.StatusNotFound {
		return nil, p.goneOr(ctx, name, errors.New("flysprites: the workspace's environment is missing in the sprite"))
	}
	if err != nil {
		return nil, err
	}
	defer body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(body, 4<<20)); err != nil {
		return nil, err
	}
	for _, kv := range bytes.Split(buf.Bytes(), []byte{0}) {
		if len(kv) > 0 {
			env = append(env, string(kv))
		}
	}
	p.remember(name, env)
	return env, nil
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
	env, err := p.envOf(ctx, sb.Ref)
	if err != nil {
		return providers.ExecResult{}, fmt.Errorf("flysprites: exec: %w", err)
	}
	argv := spec.Argv
	if spec.Timeout > 0 {
		secs := strconv.FormatFloat(spec.Timeout.Seconds(), 'f', 3, 64)
		// -k 1: a TERM from the kill route (a canceled request) reaches
		// the whole group, and KILL follows a second later.
		argv = append([]string{"timeout", "-s", "KILL", "-k", "1", secs}, argv...)
	}
	cmd := wsCommand{argv: append([]string{"sh", "-c", waitScript, "sh"}, argv...), env: env, dir: spec.Dir,
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
	_ providers.BrokerLister = (*Provider)(nil)
)
