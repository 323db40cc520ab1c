// Package modal runs workspaces on Modal Sandboxes through Modal's own gRPC
// API (the control plane modal.client.ModalClient and the per-task
// modal.task_command_router.TaskCommandRouter), with a client written from
// Modal's wire facts rather than Modal's SDK. README.md says which facts,
// what Modal enforces and what it costs.
package modal

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/modal/proto/clientpb"
)

// Environment variables the provider reads, the ones Modal's own SDKs read.
const (
	EnvTokenID     = "MODAL_TOKEN_ID"
	EnvTokenSecret = "MODAL_TOKEN_SECRET"
	EnvServerURL   = "MODAL_SERVER_URL"
	EnvEnvironment = "MODAL_ENVIRONMENT"
	// EnvImageBuilderVersion overrides the image builder version sent
	// with every image (the Go SDK's MODAL_IMAGE_BUILDER_VERSION).
	EnvImageBuilderVersion = "MODAL_IMAGE_BUILDER_VERSION"
	// EnvMaxThrottleWait caps, in seconds, the total time calls wait
	// when Modal throttles them.
	EnvMaxThrottleWait = "MODAL_MAX_THROTTLE_WAIT"
)

// DefaultServerURL is Modal's control plane.
const DefaultServerURL = "https://api.modal.com:443"

// DefaultImage is the image of a scope that names none: it has sh and the
// GNU coreutils the provider's exec wrapper and file calls need.
const DefaultImage = "buildpack-deps:bookworm"

// defaultBuilderVersion is the image builder version the Go SDK sends when
// MODAL_IMAGE_BUILDER_VERSION is unset.
const defaultBuilderVersion = "2024.10"

// Sizes are Modal's tiers (the Formation tier table): Modal counts CPU in
// physical cores, two vCPUs each. Every sandbox gets limits equal to these
// requests, so its per-second price is fixed by its tier.
var Sizes = []sandgate.Size{
	{Name: "small", CPUCores: 1, MemoryMiB: 512},
	{Name: "standard", CPUCores: 2, MemoryMiB: 2048},
	{Name: "large", CPUCores: 4, MemoryMiB: 4096},
	{Name: "xlarge", CPUCores: 8, MemoryMiB: 8192},
}

// Settings is the kind-specific block of a `kind: modal` provider in the
// broker's config. Credentials are never settings: they come from
// MODAL_TOKEN_ID and MODAL_TOKEN_SECRET. A zero field means the default
// noted beside it.
type Settings struct {
	// App is the Modal App every sandbox of this broker runs under; ""
	// means "sandgate-" + the broker id.
	App string `yaml:"app"`
	// DefaultImage is the registry tag of a scope that names none; ""
	// means DefaultImage.
	DefaultImage string `yaml:"default_image"`
	// Images are the registry tags instances may allow; empty means any
	// tag Modal can pull.
	Images []string `yaml:"images"`
	// Timeout bounds each control-plane call; 0 means 60s.
	Timeout time.Duration `yaml:"timeout"`
}

// Config configures a Provider. New fills the defaults noted beside each field.
type Config struct {
	ServerURL   string // "" means DefaultServerURL
	TokenID     string // required
	TokenSecret sandgate.Secret
	// Environment fills every environment_name field; "" means the
	// workspace's default environment.
	Environment string
	App         string   // "" means "sandgate-" + the broker id
	Images      []string // nil means any registry tag
	// DefaultImage is the image of a scope that names none; "" means
	// DefaultImage.
	DefaultImage   string
	BuilderVersion string        // "" means 2024.10
	Timeout        time.Duration // per control-plane call; 0 means 60s
	// MaxThrottleWait caps the total wait on throttled calls; 0 means
	// only the call's own deadline does.
	MaxThrottleWait time.Duration
	// RootCAs verifies Modal's servers; nil means the system roots (which
	// honour SSL_CERT_FILE).
	RootCAs *x509.CertPool
}

// Provider runs sandboxes on Modal. Its methods are safe for concurrent use.
type Provider struct {
	cfg      Config
	brokerID string
	// ownApp is set when the App's name comes from the broker id: another
	// broker id's sandboxes are then in that id's App (ListBroker).
	ownApp bool
	log    *slog.Logger
	clock  sandgate.Clock

	conn   *grpc.ClientConn
	client clientpb.ModalClientClient
	auth   authToken

	mu      sync.Mutex
	appID   string
	images  map[string]string  // registry tag → image id
	routers map[string]*router // sandbox id → its task's command router
	// routerConns are the connections to router hosts, by dial target.
	routerConns map[string]*grpc.ClientConn
	imageMu     map[string]*sync.Mutex // per tag: one resolution at a time
	// closed: Close ran, so a late call must not dial a router connection
	// that nothing would close.
	closed bool
}

