// Package providers defines the Provider interface that every sandbox vendor
// implements, the errors providers return, and the registry that config uses
// to open a provider by name.
package providers

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"path"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sandgate/sandgate"
)

// Errors a provider returns. The gateway maps them to protocol codes.
var (
	// ErrFileNotFound: the path does not exist in the sandbox.
	ErrFileNotFound = errors.New("file not found")
	// ErrNotAFile: the path is a directory or another non-regular file, or
	// (on write) a parent is not a directory.
	ErrNotAFile = errors.New("not a regular file")
	// ErrNotWritable: the sandbox cannot write at the path (a read-only
	// mount such as /usr, /proc, or a directory without write permission).
	// It is the client's mistake, never the provider's failure: retrying
	// cannot help.
	ErrNotWritable = errors.New("path not writable in the sandbox")
	// ErrFileTooLarge: the file is over the limit the caller passed.
	ErrFileTooLarge = errors.New("file too large")
	// ErrSandboxGone: the sandbox no longer exists at the vendor.
	ErrSandboxGone = errors.New("sandbox gone")
	// ErrNoCapacity is a create refused because the provider has no room
	// for another sandbox now (the local provider's disk reserve); nothing
	// was created, and a later retry may succeed.
	ErrNoCapacity = errors.New("no capacity for a new sandbox")
	// ErrImageUnavailable is a create refused because its image cannot
	// run, whatever a retry does: no registry has it, it is over the size
	// limit, or the provider cannot run it as it is (its user). Nothing
	// was created.
	ErrImageUnavailable = errors.New("image unavailable")
	// ErrSnapshotGone: the snapshot's contents no longer exist (deleted,
	// or never stored).
	ErrSnapshotGone = errors.New("snapshot gone")
	// ErrSnapshotTooLarge: the contents grew past SnapshotSpec.MaxBytes;
	// nothing was kept.
	ErrSnapshotTooLarge = errors.New("snapshot too large")
	// ErrCommandNotStarted: a durable command definitely did not start and
	// never will; its identity may be claimed again.
	ErrCommandNotStarted = errors.New("command not started")
	// ErrCommandFenced: a cancel came before the launch, which therefore
	// did not and never will run.
	ErrCommandFenced = errors.New("command fenced by a cancel")
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
	// AccountID is the workspace's account, for what the broker keeps
	// about the sandbox on its own side (the egress proxy's byte counts);
	// never a label, never sent to a vendor.
	AccountID string
	Size      sandgate.Size
	Image     string
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
	// Stdout and Stderr, when set, receive the kept bytes of each stream
	// (at most MaxOutputBytes) as the command writes them, and the
	// result's Stdout and Stderr stay nil: the caller owns the buffers, so
	// output is never copied into one the provider grows. A provider may
	// ignore them and return the bytes in the result instead. Each is
	// written from one goroutine at a time, and never after Exec returns.
	Stdout, Stderr io.Writer
}

