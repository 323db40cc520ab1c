package sandgate

import "time"

// SnapshotState is the life of one snapshot.
type SnapshotState string

// Snapshot states.
const (
	// SnapshotCreating: the provider is storing the contents; the snapshot
	// holds a quota slot until a pending deadline.
	SnapshotCreating SnapshotState = "creating"
	// SnapshotLive: usable for a warm start until ExpiresAt.
	SnapshotLive SnapshotState = "live"
	// SnapshotDeleting: deleted by the client or expired; the broker keeps
	// asking the provider to delete the contents until it confirms.
	SnapshotDeleting SnapshotState = "deleting"
	// SnapshotDeleted: the provider confirmed the deletion; only a
	// tombstone is left, so the id still answers 410 rather than 404.
	SnapshotDeleted SnapshotState = "deleted"
)

// Snapshot is a stored copy of one directory of a workspace, owned by an
// instance, from which a new workspace can start.
type Snapshot struct {
	ID          string
	AccountID   string
	InstanceID  string
	WorkspaceID string // the workspace it was taken from
	// Provider is the name of the configured provider that holds the
	// contents ("" on older records: "local"). A warm start needs a
	// workspace on the same provider.
	Provider    string
	ProviderRef string // the vendor's reference; never shown to the client
	// Dir is the directory the snapshot holds, restored at the same path.
	// It is the one path the broker persists (spec §Trust model): never
	// logged or returned, and cleared once the contents are deleted.
	Dir       string
	State     SnapshotState
	CreatedAt time.Time
	ExpiresAt time.Time // CreatedAt + the scope's SnapshotTTL
	DeletedAt time.Time // zero until deleted or expired
	// Bytes is the size of the stored contents as the provider reported
	// it, counted against the scope's MaxSnapshotBytes; 0 until live.
	Bytes int64
	// Size is the size of the workspace it was taken from ("" on older
	// records): a warm start restores it only into a size whose disk is
	// at least as large.
	Size string
}

// UsableAt reports whether a workspace can start from the snapshot at now:
// it is live and not past ExpiresAt.
func (s Snapshot) UsableAt(now time.Time) bool {
	return s.State == SnapshotLive && now.Before(s.ExpiresAt)
}
