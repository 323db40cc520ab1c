// Package protocol is the wire format of the execution broker protocol v1:
// request and response bodies, error codes and the error envelope. It holds
// nothing else, so every room may import it.
package protocol

import "encoding/json"

// APIVersion is the informational api_version of GET /v1/lease.
const APIVersion = "execution-broker/v1"

// MaxBodyBytes is the request body limit after base64 (spec §Conventions).
const MaxBodyBytes = 12 << 20

// Header names used by the protocol.
const (
	HeaderRequestID      = "X-Request-Id"
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderMeshVersion    = "Mesh-Version"
	HeaderRetryAfter     = "Retry-After"
)

// LeaseResponse is the body of GET /v1/lease.
type LeaseResponse struct {
	APIVersion   string       `json:"api_version"`
	Lease        LeaseInfo    `json:"lease"`
	Admission    Admission    `json:"admission"`
	Capabilities Capabilities `json:"capabilities"`
	Limits       Limits       `json:"limits"`
	Sizes        []Size       `json:"sizes"`
	DefaultSize  string       `json:"default_size"`
	Images       Images       `json:"images"`
	Egress       EgressInfo   `json:"egress"`
}

// LeaseInfo is the lease object of GET /v1/lease.
type LeaseInfo struct {
	ID           string  `json:"id"`
	InstanceID   string  `json:"instance_id"`
	State        string  `json:"state"`
	ExpiresAt    *string `json:"expires_at"`
	SupersededAt *string `json:"superseded_at"`
}

// Admission is the admission state of GET /v1/lease.
type Admission struct {
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
}

// Admission states.
const (
	AdmissionOpen             = "open"
	AdmissionPaused           = "paused"
	AdmissionEmergencyStopped = "emergency_stopped"
)

// Capabilities are fixed in v1.
type Capabilities struct {
	Shell           bool `json:"shell"`
	EgressControl   bool `json:"egress_control"`
	Resumable       bool `json:"resumable"`
	IdlePersistence bool `json:"idle_persistence"`
	Snapshots       bool `json:"snapshots"`
	DurableCommands bool `json:"durable_commands"`
}

// V1Capabilities is the capability set every v1 broker reports.
var V1Capabilities = Capabilities{Shell: true, EgressControl: true, Snapshots: true, DurableCommands: true}

// Limits is the limits object of GET /v1/lease.
type Limits struct {
	MaxConcurrentWorkspaces   int   `json:"max_concurrent_workspaces"`
	MaxLifetimeSeconds        int64 `json:"max_lifetime_seconds"`
	IdleTimeoutSeconds        int64 `json:"idle_timeout_seconds"`
	MaxExecTimeoutSeconds     int64 `json:"max_exec_timeout_seconds"`
	DefaultExecTimeoutSeconds int64 `json:"default_exec_timeout_seconds"`
	MaxSnapshots              int   `json:"max_snapshots"`
	// MaxSnapshotBytes is sandgate's own optional field: the bytes the
	// instance's live snapshots may hold together.
	MaxSnapshotBytes   int64 `json:"max_snapshot_bytes,omitempty"`
	SnapshotTTLSeconds int64 `json:"snapshot_ttl_seconds"`
	MaxFileBytes       int64 `json:"max_file_bytes"`
	MaxOutputBytes     int64 `json:"max_output_bytes"`
	MaxEnvEntries      int   `json:"max_env_entries"`
	MaxEgressDomains   int   `json:"max_egress_domains"`
}

// Size is one entry of the lease's sizes.
type Size struct {
	Name      string `json:"name"`
	CPUCores  int    `json:"cpu_cores"`
	MemoryMiB int    `json:"memory_mib"`
	DiskMiB   int    `json:"disk_mib,omitempty"` // the disk quota, where the provider has one
}

// Images is the images object of GET /v1/lease.
type Images struct {
	Default string   `json:"default"`
	Allowed []string `json:"allowed"`
}

// EgressInfo is the egress object of GET /v1/lease. A nil Ceiling encodes
// as null: any valid domain.
type EgressInfo struct {
	Ceiling []string `json:"ceiling"`
}

// AcquireRequest is the body of POST /v1/workspaces. A field tagged
// wire:"nonempty" is optional, but its grammar needs at least one
// character: the gateway refuses it sent as "" or null (omit it instead).
type AcquireRequest struct {
	Label      string            `json:"label"`
	Size       string            `json:"size,omitempty" wire:"nonempty"`
	Image      string            `json:"image,omitempty" wire:"nonempty"`
	Env        map[string]string `json:"env,omitempty"`
	Egress     *Egress           `json:"egress"`
	SnapshotID string            `json:"snapshot_id,omitempty" wire:"nonempty"`
	Agent      string            `json:"agent,omitempty" wire:"nonempty"`
	RunID      string            `json:"run_id,omitempty" wire:"nonempty"`
}

// Egress is the egress object of an Acquire. A nil AllowedDomains is
// treated as missing.
type Egress struct {
	AllowedDomains []string `json:"allowed_domains"`
}