// Check refuses what cannot be passed to a process: an empty argv, a NUL
// byte in argv or Dir, a relative Dir. Its messages never carry the
// values; the provider adds its name.
func (s ExecSpec) Check() error {
	if len(s.Argv) == 0 {
		return errors.New("empty argv")
	}
	for _, a := range s.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return errors.New("argv holds a NUL byte")
		}
	}
	if s.Dir != "" && (!path.IsAbs(s.Dir) || strings.IndexByte(s.Dir, 0) >= 0) {
		return errors.New("dir must be absolute and free of NUL")
	}
	return nil
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
//
// The lifecycle of a provider, written once here. The broker opens each
// configured provider once per process, at start, through its kind's
// [Opener] ([Registry.Open]); when one fails, those opened before it are
// closed and the broker does not start. The open provider serves the
// whole process, every request and the reaper alike, and other broker
// processes with the same broker id work on the same vendor account at
// the same time: nothing a provider keeps in memory may be the only record
// of a sandbox. Create is called by the acquire saga once the workspace's
// record (starting) and its admission hold exist, with a context that is
// not the client's, so a create runs to its end or its timeout even when
// the client goes away. When Create fails the broker undoes the admission
// and answers; a sandbox the failed Create left behind is found by the
// orphan sweep, through List. When a restore after Create fails, the
// broker terminates the sandbox before it answers. Exec, the file
// methods, Snapshot, Restore and the [Commander] methods act on a sandbox
// the broker holds a live record of; DeleteSnapshot is called when a
// snapshot is deleted, expires or is refused, and again by the reaper
// until it succeeds. Terminate is called when a workspace ends (release, the
// reaper's expiry, idle and revocation ends, a failed create or restore,
// an orphan) and again by the reaper until it succeeds; a sandbox that is
// already gone succeeds or returns ErrSandboxGone, which every caller
// counts as ended. List is how the leader's reaper sees the vendor side on
// each pass: a listed sandbox whose workspace has no live record is an
// orphan and is terminated; a workspace still starting past its pending
// deadline is ended as failed, along with the sandbox List shows for it;
// a List that fails postpones both for that provider only. So a provider
// guarantees that every vendor-side object it makes carries the broker's
// labels (see LabelBroker) and nothing the client sent (no env, argv,
// paths or contents in names, labels or metadata); that List returns the
// sandboxes with this broker's labels and no other's; and that it returns
// ErrSandboxGone whenever the vendor says the sandbox no longer exists, so
// that callers tell an end from a failure. Close is called once, at
// shutdown, after the listeners and the reaper have stopped. It releases
// only what this process holds (connections, helper processes,
// goroutines): sandboxes keep running, because they belong to the broker,
// not to the process.
type Provider interface {
	// Create starts a sandbox and returns once it can run commands.
	Create(ctx context.Context, spec CreateSpec) (Sandbox, error)
	// Exec runs one command to completion. A non-zero exit is a result, not an error.
	Exec(ctx context.Context, sb Sandbox, spec ExecSpec) (ExecResult, error)
	// ReadFile copies the file at an absolute path to w as it reads it
	// and returns the bytes written. Returns ErrFileNotFound, ErrNotAFile,
	// or ErrFileTooLarge when the file is over max bytes. It writes at
	// most max+1 bytes to w (one more tells a file that grew while it was
	// read); on an error, what it wrote is not the file and the caller
	// discards it.
	ReadFile(ctx context.Context, sb Sandbox, path string, max int64, w io.Writer) (int64, error)
	// WriteFile creates parent directories and replaces the file with
	// what r yields up to its io.EOF. When reading r fails, the file is
	// left as it was (no partial file is ever visible) and the error
	// returned wraps r's. Returns ErrNotAFile, ErrNotWritable.
	WriteFile(ctx context.Context, sb Sandbox, path string, r io.Reader) error
	// Terminate ends the sandbox and every process in it. Terminating a
	// sandbox that is already gone succeeds.
	Terminate(ctx context.Context, sb Sandbox) error
	// List returns the sandboxes that carry this broker's labels.
	List(ctx context.Context) ([]Sandbox, error)

	// Snapshot stores the contents of the directory spec.Dir of sb (files,
	// modes, symlinks, empty directories) outside the sandbox, labelled
	// with spec.ID. Returns ErrFileNotFound when Dir does not exist,
	// ErrNotAFile when it is not a directory (or one the provider cannot
	// snapshot), ErrSandboxGone. A Snapshot that fails leaves nothing that
	// DeleteSnapshot of SnapshotRef{ID: spec.ID} would not remove.
	Snapshot(ctx context.Context, sb Sandbox, spec SnapshotSpec) (SnapshotRef, error)
	// Restore writes the snapshot's contents into sb at dir, the path it
	// was taken from, creating parents. Returns ErrSnapshotGone when the
	// contents no longer exist, ErrSandboxGone.
	Restore(ctx context.Context, sb Sandbox, ref SnapshotRef, dir string) error
	// DeleteSnapshot deletes the snapshot's contents. With ref.Ref empty (a
	// Snapshot cut short before it answered) it finds them by ref.ID.
	// Deleting a snapshot that is already gone succeeds.
	DeleteSnapshot(ctx context.Context, ref SnapshotRef) error

	// Capabilities reports what the provider enforces and runs. It is
	// fixed once the provider is open.
	Capabilities() Capabilities
	// Close releases what the provider holds in this process (connections,
	// helpers). Sandboxes keep running: they belong to the broker, not to
	// the process.
	Close() error
}

