package broker

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/billing"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/noop"
	"github.com/sandgate/sandgate/token"
)

// Config is the broker's one YAML file. Every field has an environment
// override named after its YAML path (envFields): SANDGATE_ and the path
// upper-cased, dots as underscores, e.g. SANDGATE_ADMISSION_RISK_MAX_SIZE.
// A zero field means the default beside it.
type Config struct {
	Listen      string `yaml:"listen"`       // SANDGATE_LISTEN; default ":8443"
	AdminListen string `yaml:"admin_listen"` // SANDGATE_ADMIN_LISTEN; default "127.0.0.1:8444"
	DataDir     string `yaml:"data_dir"`     // SANDGATE_DATA_DIR; default "/var/lib/sandgate"
	BrokerID    string `yaml:"broker_id"`    // SANDGATE_BROKER_ID; default the host name; labels vendor objects
	// ShutdownTimeout bounds how long a stopping gateway lets requests in
	// flight finish (new ones get 503 unavailable meanwhile); default 30s.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	TLS             struct {
		CertFile       string   `yaml:"cert_file"`       // SANDGATE_TLS_CERT_FILE
		KeyFile        string   `yaml:"key_file"`        // SANDGATE_TLS_KEY_FILE
		TrustedProxies []string `yaml:"trusted_proxies"` // CIDRs or addresses of TLS-terminating proxies
	} `yaml:"tls"`
	Redis RedisConfig `yaml:"redis"`
	// Provider is the single provider of configs older than named
	// providers: with no `providers:` list it opens as one provider named
	// after its kind. Set one or the other, not both.
	Provider struct {
		Name  string    `yaml:"name"`  // SANDGATE_PROVIDER; default "local"
		Local yaml.Node `yaml:"local"` // the local provider's settings: see local.Config
	} `yaml:"provider"`
	// Providers are the broker's named providers: each entry has name,
	// kind and accept_new (default true), and the kind's own settings
	// beside them. Secrets are named by environment variable, never inline.
	Providers []yaml.Node `yaml:"providers"`
	// DefaultProvider is the provider of instances that name none;
	// SANDGATE_DEFAULT_PROVIDER; default the first provider.
	DefaultProvider string `yaml:"default_provider"`
	// Images is the store of the OCI images the local provider's
	// workspaces run on (internal/broker/images.go).
	Images    ImagesConfig     `yaml:"images"`
	Operators []OperatorConfig `yaml:"operators"`
	Lease     struct {
		GracePeriod time.Duration `yaml:"grace_period"` // default 1h
	} `yaml:"lease"`
	Defaults struct {
		Sizes        []string     `yaml:"sizes"`
		DefaultSize  string       `yaml:"default_size"`
		Images       []string     `yaml:"images"`
		DefaultImage string       `yaml:"default_image"`
		Limits       LimitsConfig `yaml:"limits"`
	} `yaml:"defaults"`
	Admission struct {
		// Timeout bounds every Redis call; past it admission fails closed
		// (503 admission_unavailable). Default 2s.
		Timeout time.Duration `yaml:"timeout"`
		// PendingTimeout bounds a create: a workspace still starting this
		// long after its Acquire began (its gateway died between the
		// provider's create and the record's update) is ended by the
		// reaper with reason failed and its slot freed. Default 2m; a
		// gateway's provider create is bounded to three quarters of it.
		PendingTimeout time.Duration `yaml:"pending_timeout"`
		Risk           struct {
			AcquiresPerMinute int    `yaml:"acquires_per_minute"` // default 120
			MaxOpenWorkspaces int    `yaml:"max_open_workspaces"` // default 100
			MaxSize           string `yaml:"max_size"`            // default xlarge
		} `yaml:"risk"`
		RateLimits map[string]struct {
			PerSecond float64 `yaml:"per_second"`
			Burst     int     `yaml:"burst"`
		} `yaml:"rate_limits"` // keys: read, acquire, exec
		// Inflight caps execs and file transfers in flight, counted by
		// each gateway process on its own (gateway.Config).
		Inflight struct {
			PerWorkspace int   `yaml:"per_workspace"` // default 8; past it 429 rate_limited
			PerInstance  int   `yaml:"per_instance"`  // default 16; past it 429 rate_limited
			MaxBytes     int64 `yaml:"max_bytes"`     // default 268435456 (256 MiB); past it 503 unavailable
			// An instance's and an account's shares of max_bytes: past
			// them 429 rate_limited. Defaults: a quarter and a half of
			// max_bytes.
			PerInstanceBytes int64 `yaml:"per_instance_bytes"`
			PerAccountBytes  int64 `yaml:"per_account_bytes"`
			// BodyTimeout ends a request whose body has not arrived
			// within it, freeing its reservation; default 60s.
			BodyTimeout time.Duration `yaml:"body_timeout"`
		} `yaml:"inflight"`
	} `yaml:"admission"`
	Log struct {
		Level  string `yaml:"level"`  // SANDGATE_LOG_LEVEL; debug, info (default), warn, error
		Format string `yaml:"format"` // SANDGATE_LOG_FORMAT; json (default) or text
	} `yaml:"log"`
	Reaper struct {
		// ReconcileInterval is how often the leader's reaper compares
		// running workspaces with what each provider lists, ending
		// (failed) those whose sandbox the vendor no longer has once
		// confirmed running this long; default 30s, negative for never.
		ReconcileInterval time.Duration `yaml:"reconcile_interval"`
	} `yaml:"reaper"`
	Billing struct {
		// RepairInterval is how often billing settles holds that lost
		// their owner; default 1m.
		RepairInterval time.Duration `yaml:"repair_interval"`
		// ReconcileInterval is how often the reaper's leader reconciles
		// every account's funds with its ledgers for the drift metric;
		// default 15m.
		ReconcileInterval time.Duration `yaml:"reconcile_interval"`
		// Webhook POSTs every budget alert, signed with HMAC-SHA256 and
		// retried with backoff; url "" sends none.
		Webhook struct {
			URL       string        `yaml:"url"`        // https, or http to loopback only
			SecretEnv string        `yaml:"secret_env"` // the environment variable holding the HMAC key (required with url)
			Timeout   time.Duration `yaml:"timeout"`    // per attempt; default 10s
		} `yaml:"webhook"`
		// Stripe sends settled usage to Stripe Billing as meter events
		// (docs/billing.md, "Invoicing with Stripe"); it runs when its
		// secret key's variable is set.
		Stripe StripeConfig `yaml:"stripe"`
		// PoolRateCard names the rate card that prices the warm pools'
		// time in usage summaries (billing.PoolUsage); "" shows their
		// seconds unpriced.
		PoolRateCard string `yaml:"pool_rate_card"`
	} `yaml:"billing"`

	// Egress is the broker's egress proxy, through which the local
	// provider's workspaces reach their allowed_domains (docs/egress.md).
	Egress struct {
		// Ports are the destination ports a workspace may reach;
		// SANDGATE_EGRESS_PORTS=80,443; default 80 and 443.
		Ports egressPorts `yaml:"ports"`
		// Hosts are the operator's static names (on-premises mirrors,
		// tests), name to IP address: looked up here and nowhere else,
		// and exempt from the private-address refusal;
		// SANDGATE_EGRESS_HOSTS=name=ip,name=ip.
		Hosts egressHosts `yaml:"hosts"`
		// VendorListen is the host:port on which the proxy serves vendor
		// guests (fly-machines, fly-sprites) in credential mode, over the
		// broker's TLS; "" serves none, and those providers then offer
		// egress [] only; SANDGATE_EGRESS_VENDOR_LISTEN.
		VendorListen string `yaml:"vendor_listen"`
		// VendorURL is how guests reach VendorListen, https://HOST:PORT
		// (the address as the operator publishes it); required with
		// vendor_listen; SANDGATE_EGRESS_VENDOR_URL.
		VendorURL string `yaml:"vendor_url"`
		// VendorCAFile is the PEM of the CA that signs the broker's
		// certificate, given to guests to check VendorURL with; "" means
		// the guest's system roots; SANDGATE_EGRESS_VENDOR_CA_FILE.
		VendorCAFile string `yaml:"vendor_ca_file"`
	} `yaml:"egress"`

	// GuestBinary is the sandgate-guest agent the vendor providers
	// deliver into every guest (their jail, lifetime keeper and egress
	// forwarder); "" means sandgate-guest beside the broker's executable;
	// SANDGATE_GUEST_BINARY.
	GuestBinary string `yaml:"guest_binary"`

	// DrainDelay is how long a stopping gateway reports not ready (GET
	// /readyz) while it still serves, before it refuses new requests: time
	// for a load balancer to move traffic away. Default 0.
	DrainDelay time.Duration `yaml:"drain_delay"`

	// webhookSecret is the value of billing.webhook.secret_env.
	webhookSecret sandgate.Secret
	// providers are Providers (or Provider) parsed.
	providers []providers.Config

	// testPauseAfterCreate is TEST ONLY, from SANDGATE_TEST_PAUSE_AFTER_CREATE
	// (a directory; never set in production, not in the config reference):
	// every Acquire, right after the provider created the sandbox and
	// before the record is confirmed, writes <dir>/<workspace id> and
	// blocks until that file is removed, so that a test can kill the
	// gateway at that point.
	testPauseAfterCreate string
}

