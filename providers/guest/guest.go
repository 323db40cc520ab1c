package guest

import (
	"strconv"
	"strings"
	"time"
)

// Defaults of the command line.
const (
	// DefaultAgentDir is where the provider delivers the agent and its
	// credential; the jail hides it under a tmpfs.
	DefaultAgentDir = "/.sandgate"
	// DefaultProxyPort is the jail's loopback port the proxy variables
	// name, as on the local provider.
	DefaultProxyPort = 3128
)

// InitCommand is the hidden first argument with which the agent re-executes
// itself as the jail's pid 1.
const InitCommand = "jail-init"

// Hostname is the jail's host name: nothing of the vendor's.
const Hostname = "sandbox"

// Exit statuses of a jail besides the tenant's own.
const (
	ExitTimeout     = 124 // --timeout passed
	ExitNotExec     = 126 // ARGV[0] is not executable
	ExitNotFound    = 127 // ARGV[0] is not found
	ExitSignalBase  = 128 // 128+N: ended by signal N
	exitJailFailure = 125 // the jail could not be built
)

// ExitKeeperGone is keeper-status's exit status when the guest's
// lifetime keeper is not running or its deadline has passed: no jail may
// start (providers.GuestKeeperGone is the broker's copy).
const ExitKeeperGone = 3

// outsidePath is the whole environment of the agent's own processes
// outside every jail: nothing of the vendor's or the client's.
const outsidePath = "/usr/sbin:/usr/bin:/sbin:/bin"

// defaultPath is the tenant's PATH unless its env sets one.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// RunConfig is one `sandgate-guest run`.
type RunConfig struct {
	Argv []string
	// Dir is the tenant's working directory; empty means HOME.
	Dir string
	// Env is the tenant's environment besides PATH, HOME and the proxy
	// variables, as K=V pairs (a PATH or HOME here replaces the default).
	Env []string
	// EgressSock is the forwarder's socket; empty means no egress at all.
	EgressSock string
	// ProxyPort is the jail's loopback port that relays to EgressSock;
	// zero means DefaultProxyPort.
	ProxyPort int
	// Timeout ends the jail with status 124 when it passes; zero means none.
	Timeout time.Duration
	// StdoutFile, StderrFile and StatusFile, when set, receive the
	// tenant's output (appended) and its exit status (durable commands).
	StdoutFile, StderrFile, StatusFile string
	// AgentDir is hidden under a tmpfs in the jail; empty means
	// DefaultAgentDir.
	AgentDir string
}

// ForwardConfig is the keeper's forwarder to the broker's egress proxy.
type ForwardConfig struct {
	Sock       string // the Unix socket the jails reach
	Proxy      string // host:port of the broker's proxy (TLS)
	ServerName string // TLS server name; empty means Proxy's host
	User       string // the workspace's id
	CredFile   string // the workspace's credential, one line
	CAFile     string // PEM roots; empty means the system's
}

// KeeperConfig is one `sandgate-guest keeper`.
type KeeperConfig struct {
	Until time.Time
	// AgentDir is where the keeper records itself for run (which refuses
	// a jail without a live keeper); empty means DefaultAgentDir.
	AgentDir string
	Forward  *ForwardConfig // nil: no forwarder
	// ReadyFD, when positive, is closed once the keeper serves (the
	// detaching parent waits for it).
	ReadyFD int
}

// tenantEnv is the environment of the jail's pid 1 and of the tenant,
// built from scratch: PATH, HOME, env, and the proxy variables when the
// jail has egress.
func tenantEnv(env []string, egress bool, proxyPort int) []string {
	out := []string{"PATH=" + defaultPath, "HOME=/root"}
	set := func(kv string) {
		k, _, _ := strings.Cut(kv, "=")
		for i, o := range out {
			if ok, _, _ := strings.Cut(o, "="); ok == k {
				out[i] = kv
				return
			}
		}
		out = append(out, kv)
	}
	for _, kv := range env {
		if strings.Contains(kv, "=") {
			set(kv)
		}
	}
	if egress {
		for _, kv := range proxyEnv(proxyPort) {
			set(kv)
		}
	}
	return out
}

// proxyEnv are the proxy variables of a jail with egress: the local
// provider's, both cases, as tools read either.
func proxyEnv(port int) []string {
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	var out []string
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"} {
		out = append(out, k+"="+url)
	}
	return append(out, "NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1")
}
