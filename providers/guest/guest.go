package guest

import (
	"context"
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

// RunConfig is one `sandgate-guest run`.
type RunConfig struct {
	Argv []string
	// Dir is the tenant's working directory; empty means HOME.
	Dir string
	// Env is the tenant's environment besides PATH, HOME and the proxy
	// variables, as K=V pairs.
	Env []string
	// EgressSock is the forwarder's socket; empty means no egress at all.
	EgressSock string
	// ProxyPort is the jail's loopback port that relays to EgressSock.
	ProxyPort int
	// Timeout ends the jail with status 124 when it passes; zero means none.
	Timeout time.Duration
	// StdoutFile, StderrFile and StatusFile, when set, receive the
	// tenant's output (appended) and its exit status.
	StdoutFile, StderrFile, StatusFile string
	// AgentDir is hidden under a tmpfs in the jail.
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
	Until   time.Time
	Forward *ForwardConfig // nil: no forwarder
	// ReadyFD, when positive, is closed once the keeper serves (the
	// detaching parent waits for it).
	ReadyFD int
}

// Run runs c.Argv in a fresh jail and returns its exit status.
func Run(ctx context.Context, c RunConfig) int { return 1 }

// JailInit is the jail's pid 1.
func JailInit() int { return 1 }

// Keep runs the keeper until its deadline or a SIGTERM and returns its exit
// status.
func Keep(ctx context.Context, c KeeperConfig) int { return 1 }

// Detach starts the agent again with args in a new session, stdio on
// /dev/null, and returns once it is started (ready: once it serves).
func Detach(ctx context.Context, args []string, ready bool) int { return 1 }