// SnapshotSpec is what Snapshot needs.
type SnapshotSpec struct {
	// ID is the broker's snapshot id, a label of the stored contents.
	ID         string
	InstanceID string
	// Dir is the absolute directory to store. Never log it.
	Dir string
	// MaxBytes, when > 0, is the most the stored contents may take (what
	// is left of the instance's max_snapshot_bytes): a provider that can
	// stops storing past it and returns ErrSnapshotTooLarge, keeping
	// nothing, so that an oversized snapshot never fills the disk first. A
	// provider may ignore it; the broker checks SnapshotRef.Bytes anyway.
	MaxBytes int64
	// ExpiresAt is when the broker deletes the snapshot (its TTL); a
	// vendor with its own snapshot expiry deletes the contents then, even
	// without any broker process. Zero means no expiry was given.
	ExpiresAt time.Time
}

// SnapshotRef names stored snapshot contents.
type SnapshotRef struct {
	ID  string // the broker's snapshot id
	Ref string // the vendor's reference; "" when not known
	// Bytes is the size of the stored contents as the vendor counts it
	// (the local provider: its archive's size on disk); Snapshot sets it,
	// and the instance's max_snapshot_bytes quota adds it up. 0 when not
	// known.
	Bytes int64
}

// Commander runs durable commands: a command is launched once under a
// broker-chosen id, outlives the call that launched it and every broker
// process, and is read and canceled by that id. A provider that has no
// native way implements it with package runner over Exec.
type Commander interface {
	// StartCommand launches spec under id (a safe file name) and returns
	// once it runs or is recorded to run. spec.Timeout kills the command
	// and everything it started; spec.MaxOutputBytes caps each stream.
	// Returns ErrCommandFenced when a cancel of id came first,
	// ErrCommandNotStarted (or ErrSandboxGone) when it definitely did not
	// start; any other error leaves the outcome unknown. Starting an id
	// that was already launched succeeds without launching it again.
	StartCommand(ctx context.Context, sb Sandbox, id string, spec ExecSpec) error
	// ReadCommand returns the command's status, with at most maxOut bytes
	// of each stream. State CommandAbsent means id was never launched.
	ReadCommand(ctx context.Context, sb Sandbox, id string, maxOut int64) (CommandStatus, error)
	// CancelCommand fences a launch of id that has not happened yet and
	// kills the whole process group of a running one. A finished command
	// keeps its result. Idempotent.
	CancelCommand(ctx context.Context, sb Sandbox, id string) error
}

// CommandState is what a provider knows of a durable command.
type CommandState string

// Command states of a provider.
const (
	CommandAbsent    CommandState = ""          // never launched here (or fenced before it ran)
	CommandRunning   CommandState = "running"   // launched, not finished
	CommandCompleted CommandState = "completed" // ended by itself, or killed at its timeout
	CommandCanceled  CommandState = "canceled"  // killed by CancelCommand
)

// CommandStatus is a durable command's state and, once finished, its result.
type CommandStatus struct {
	State CommandState
	// ExitCode is the exit status, or 128+n when signal n killed it;
	// meaningful once completed or canceled.
	ExitCode        int
	TimedOut        bool
	Stdout, Stderr  []byte
	StdoutTruncated bool
	StderrTruncated bool
	// StdoutBytes and StderrBytes are the real totals the command wrote.
	StdoutBytes, StderrBytes int64
	// FinishedAt is when the command finished, once completed or canceled,
	// by the sandbox's clock; zero when the provider cannot tell.
	FinishedAt time.Time
}