// OperatorConfig is one operator token of the operator API.
type OperatorConfig struct {
	Name        string `yaml:"name"`
	Role        string `yaml:"role"`         // admin, operator or finance
	TokenSHA256 string `yaml:"token_sha256"` // hex SHA-256 of the token
	TokenEnv    string `yaml:"token_env"`    // or: the environment variable holding the token
	// Token is the token itself, for sandgate dev, which makes its own;
	// never read from a file.
	Token sandgate.Secret `yaml:"-"`
}

// LimitsConfig is a scope's limits in the config file, durations in Go syntax.
type LimitsConfig struct {
	MaxConcurrentWorkspaces int           `yaml:"max_concurrent_workspaces"`
	MaxLifetime             time.Duration `yaml:"max_lifetime"`
	IdleTimeout             time.Duration `yaml:"idle_timeout"`
	MaxExecTimeout          time.Duration `yaml:"max_exec_timeout"`
	DefaultExecTimeout      time.Duration `yaml:"default_exec_timeout"`
	MaxSnapshots            int           `yaml:"max_snapshots"`
	MaxSnapshotBytes        int64         `yaml:"max_snapshot_bytes"`
	SnapshotTTL             time.Duration `yaml:"snapshot_ttl"`
	MaxFileBytes            int64         `yaml:"max_file_bytes"`
	MaxOutputBytes          int64         `yaml:"max_output_bytes"`
	MaxEnvEntries           int           `yaml:"max_env_entries"`
	MaxEgressDomains        int           `yaml:"max_egress_domains"`
}

