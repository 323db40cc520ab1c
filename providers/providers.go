// Package providers defines the Provider interface that every sandbox vendor
// implements, the errors providers return, and the registry that config uses
// to open a provider by name.
package providers

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/sandgate/sandgate"
)

// Errors a provider returns. The gateway maps them to protocol codes.
var (
	// ErrFileNotFound: the path does not exist in the sandbox.
	ErrFileNotFound = errors.New("file not found")
	// ErrNotAFile: the path is a directory or another non-regular file, or
	// (on write) a parent is not a directory.
	ErrNotAFile = errors.New("not a regular file")
	// ErrFileTooLarge: the file is over the limit the caller passed.
	ErrFileTooLarge = errors.New("file too large")
	// ErrSandboxGone: the sandbox no longer exists at the vendor.
	ErrSandboxGone = errors.New("sandbox gone")
)

// Labels every vendor-side object carries. Nothing the client sent is ever a label.
const (
	LabelBroker    = "sandgate-broker"
	LabelWorkspace = "sandgate-workspace"
	LabelInstance  = "sandgate-instance"
)

// Sandbox names one vendor-side sandbox.
type Sandbox struct {
	// Ref is the vendor's id of the sandbox. It is never shown to a client.
	Ref string
	// Labels are the broker's labels on the sandbox (see LabelBroker).
	Labels map[string]string
	// StartedAt is the vendor-confirmed start, zero when unknown.
	StartedAt time.Time
}

// CreateSpec is what Create needs to start a sandbox.
type CreateSpec struct {
	WorkspaceID string
	InstanceID  string
	Size        sandgate.Size
	Image       string
	// Env is passed to every process in the sandbox. Never log it, and keep
	// it only where the sandbox itself lives (the vendor side).
	Env    map[string]string
	Egress sandgate.EgressPolicy
	// ExpiresAt is the hard deadline: the vendor-side lifetime, where the
	// vendor has one, must end the sandbox then.
	ExpiresAt   time.Time
	IdleTimeout time.Duration
}

// ExecSpec is one command run in a sandbox, without a shell.
type ExecSpec struct {
	Argv  []string
	Dir   string // absolute, or empty for the image's default working directory
	Stdin []byte
	// Timeout bounds the command; the provider kills every process the
	// command started when it passes.
	Timeout time.Duration
	// MaxOutputBytes caps what is kept of each stream; the rest is counted
	// and dropped. Zero means no output is kept.
	MaxOutputBytes int64
}

// ExecResult is the outcome of a command.
type ExecResult struct {
	// ExitCode is the process's exit status, or 128+n when signal n killed it.
	ExitCode        int
	Stdout, Stderr  []byte
	StdoutTruncated bool
	StderrTruncated bool
	// StdoutBytes and StderrBytes are the real totals the command wrote.
	StdoutBytes, StderrBytes int64
	// TimedOut is set when the command was killed at its timeout.
	TimedOut bool
}

// Provider runs sandboxes on one vendor. Methods are safe for concurrent use.
type Provider interface {
	// Create starts a sandbox and returns once it can run commands.
	Create(ctx context.Context, spec CreateSpec) (Sandbox, error)
	// Exec runs one command to completion. A non-zero exit is a result, not an error.
	Exec(ctx context.Context, sb Sandbox, spec ExecSpec) (ExecResult, error)
	// ReadFile returns the file at an absolute path. Returns ErrFileNotFound,
	// ErrNotAFile, or ErrFileTooLarge when the file is over max bytes.
	ReadFile(ctx context.Context, sb Sandbox, path string, max int64) ([]byte, error)
	// WriteFile creates parent directories and replaces the file. Returns ErrNotAFile.
	WriteFile(ctx context.Context, sb Sandbox, path string, data []byte) error
	// Terminate ends the sandbox and every process in it. Terminating a
	// sandbox that is already gone succeeds.
	Terminate(ctx context.Context, sb Sandbox) error
	// List returns the sandboxes that carry this broker's labels.
	List(ctx context.Context) ([]Sandbox, error)
}

// Env is what the host lends a provider.
type Env struct {
	Logger   *slog.Logger
	Clock    sandgate.Clock
	BrokerID string
	DataDir  string
}
