package sandgate

import "time"

// CommandState is the life of one durable command, as the protocol reports it.
type CommandState string

// Durable command states. Unknown is never stored: it is the answer for an
// identity that was never claimed.
const (
	CommandStarting  CommandState = "starting"
	CommandRunning   CommandState = "running"
	CommandCompleted CommandState = "completed"
	CommandCanceled  CommandState = "canceled"
	CommandUnknown   CommandState = "unknown"
)

// Finished reports whether the state is final.
func (s CommandState) Finished() bool { return s == CommandCompleted || s == CommandCanceled }

// Command is one durable command of a workspace, claimed once by its
// identity. Its argv, stdin and output are never part of it: they live only
// in the sandbox.
type Command struct {
	WorkspaceID string
	// Key is the hex SHA-256 of the client's identity; it names the
	// command's records in the store and in the sandbox.
	Key   string
	State CommandState
	// Launched is set once the provider confirmed the launch.
	Launched bool
	// Canceled is set once a cancel was asked for, launched or not.
	Canceled bool
	// ExitCode is meaningful when HasExit is set: the command's exit
	// status, or 128+n when signal n killed it.
	ExitCode int
	HasExit  bool
	TimedOut bool
	// ClaimedAt is when the identity was claimed; DispatchBy is the
	// deadline by which its launch must be confirmed, after which a
	// launch whose outcome was never learned is fenced.
	ClaimedAt  time.Time
	DispatchBy time.Time
	// Deadline is when the command is killed at the latest: its clamped
	// timeout from the claim.
	Deadline   time.Time
	FinishedAt time.Time
}