func (l LimitsConfig) limits() sandgate.Limits {
	return sandgate.Limits{
		MaxConcurrentWorkspaces: l.MaxConcurrentWorkspaces, MaxLifetime: l.MaxLifetime, IdleTimeout: l.IdleTimeout,
		MaxExecTimeout: l.MaxExecTimeout, DefaultExecTimeout: l.DefaultExecTimeout, MaxSnapshots: l.MaxSnapshots,
		MaxSnapshotBytes: l.MaxSnapshotBytes,
		SnapshotTTL:      l.SnapshotTTL, MaxFileBytes: l.MaxFileBytes, MaxOutputBytes: l.MaxOutputBytes,
		MaxEnvEntries: l.MaxEnvEntries, MaxEgressDomains: l.MaxEgressDomains,
	}.WithDefaults()
}

// LoadConfig reads the YAML file strictly (unknown keys are errors), applies
// environment overrides and fills defaults.
func LoadConfig(path string, getenv func(string) string) (*Config, error) {
	var c Config
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		var root yaml.Node
		if err := yaml.Unmarshal(b, &root); err != nil {
			return nil, fmt.Errorf("config %s: %w", path, err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("config %s: %w", path, yamlError(&root, err))
		}
	}
	if err := applyEnv(&c, getenv); err != nil {
		return nil, err
	}
	def := func(dst *string, v string) {
		if *dst == "" {
			*dst = v
		}
	}
	def(&c.Listen, ":8443")
	def(&c.AdminListen, "127.0.0.1:8444")
	def(&c.DataDir, "/var/lib/sandgate")
	if err := c.checkDefaults(); err != nil {
		return nil, err
	}
	if err := c.Redis.check(); err != nil {
		return nil, err
	}
	def(&c.Log.Level, "info")
	if c.BrokerID == "" {
		h, _ := os.Hostname()
		c.BrokerID = "sandgate-" + h
	}
	if c.Admission.Timeout == 0 {
		c.Admission.Timeout = 2 * time.Second
	}
	if c.Redis.Wait.Replicas > 0 && c.Redis.Wait.Timeout >= c.Admission.Timeout {
		return nil, fmt.Errorf("config: redis.wait.timeout (%s) must be shorter than admission.timeout (%s), which bounds every Redis call", c.Redis.Wait.Timeout, c.Admission.Timeout)
	}
	if c.Admission.PendingTimeout == 0 {
		c.Admission.PendingTimeout = 2 * time.Minute
	}
	if c.Admission.PendingTimeout < time.Second {
		return nil, fmt.Errorf("config: admission.pending_timeout must be at least 1s")
	}
	c.testPauseAfterCreate = getenv("SANDGATE_TEST_PAUSE_AFTER_CREATE")
	for class := range c.Admission.RateLimits {
		switch class {
		case "read", "acquire", "exec":
		default:
			return nil, fmt.Errorf("config: admission.rate_limits: unknown class %q (want read, acquire or exec)", class)
		}
	}
	if in := c.Admission.Inflight; in.PerWorkspace < 0 || in.PerInstance < 0 || in.MaxBytes < 0 ||
		in.PerInstanceBytes < 0 || in.PerAccountBytes < 0 || in.BodyTimeout < 0 {
		return nil, fmt.Errorf("config: admission.inflight: per_workspace, per_instance, max_bytes, per_instance_bytes, per_account_bytes and body_timeout must not be negative")
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.Lease.GracePeriod == 0 {
		c.Lease.GracePeriod = time.Hour
	}
	if c.Billing.RepairInterval == 0 {
		c.Billing.RepairInterval = time.Minute
	}
	if c.Billing.RepairInterval < 0 {
		return nil, fmt.Errorf("config: billing.repair_interval must be positive")
	}
	if c.Billing.ReconcileInterval == 0 {
		c.Billing.ReconcileInterval = 15 * time.Minute
	}
	if c.Billing.ReconcileInterval < 0 {
		return nil, fmt.Errorf("config: billing.reconcile_interval must be positive")
	}
	if wh := c.Billing.Webhook; wh.URL != "" {
		if err := billing.ValidateWebhookURL(wh.URL); err != nil {
			return nil, fmt.Errorf("config: billing.webhook: %w", err)
		}
		if wh.SecretEnv == "" {
			return nil, fmt.Errorf("config: billing.webhook: set secret_env, the environment variable holding the HMAC key")
		}
		if c.webhookSecret = sandgate.Secret(getenv(wh.SecretEnv)); c.webhookSecret == "" {
			return nil, fmt.Errorf("config: billing.webhook: %s is empty", wh.SecretEnv)
		}
	}
	if err := c.Billing.Stripe.check(); err != nil {
		return nil, err
	}
	if _, err := c.egressConfig(nil); err != nil {
		return nil, err
	}
	if err := c.checkVendorEgress(); err != nil {
		return nil, err
	}
	pcs, err := c.providerConfigs()
	if err != nil {
		return nil, err
	}
	c.providers = pcs
	if c.DefaultProvider == "" {
		// A provider that runs nothing is never the default by accident.
		if pcs[0].Kind == noop.Kind {
			return nil, fmt.Errorf("config: provider %q is of kind noop (runs nothing, for load tests): name it in default_provider to make it the default", pcs[0].Name)
		}
		c.DefaultProvider = pcs[0].Name
	}
	if !slices.ContainsFunc(pcs, func(p providers.Config) bool { return p.Name == c.DefaultProvider }) {
		return nil, fmt.Errorf("config: default_provider %q is not one of the providers", c.DefaultProvider)
	}
	return &c, nil
}

func (c *Config) trustedProxies() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range c.TLS.TrustedProxies {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("config: tls.trusted_proxies: %q is neither a CIDR nor an address", s)
		}
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// OperatorTokens returns the operator tokens of the operators: section,
// reading token_env with getenv.
func (c *Config) OperatorTokens(getenv func(string) string) ([]adminapi.OperatorToken, error) {
	var out []adminapi.OperatorToken
	for _, o := range c.Operators {
		role := adminapi.Role(o.Role)
		switch role {
		case adminapi.RoleAdmin, adminapi.RoleOperator, adminapi.RoleFinance:
		default:
			return nil, fmt.Errorf("config: operator %q: role must be admin, operator or finance", o.Name)
		}
		// The actor of the token's audit entries is its name and first 8
		// characters; with token_sha256 alone the broker never holds the
		// token, and the name stands alone.
		h, prefix := o.TokenSHA256, ""
		tok := o.Token
		if o.TokenEnv != "" {
			tok = sandgate.Secret(getenv(o.TokenEnv))
			if tok == "" {
				return nil, fmt.Errorf("config: operator %q: %s is empty", o.Name, o.TokenEnv)
			}
		}
		if tok != "" {
			h, prefix = token.Hash(tok), adminapi.TokenPrefix(tok)
		}
		if len(h) != 64 {
			return nil, fmt.Errorf("config: operator %q: set token_sha256 (64 hex characters) or token_env", o.Name)
		}
		out = append(out, adminapi.OperatorToken{Name: o.Name, Role: role, Hash: h, Prefix: prefix})
	}
	return out, nil
}

// providerConfigs parses the providers: list, or turns the old single
// provider: block into one provider named after its kind. Names are
// checked here; kinds and settings when the providers open.
func (c *Config) providerConfigs() ([]providers.Config, error) {
	legacy := c.Provider.Name != "" || c.Provider.Local.Kind != 0
	if len(c.Providers) > 0 {
		if legacy {
			return nil, fmt.Errorf("config: set providers: or the older provider: block, not both")
		}
		var out []providers.Config
		for i, n := range c.Providers {
			pc, err := parseProvider(n)
			if err != nil {
				return nil, fmt.Errorf("config: providers[%d]: %w", i, err)
			}
			out = append(out, pc)
		}
		return out, nil
	}
	kind := c.Provider.Name
	if kind == "" {
		kind = "local"
	}
	pc := providers.Config{Name: kind, Kind: kind, AcceptNew: true}
	if kind == "local" {
		pc.Settings = c.Provider.Local
	} else if c.Provider.Local.Kind != 0 {
		return nil, fmt.Errorf("config: provider.local is set but provider.name is %q", kind)
	}
	return []providers.Config{pc}, nil
}

// parseProvider reads one entry of providers: its name, kind and
// accept_new, and the rest as the kind's settings.
func parseProvider(n yaml.Node) (providers.Config, error) {
	if n.Kind != yaml.MappingNode {
		return providers.Config{}, fmt.Errorf("want a mapping with name and kind")
	}
	pc := providers.Config{AcceptNew: true}
	settings := yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch k.Value {
		case "name":
			pc.Name = v.Value
		case "kind":
			pc.Kind = v.Value
		case "accept_new":
			if err := v.Decode(&pc.AcceptNew); err != nil {
				return providers.Config{}, fmt.Errorf("provider %q: accept_new: %w", pc.Name, yamlError(nil, err))
			}
		default:
			settings.Content = append(settings.Content, k, v)
		}
	}
	if err := providers.ValidName(pc.Name); err != nil {
		return providers.Config{}, err
	}
	if pc.Kind == "" {
		return providers.Config{}, fmt.Errorf("provider %q: kind is required", pc.Name)
	}
	pc.Settings = settings
	return pc, nil
}

