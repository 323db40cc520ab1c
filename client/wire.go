package client

// The wire types below belong in protocol/ and live here only until they
// move there; their JSON names are the spec's.

// SnapshotRequest is the body of POST /v1/workspaces/{id}/snapshots.
type SnapshotRequest struct {
	Dir string `json:"dir"`
}

// SnapshotInfo is the body of a 201 (or replayed 200) from POST
// /v1/workspaces/{id}/snapshots. Times are RFC 3339 UTC strings.
type SnapshotInfo struct {
	SnapshotID string `json:"snapshot_id"`
	CreatedAt  string `json:"created_at"`
	ExpiresAt  string `json:"expires_at"`
}

// Durable command states (spec §Durable commands). A state not listed here
// is never read as finished or as not started.
const (
	CommandStarting  = "starting"
	CommandRunning   = "running"
	CommandCompleted = "completed"
	CommandCanceled  = "canceled"
	CommandUnknown   = "unknown"
)

// CommandStatus is the body of PUT (202 or 200) and GET
// /v1/workspaces/{id}/commands/{identity}. The exit fields are meaningful only
// for completed and canceled, and are omitted otherwise, so a broker can
// answer exactly {"state":"unknown"}; ExitCode is nil when absent.
type CommandStatus struct {
	State           string `json:"state"`
	ExitCode        *int   `json:"exit_code,omitempty"`
	StdoutB64       string `json:"stdout_b64,omitempty"`
	StderrB64       string `json:"stderr_b64,omitempty"`
	OutputTruncated bool   `json:"output_truncated,omitempty"`
	StdoutBytes     int64  `json:"stdout_bytes,omitempty"`
	StderrBytes     int64  `json:"stderr_bytes,omitempty"`
}