// Env is what the host lends a provider.
type Env struct {
	Logger   *slog.Logger
	Clock    sandgate.Clock
	BrokerID string
	DataDir  string
	// Getenv reads the vendor's own environment variables (credentials,
	// endpoints); nil means os.Getenv. A missing credential is an error of
	// Open naming the variable.
	Getenv func(string) string
	// Transport wraps a vendor client's HTTP transport with the broker's
	// tracing (a span per vendor request, the caller's traceparent sent
	// along); nil means none. Use it through HTTPTransport.
	Transport func(base http.RoundTripper) http.RoundTripper
	// TracerProvider is the host's tracing, for a vendor's gRPC client
	// (telemetry.GRPCDialOptions); nil means none.
	TracerProvider trace.TracerProvider
	// VendorEgress is the broker's egress proxy as vendor guests reach
	// it; nil means none is configured, and a vendor provider then offers
	// egress [] only.
	VendorEgress *VendorEgress
	// GuestBinary is the path of the sandgate-guest agent that vendor
	// providers deliver into their guests (ReadGuestBinary).
	GuestBinary string
}

// BrokerLister is an optional interface of a Provider: it lists the
// sandboxes another broker id labelled (LabelBroker) on the same vendor
// account, as List does for this broker's. Gateways with their own broker
// ids share one store, and one leader's reaper sweeps for all of them:
// it ends the sandboxes of another gateway's creates nobody confirmed, and
// tells a running workspace whose sandbox the vendor no longer has only
// when every broker id's listing succeeded.
type BrokerLister interface {
	ListBroker(ctx context.Context, brokerID string) ([]Sandbox, error)
}

// AsBrokerLister returns p's BrokerLister, looking through wrappers that
// expose the provider inside with an Unwrap() Provider method (package
// telemetry's instrumented providers).
func AsBrokerLister(p Provider) (BrokerLister, bool) {
	for p != nil {
		if bl, ok := p.(BrokerLister); ok {
			return bl, true
		}
		u, ok := p.(interface{ Unwrap() Provider })
		if !ok {
			return nil, false
		}
		p = u.Unwrap()
	}
	return nil, false
}

// Checker is an optional interface of a Provider: a cheap check that the
// vendor answers and the credentials work. Readiness (GET /readyz) runs
// it on every provider that accepts new work; a provider without one is
// checked with List.
type Checker interface {
	Check(ctx context.Context) error
}

// HTTPTransport returns base (http.DefaultTransport when nil) wrapped
// with the host's tracing, if it lends any: every vendor HTTP client
// should use it.
func (e Env) HTTPTransport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	if e.Transport == nil {
		return base
	}
	return e.Transport(base)
}

// ReadFileBytes reads the file at path of sb through p.ReadFile into
// memory: for callers that want the whole file (tests, small files).
func ReadFileBytes(ctx context.Context, p Provider, sb Sandbox, path string, max int64) ([]byte, error) {
	var b bytes.Buffer
	if _, err := p.ReadFile(ctx, sb, path, max, &b); err != nil {
		return nil, err
	}
	if b.Len() == 0 {
		return []byte{}, nil
	}
	return b.Bytes(), nil
}

// WriteFileBytes replaces the file at path of sb with data through
// p.WriteFile.
func WriteFileBytes(ctx context.Context, p Provider, sb Sandbox, path string, data []byte) error {
	return p.WriteFile(ctx, sb, path, bytes.NewReader(data))
}

// ReadContent reads r to its end, for a provider that must hold a file's
// content whole before it replaces the file (WriteFile). When r tells an
// upper bound of its size (a SizeHint method, or the Len of a
// *bytes.Reader), the buffer is allocated once at that size, so that the
// content is never copied to grow.
func ReadContent(r io.Reader) ([]byte, error) {
	var hint int64
	switch h := r.(type) {
	case interface{ SizeHint() int64 }:
		hint = h.SizeHint()
	case interface{ Len() int }:
		hint = int64(h.Len())
	}
	if hint <= 0 || hint > 1<<30 {
		return io.ReadAll(r)
	}
	b := make([]byte, 0, hint+1) // one more: io.EOF is seen without growing
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // the hint was low: grow as append does
		}
	}
}
