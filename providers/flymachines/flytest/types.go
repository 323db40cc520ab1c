package flytest

import "encoding/json"

// The fake's own copies of the vendor's request shapes, from the fact
// sheet, decoded strictly: a field the sheet does not name is a 400, so a
// client that invents one fails against the fake. Fields the fake does
// not act on are kept raw.

type createAppRequest struct {
	Name             string `json:"name"`
	OrgSlug          string `json:"org_slug"`
	Network          string `json:"network,omitempty"`
	EnableSubdomains bool   `json:"enable_subdomains,omitempty"`
	IdempotencyKey   string `json:"idempotency_key,omitempty"`
	AppRoleID        string `json:"app_role_id,omitempty"`
}

type createMachineRequest struct {
	Config                  json.RawMessage `json:"config"`
	Name                    string          `json:"name,omitempty"`
	Region                  string          `json:"region,omitempty"`
	SkipLaunch              bool            `json:"skip_launch,omitempty"`
	SkipServiceRegistration bool            `json:"skip_service_registration,omitempty"`
	LeaseTTL                int             `json:"lease_ttl,omitempty"`
	LSVD                    bool            `json:"lsvd,omitempty"`
	SkipSecrets             bool            `json:"skip_secrets,omitempty"`
	MinSecretsVersion       json.RawMessage `json:"min_secrets_version,omitempty"`
}

// metadataRequest is the body of the bulk metadata PATCH.
type metadataRequest struct {
	Metadata       map[string]*string `json:"metadata"`
	MachineVersion string             `json:"machine_version,omitempty"`
	UpdatedAt      string             `json:"updated_at,omitempty"`
}

// MachineConfig is a Machine's config as the fake decodes it.
type MachineConfig struct {
	Image       string            `json:"image"`
	Guest       *Guest            `json:"guest,omitempty"`
	Init        *Init             `json:"init,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	AutoDestroy bool              `json:"auto_destroy,omitempty"`
	Restart     *Restart          `json:"restart,omitempty"`
	StopConfig  *struct {
		Signal  string `json:"signal,omitempty"`
		Timeout string `json:"timeout,omitempty"` // a duration string, e.g. "10s"
	} `json:"stop_config,omitempty"`
	Files      []File          `json:"files,omitempty"`
	Services   json.RawMessage `json:"services,omitempty"`
	Checks     json.RawMessage `json:"checks,omitempty"`
	Mounts     json.RawMessage `json:"mounts,omitempty"`
	DNS        json.RawMessage `json:"dns,omitempty"`
	Processes  json.RawMessage `json:"processes,omitempty"`
	Schedule   string          `json:"schedule,omitempty"`
	Rootfs     json.RawMessage `json:"rootfs,omitempty"`
	Containers json.RawMessage `json:"containers,omitempty"`
	Standbys   json.RawMessage `json:"standbys,omitempty"`
}

// File is one of config.files, written into the guest at boot: exactly
// one of RawValue (base64), SecretName and ImageConfig; Mode is the
// file's permission bits (decimal in JSON, e.g. 384 for 0600).
type File struct {
	GuestPath   string  `json:"guest_path"`
	RawValue    *string `json:"raw_value,omitempty"`
	SecretName  *string `json:"secret_name,omitempty"`
	ImageConfig *string `json:"image_config,omitempty"`
	Mode        uint32  `json:"mode,omitempty"`
}

// Guest is a Machine's CPU and memory.
type Guest struct {
	CPUKind  string `json:"cpu_kind"`
	CPUs     int    `json:"cpus"`
	MemoryMB int    `json:"memory_mb"`
	GPUKind  string `json:"gpu_kind,omitempty"`
	GPUs     int    `json:"gpus,omitempty"`
}

// Init replaces the image's entrypoint and command.
type Init struct {
	Exec       []string `json:"exec,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// Restart is a Machine's restart policy.
type Restart struct {
	Policy     string `json:"policy"`
	MaxRetries int    `json:"max_retries,omitempty"`
}

type execRequest struct {
	Command   []string `json:"command,omitempty"`
	Cmd       string   `json:"cmd,omitempty"`
	Stdin     string   `json:"stdin,omitempty"`
	Timeout   int      `json:"timeout,omitempty"`
	Container string   `json:"container,omitempty"`
	Machine   bool     `json:"machine,omitempty"`
}

type execResponse struct {
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	ExitCode   int    `json:"exit_code"`
	ExitSignal int    `json:"exit_signal"`
}

type errorResponse struct {
	Error  string `json:"error"`
	Status string `json:"status,omitempty"`
}

// NetworkPolicy is an app's network policy as the fake keeps it.
type NetworkPolicy struct {
	ID       string `json:"id,omitempty"`
	Name     string `json:"name"`
	Selector struct {
		All      bool `json:"all,omitempty"`
		Machines []struct {
			ID string `json:"id"`
		} `json:"machines,omitempty"`
		Metadata map[string]string `json:"metadata,omitempty"`
	} `json:"selector"`
	Rules []struct {
		Action    string `json:"action"`
		Direction string `json:"direction"`
		Ports     []struct {
			Protocol string `json:"protocol"`
			Port     int    `json:"port"`
		} `json:"ports"`
	} `json:"rules"`
}

type machineJSON struct {
	ID         string          `json:"id"`
	Name       string          `json:"name"`
	State      string          `json:"state"`
	Region     string          `json:"region"`
	InstanceID string          `json:"instance_id"`
	PrivateIP  string          `json:"private_ip"`
	Config     json.RawMessage `json:"config,omitempty"`
	HostStatus string          `json:"host_status"`
	Events     []eventJSON     `json:"events,omitempty"`
	CreatedAt  string          `json:"created_at"`
	UpdatedAt  string          `json:"updated_at"`
}

type eventJSON struct {
	ID        string         `json:"id"`
	Type      string         `json:"type"`
	Status    string         `json:"status"`
	Source    string         `json:"source"`
	Timestamp int64          `json:"timestamp"`
	Request   map[string]any `json:"request,omitempty"`
}