// Workspace is the status object of a workspace. Acquire answers it with
// image and idle_timeout_seconds; every status read carries the termination
// fields.
type Workspace struct {
	WorkspaceID        string  `json:"workspace_id"`
	State              string  `json:"state"`
	Size               string  `json:"size"`
	Image              string  `json:"image,omitempty"`
	CreatedAt          string  `json:"created_at"`
	ExpiresAt          string  `json:"expires_at"`
	IdleTimeoutSeconds int64   `json:"idle_timeout_seconds"`
	TerminatedAt       *string `json:"terminated_at"`
	TerminationReason  *string `json:"termination_reason"`
	MeteredSeconds     *int64  `json:"metered_seconds,omitempty"`
}

// WorkspaceList is the body of GET /v1/workspaces.
type WorkspaceList struct {
	Workspaces []Workspace `json:"workspaces"`
	NextCursor *string     `json:"next_cursor"`
}

// ExecRequest is the body of POST …/exec, and of a durable command.
type ExecRequest struct {
	Argv           []string `json:"argv"`
	Dir            string   `json:"dir,omitempty"`
	StdinB64       string   `json:"stdin_b64,omitempty"`
	TimeoutSeconds int64    `json:"timeout_seconds,omitempty"`
}

// ExecResponse is the body of a 200 from POST …/exec. TimedOut and the byte
// counts are sandgate's own optional fields.
type ExecResponse struct {
	ExitCode        int    `json:"exit_code"`
	StdoutB64       string `json:"stdout_b64"`
	StderrB64       string `json:"stderr_b64"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	TimeoutClamped  bool   `json:"timeout_clamped"`
	TimedOut        bool   `json:"timed_out"`
	StdoutBytes     int64  `json:"stdout_bytes"`
	StderrBytes     int64  `json:"stderr_bytes"`
}

// ReadFileRequest is the body of POST …/files/read.
type ReadFileRequest struct {
	Path string `json:"path"`
}

// ReadFileResponse is the body of a 200 from POST …/files/read.
type ReadFileResponse struct {
	ContentsB64 string `json:"contents_b64"`
	SizeBytes   int64  `json:"size_bytes"`
}

// WriteFileRequest is the body of POST …/files/write.
type WriteFileRequest struct {
	Path        string `json:"path"`
	ContentsB64 string `json:"contents_b64"`
}

// SnapshotRequest is the body of POST …/snapshots.
type SnapshotRequest struct {
	Dir string `json:"dir"`
}

// Snapshot is the body of a 201 (or replayed 200) from POST …/snapshots.
// Times are RFC 3339 UTC strings; expires_at = created_at +
// snapshot_ttl_seconds.
type Snapshot struct {
	SnapshotID string `json:"snapshot_id"`
	CreatedAt  string `json:"created_at"`
	ExpiresAt  string `json:"expires_at"`
}

// Durable command states (spec §Durable commands). A client never reads a
// state not listed here as finished or as not started.
const (
	CommandStarting  = "starting"
	CommandRunning   = "running"
	CommandCompleted = "completed"
	CommandCanceled  = "canceled"
	CommandUnknown   = "unknown"
)

// CommandStatus is the body of PUT (202 or 200) and GET …/commands/{identity}.
// The exit fields are meaningful only for completed and canceled: they are
// all sent when ExitCode is set, and none otherwise, so an unknown identity
// answers exactly {"state":"unknown"}; ExitCode is nil when absent. TimedOut
// is sandgate's own optional field.
type CommandStatus struct {
	State           string `json:"state"`
	ExitCode        *int   `json:"exit_code,omitempty"`
	StdoutB64       string `json:"stdout_b64,omitempty"`
	StderrB64       string `json:"stderr_b64,omitempty"`
	OutputTruncated bool   `json:"output_truncated,omitempty"`
	StdoutBytes     int64  `json:"stdout_bytes,omitempty"`
	StderrBytes     int64  `json:"stderr_bytes,omitempty"`
	TimedOut        bool   `json:"timed_out,omitempty"`
}

// MarshalJSON sends the state alone, or with ExitCode set every exit field,
// empty output and zero counts included.
func (s CommandStatus) MarshalJSON() ([]byte, error) {
	if s.ExitCode == nil {
		return json.Marshal(struct {
			State string `json:"state"`
		}{s.State})
	}
	return json.Marshal(struct {
		State           string `json:"state"`
		ExitCode        int    `json:"exit_code"`
		StdoutB64       string `json:"stdout_b64"`
		StderrB64       string `json:"stderr_b64"`
		OutputTruncated bool   `json:"output_truncated"`
		StdoutBytes     int64  `json:"stdout_bytes"`
		StderrBytes     int64  `json:"stderr_bytes"`
		TimedOut        bool   `json:"timed_out"`
	}{s.State, *s.ExitCode, s.StdoutB64, s.StderrB64, s.OutputTruncated, s.StdoutBytes, s.StderrBytes, s.TimedOut})
}
