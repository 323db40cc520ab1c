package sandgate

import "log/slog"

// Log attribute keys. Only ids, counts, sizes and codes are ever logged;
// never argv, env values, stdin, output, paths, file contents or tokens.
const (
	KeyRequestID   = "request_id"
	KeyWorkspaceID = "workspace_id"
	KeySnapshotID  = "snapshot_id"
	KeyInstanceID  = "instance_id"
	KeyAccountID   = "account_id"
	KeyLeaseID     = "lease_id"
	KeyCode        = "code"
	KeyStatus      = "status"
	KeyError       = "err"
	KeyProvider    = "provider"
	// KeyHost and KeyPort name a destination the egress proxy refused
	// (policy, not content: never a URL path), KeyReason why.
	KeyHost   = "host"
	KeyPort   = "port"
	KeyReason = "reason"
)

// WorkspaceAttr is the log attribute of a workspace id.
func WorkspaceAttr(id string) slog.Attr { return slog.String(KeyWorkspaceID, id) }

// SnapshotAttr is the log attribute of a snapshot id.
func SnapshotAttr(id string) slog.Attr { return slog.String(KeySnapshotID, id) }

// InstanceAttr is the log attribute of an instance id.
func InstanceAttr(id string) slog.Attr { return slog.String(KeyInstanceID, id) }