// DevConfig is the config of `sandgate dev`: the defaults with every
// SANDGATE_* override of getenv that serve honours, over dataDir, with the
// local provider and, when provider is another kind, that one beside it
// as the default, its settings read from the vendor's own environment
// variables. The listeners, the data directory, the providers and the
// store are dev's own (its flags and its embedded store). A vendor kind
// whose guests reach the egress proxy over the network (VendorKind) gets
// a vendor listener on a loopback port dev picks, unless
// SANDGATE_EGRESS_VENDOR_LISTEN names one.
func DevConfig(dataDir, provider string, getenv func(string) string) (*Config, error) {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	cfg, err := LoadConfig("", func(k string) string {
		switch k {
		// Decided by dev's flags and its own set-up, not by overrides;
		// SANDGATE_PROVIDER_LOCAL (the local provider's settings, such
		// as a pool) is honoured below.
		case "SANDGATE_PROVIDER", "SANDGATE_PROVIDER_NAME", "SANDGATE_PROVIDERS", "SANDGATE_DEFAULT_PROVIDER":
			return ""
		}
		return getenv(k)
	})
	if err != nil {
		return nil, err
	}
	cfg.DataDir = dataDir
	if getenv("SANDGATE_BROKER_ID") == "" {
		cfg.BrokerID = "sandgate-dev"
	}
	if err := providers.ValidName(provider); err != nil {
		return nil, fmt.Errorf("--provider: %w", err)
	}
	if provider != "local" {
		cfg.providers = append(cfg.providers, providers.Config{Name: provider, Kind: provider, AcceptNew: true})
	}
	cfg.DefaultProvider = provider
	if cfg.Billing.PoolRateCard == "" {
		// A pool's time is priced as the dev account's workspaces are,
		// at the card bootstrapDevBilling makes.
		cfg.Billing.PoolRateCard = "dev"
	}
	if VendorKind(provider) && cfg.Egress.VendorListen == "" {
		// The fakes' guests run on this host: loopback reaches it.
		cfg.Egress.VendorListen = "127.0.0.1:0"
	}
	// For trying things: the local provider warns loudly where the host
	// cannot enforce a workspace limit, and runs anyway, beside whatever
	// SANDGATE_PROVIDER_LOCAL sets.
	for i := range cfg.providers {
		if cfg.providers[i].Kind == "local" {
			s := &cfg.providers[i].Settings
			if s.Kind != yaml.MappingNode {
				*s = yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
			}
			if !slices.ContainsFunc(s.Content, func(n *yaml.Node) bool { return n.Value == "allow_unenforced" }) {
				s.Content = append(s.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "allow_unenforced"},
					&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "true"})
			}
		}
	}
	return cfg, nil
}

// VendorKind reports whether provider kind runs its guests on a vendor's
// machines with the broker's own jail (sandgate-guest), reaching the
// egress proxy over egress.vendor_listen.
func VendorKind(kind string) bool { return kind == "fly-machines" || kind == "fly-sprites" }
