package flymachines

import "encoding/json"

// The vendor's JSON shapes, with exactly the field names and types of the
// Machines API fact sheet (/work/shared/reference/fly-machines.md). Only the
// fields the provider sends or reads are declared; decoding is lenient, so
// unknown fields of a response are ignored.

// CreateAppRequest is the body of POST /v1/apps (sheet §1.2).
type CreateAppRequest struct {
	Name    string `json:"name"`
	OrgSlug string `json:"org_slug"`
	// IdempotencyKey makes a retry of this exact request safe: one fresh
	// key per logical create, reused on its retries.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// CreateMachineRequest is the body of POST /v1/apps/{app}/machines (§1.3).
// Region belongs at the top level, not in the config.
type CreateMachineRequest struct {
	Config                  MachineConfig `json:"config"`
	Region                  string        `json:"region,omitempty"`
	SkipServiceRegistration bool          `json:"skip_service_registration,omitempty"`
	// SkipLaunch creates the Machine without booting it (a warm one).
	SkipLaunch bool `json:"skip_launch,omitempty"`
}

// MetadataRequest is the body of the bulk metadata update, PATCH
// /v1/apps/{app}/machines/{id}/metadata (§1.3): a "" value removes its
// key; a MachineVersion that is not the Machine's is answered 412.
type MetadataRequest struct {
	Metadata       map[string]string `json:"metadata"`
	MachineVersion string            `json:"machine_version,omitempty"`
}

// MachineConfig is a Machine's config (§1.3).
type MachineConfig struct {
	Image       string            `json:"image"`
	Guest       *Guest            `json:"guest,omitempty"`
	Init        *Init             `json:"init,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	AutoDestroy bool              `json:"auto_destroy,omitempty"`
	Restart     *Restart          `json:"restart,omitempty"`
	Files       []File            `json:"files,omitempty"`
}

// File is one of a Machine's config.files, written at boot (§1.3):
// guest_path absolute, raw_value base64, mode an integer.
type File struct {
	GuestPath string `json:"guest_path"`
	RawValue  string `json:"raw_value,omitempty"`
	Mode      int    `json:"mode,omitempty"`
}

// Guest is a Machine's CPU and memory (§1.9).
type Guest struct {
	CPUKind  string `json:"cpu_kind"`
	CPUs     int    `json:"cpus"`
	MemoryMB int    `json:"memory_mb"`
}

// Init replaces the image's entrypoint and command.
type Init struct {
	Exec []string `json:"exec,omitempty"`
}

// Restart is a Machine's restart policy: "no" is the only one auto_destroy
// works with (§1.10).
type Restart struct {
	Policy string `json:"policy"`
}

// Machine is the vendor's Machine as the provider reads it (§1.3).
type Machine struct {
	ID         string         `json:"id"`
	Name       string         `json:"name,omitempty"`
	State      string         `json:"state"`
	Region     string         `json:"region,omitempty"`
	InstanceID string         `json:"instance_id,omitempty"`
	Config     *MachineConfig `json:"config,omitempty"`
	// IncompleteConfig replaces Config when HostStatus is not "ok".
	IncompleteConfig *MachineConfig `json:"incomplete_config,omitempty"`
	HostStatus       string         `json:"host_status,omitempty"`
	Events           []MachineEvent `json:"events,omitempty"`
	CreatedAt        string         `json:"created_at,omitempty"`
	UpdatedAt        string         `json:"updated_at,omitempty"`
}

// MachineEvent is one entry of a Machine's events; Request is untyped.
type MachineEvent struct {
	ID        string          `json:"id,omitempty"`
	Type      string          `json:"type"`
	Status    string          `json:"status"`
	Source    string          `json:"source,omitempty"`
	Timestamp int64           `json:"timestamp"` // milliseconds
	Request   json.RawMessage `json:"request,omitempty"`
}

// metadata returns the Machine's metadata, from whichever config it has.
func (m *Machine) metadata() map[string]string {
	switch {
	case m.Config != nil:
		return m.Config.Metadata
	case m.IncompleteConfig != nil:
		return m.IncompleteConfig.Metadata
	}
	return nil
}

// MachineList is the org-wide list's paginated shape (§1.3); the app list
// answers a bare array, and the provider decodes both.
type MachineList struct {
	Machines   []Machine `json:"machines"`
	NextCursor string    `json:"next_cursor"`
}

// WaitResponse is the 200 of GET .../wait (§1.6).
type WaitResponse struct {
	OK      bool   `json:"ok"`
	State   string `json:"state"`
	Version string `json:"version,omitempty"`
	EventID string `json:"event_id,omitempty"`
}

// ExecRequest is MachineExecRequest (§1.5): argv in Command (Cmd is
// deprecated and its splitting undocumented), the whole stdin as one
// string, Timeout in seconds.
type ExecRequest struct {
	Command []string `json:"command"`
	Stdin   string   `json:"stdin,omitempty"`
	Timeout int      `json:"timeout,omitempty"`
}

// ExecResponse is flydv1.ExecResponse (§1.5). Stdout and Stderr are JSON
// strings, so only valid UTF-8 survives them.
type ExecResponse struct {
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	ExitCode   int    `json:"exit_code"`
	ExitSignal int    `json:"exit_signal"`
}

// ErrorResponse is the vendor's error body (§1.8); some paths use Message
// instead of Error.
type ErrorResponse struct {
	Error   string `json:"error,omitempty"`
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
}

// NetworkPolicy is the body of POST /v1/apps/{app}/network_policies and an
// entry of its list (§1.11).
type NetworkPolicy struct {
	ID       string         `json:"id,omitempty"`
	Name     string         `json:"name"`
	Selector PolicySelector `json:"selector"`
	Rules    []PolicyRule   `json:"rules"`
}

// PolicySelector picks the Machines a policy applies to.
type PolicySelector struct {
	All      bool              `json:"all,omitempty"`
	Machines []PolicyMachine   `json:"machines,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// PolicyMachine names one Machine of a selector.
type PolicyMachine struct {
	ID string `json:"id"`
}

// PolicyRule allows traffic in one direction on some ports. The first rule
// in a direction makes that direction deny everything else.
type PolicyRule struct {
	Action    string       `json:"action"`
	Direction string       `json:"direction"`
	Ports     []PolicyPort `json:"ports"`
}

// PolicyPort is one protocol and port of a rule.
type PolicyPort struct {
	Protocol string `json:"protocol"`
	Port     int    `json:"port"`
}