// Open opens a Modal provider from its config block and the environment
// (MODAL_TOKEN_ID, MODAL_TOKEN_SECRET, MODAL_SERVER_URL, MODAL_ENVIRONMENT).
// A missing credential is an error naming the variable.
func Open(ctx context.Context, name string, raw yaml.Node, env providers.Env) (providers.Provider, error) {
	return providers.OpenSettings(ctx, raw, env, func(ctx context.Context, s Settings, getenv func(string) string) (*Provider, error) {
		c := Config{
			ServerURL:      getenv(EnvServerURL),
			TokenID:        strings.TrimSpace(getenv(EnvTokenID)),
			TokenSecret:    sandgate.Secret(strings.TrimSpace(getenv(EnvTokenSecret))),
			Environment:    getenv(EnvEnvironment),
			App:            s.App,
			Images:         s.Images,
			DefaultImage:   s.DefaultImage,
			BuilderVersion: getenv(EnvImageBuilderVersion),
			Timeout:        s.Timeout,
		}
		if v := getenv(EnvMaxThrottleWait); v != "" {
			secs, err := strconv.ParseFloat(v, 64)
			if err != nil || secs < 0 {
				return nil, fmt.Errorf("modal: %s must be a number of seconds", EnvMaxThrottleWait)
			}
			c.MaxThrottleWait = time.Duration(secs * float64(time.Second))
		}
		return New(ctx, c, env)
	})
}

// New returns a provider for c. It checks the configuration and prepares
// the connection, which is dialled on first use: a Modal outage does not
// stop the broker from starting.
func New(ctx context.Context, c Config, env providers.Env) (*Provider, error) {
	c.ServerURL = cmp.Or(c.ServerURL, DefaultServerURL)
	c.DefaultImage = cmp.Or(c.DefaultImage, DefaultImage)
	c.BuilderVersion = cmp.Or(c.BuilderVersion, defaultBuilderVersion)
	c.Timeout = cmp.Or(c.Timeout, 60*time.Second)
	ownApp := c.App == ""
	if ownApp {
		c.App = appName(env.BrokerID)
	}
	switch {
	case c.TokenID == "":
		return nil, fmt.Errorf("modal: %s is not set", EnvTokenID)
	case c.TokenSecret == "":
		return nil, fmt.Errorf("modal: %s is not set", EnvTokenSecret)
	case env.BrokerID == "":
		return nil, errors.New("modal: the broker has no id to tag sandboxes with")
	case c.Images != nil && !slices.Contains(c.Images, c.DefaultImage):
		return nil, errors.New("modal: default_image must be one of images")
	}
	target, secure, err := parseServerURL(c.ServerURL)
	if err != nil {
		return nil, err
	}
	p := &Provider{
		cfg:      c,
		brokerID: env.BrokerID,
		ownApp:   ownApp,
		log:      env.Logger,
		clock:    env.Clock,
		images:   map[string]string{},
		routers:  map[string]*router{},
		imageMu:  map[string]*sync.Mutex{},

		routerConns: map[string]*grpc.ClientConn{},
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.clock == nil {
		p.clock = sandgate.SystemClock{}
	}
	conn, err := p.dial(target, secure, true)
	if err != nil {
		return nil, fmt.Errorf("modal: %w", err)
	}
	p.conn = conn
	p.client = clientpb.NewModalClientClient(conn)
	return p, nil
}

// parseServerURL returns the dial target of an https:// (TLS) or http://
// (plaintext, local development only) server URL; the port defaults to 443
// and 80.
func parseServerURL(raw string) (target string, secure bool, err error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return "", false, fmt.Errorf("modal: %s must be an https URL with a host and nothing else", EnvServerURL)
	}
	port := u.Port()
	switch u.Scheme {
	case "https":
		secure, port = true, cmp.Or(port, "443")
	case "http":
		port = cmp.Or(port, "80")
	default:
		return "", false, fmt.Errorf("modal: %s must be an https URL", EnvServerURL)
	}
	host := u.Hostname()
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return host + ":" + port, secure, nil
}

// Capabilities implements providers.Provider: no network only (noNetwork
// says why Modal's domain allowlist is not used); Modal ends each sandbox
// at its timeout and idle timeout with no broker alive, and stores
// directory snapshots; durable commands run through package runner, with
// a watcher exec each (commands.go).
func (p *Provider) Capabilities() providers.Capabilities {
	return providers.Capabilities{
		Egress:         providers.EgressNoneOnly,
		VendorLifetime: true,
		VendorIdle:     true,
		Snapshots:      true,
		NativeCommands: true,
		Sizes:          Sizes,
		Images:         p.cfg.Images,
		DefaultImage:   p.cfg.DefaultImage,
		MaxLifetime:    maxLifetime,
	}
}

// Close implements providers.Provider: it closes the connections of this
// process. Sandboxes keep running until they are terminated or Modal ends
// them at their timeouts.
func (p *Provider) Close() error {
	p.mu.Lock()
	conns := p.routerConns
	p.routers, p.routerConns = map[string]*router{}, map[string]*grpc.ClientConn{}
	p.closed = true
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return p.conn.Close()
}

// Interface guards
var (
	_ providers.Provider     = (*Provider)(nil)
	_ providers.BrokerLister = (*Provider)(nil)
)
