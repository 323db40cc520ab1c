package local

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/sandgate/sandgate/providers/local/internal/step"
)

// On-disk layout of one workspace, under <DataDir>/workspaces/<ref>/. The
// directory is 0700 because env.json holds the workspace's environment.
//
//	labels.json   the broker's labels (providers.Label*); written first, so a
//	              half-created workspace is still listed and can be reaped
//	env.json      the workspace's Env, 0600; never logged
//	sandbox.json  size, start and deadline; written last, it marks the
//	              workspace ready (Exec on a workspace without it is gone)
//	disk.img      the workspace's ext4 image, DiskMiB, sparse (disk.go);
//	              it holds workspace/, home/ and tmp/, which each exec's
//	              step mounts at /workspace, /root and /tmp, and, for a
//	              workspace on an OCI image, rootfs/upper and rootfs/work,
//	              the root overlay's writable layer (image.go)
//	workspace/, home/, tmp/  the same, on the host, for a workspace without
//	              a disk quota (a host without mkfs.ext4, allowed by
//	              Config.AllowUnenforced)
//	lock          flock'ed: shared to launch a durable command, exclusive to
//	              cancel one or to terminate, across every broker process
//	egress/       for a workspace with allowed domains: egress.sock, the
//	              Unix socket of its proxy listener (0600, the workspace's
//	              uid), bound read-only into its sandboxes (egress.go)
//	commands/<id>/ one durable command: the runner's files (providers/runner),
//	              and host.pid, "<pid> <start time>" of its runner; never mounted
//
// <DataDir>/etc/ holds the generated /etc every sandbox mounts read-only,
// <DataDir>/trash/ holds terminated workspaces until they are removed, and
// <DataDir>/snapshots/<snapshot id>.tar.gz holds each snapshot's contents,
// <DataDir>/templates/ holds an empty disk image per size that each new
// image is copied from (disk.go), and <DataDir>/id names the data
// directory (see Provider.DataDirID).
const (
	workspacesDir = "workspaces"
	etcDir        = "etc"
	trashDir      = "trash"
	snapshotsDir  = "snapshots"
	idFile        = "id"
	uidsDir       = "uids" // uids/<uid> holds the ref of the workspace that has it
	templatesDir  = "templates"

	labelsFile  = "labels.json"
	envFile     = "env.json"
	sandboxFile = "sandbox.json"
	lockFile    = "lock"
	commandsDir = "commands"
	egressDir   = "egress"
	hostPIDFile = "host.pid"
	diskImage   = "disk.img"  // the workspace's ext4 image (disk.go)
	diskLock    = "disk.lock" // in DataDir: serialises the reserve check
)

// layout names the host directories of one workspace.
type layout string

func (l layout) labels() string    { return filepath.Join(string(l), labelsFile) }
func (l layout) env() string       { return filepath.Join(string(l), envFile) }
func (l layout) sandbox() string   { return filepath.Join(string(l), sandboxFile) }
func (l layout) workspace() string { return filepath.Join(string(l), "workspace") }
func (l layout) home() string      { return filepath.Join(string(l), "home") }
func (l layout) tmp() string       { return filepath.Join(string(l), "tmp") }
func (l layout) disk() string      { return filepath.Join(string(l), diskImage) }
func (l layout) lock() string      { return filepath.Join(string(l), lockFile) }
func (l layout) commands() string  { return filepath.Join(string(l), commandsDir) }
func (l layout) egress() string    { return filepath.Join(string(l), egressDir) }

// execs holds one file per exec in flight, named by its process group and
// holding its start time, so that a Terminate in any broker process can
// kill execs another one started.
func (l layout) execs() string { return filepath.Join(string(l), "execs") }
func (l layout) command(id string) string {
	return filepath.Join(string(l), commandsDir, id)
}

// makeDirs creates the directories the sandbox mounts.
func (l layout) makeDirs() error {
	for _, d := range []struct {
		path string
		mode fs.FileMode
	}{
		{l.workspace(), 0o755},
		{l.home(), 0o700},
		{l.tmp(), fs.ModeSticky | 0o777}, // os.Chmod reads the sticky bit from fs.ModeSticky only
	} {
		if err := os.Mkdir(d.path, d.mode); err != nil {
			return err
		}
		// Mkdir applies the umask and drops the sticky bit.
		if err := os.Chmod(d.path, d.mode); err != nil {
			return err
		}
	}
	return nil
}

// chown gives the directories the sandbox mounts to uid (and gid uid),
// the host ids of the sandbox's root.
func (l layout) chown(uid int) error {
	for _, d := range []string{l.workspace(), l.home(), l.tmp()} {
		if err := os.Chown(d, uid, uid); err != nil {
			return err
		}
	}
	return nil
}

// chownIf is chown, except for uid 0 (a broker that is not root).
func (l layout) chownIf(uid int) error {
	if uid == 0 {
		return nil
	}
	return l.chown(uid)
}

// record is sandbox.json: what Exec needs beyond the labels and the env.
type record struct {
	CPUCores  int       `json:"cpu_cores"`
	MemoryMiB int       `json:"memory_mib"`
	Pids      int       `json:"pids,omitempty"`     // the process cap; 0 in a workspace from before it
	UID       int       `json:"uid,omitempty"`      // the host uid and gid of the sandbox's uid 0; 0 in a workspace from before
	DiskMiB   int       `json:"disk_mib,omitempty"` // the disk image's size; 0: no disk quota
	CPUs      []int     `json:"cpus,omitempty"`     // the CPUs it is pinned to (placement.go); none in a workspace from before
	StartedAt time.Time `json:"started_at"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// AllowedDomains is the workspace's egress allowlist; empty: no
	// network at all (egress.go).
	AllowedDomains []string `json:"allowed_domains,omitempty"`
	// Account is the workspace's account, so that the egress proxy can
	// record its bytes as they come; "" in a workspace from before it (its
	// bytes are counted at its end only).
	Account string `json:"account,omitempty"`
	// Image is the OCI image the workspace runs on, its digest included;
	// nil: the host's /usr ([Image]).
	Image *imageRecord `json:"image,omitempty"`
}

// readJSON decodes the JSON file at name into v.
func readJSON(name string, v any) error {
	b, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// replaceJSON writes v to name by a rename of a temporary file (named
// with prefix, in the same directory), so a reader sees the old or the
// new contents, never a part.
func replaceJSON(name, prefix string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(name), prefix)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	err = errors.Join(err, f.Chmod(0o644), f.Close())
	if err == nil {
		err = os.Rename(f.Name(), name)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// writeJSON creates the file at name, which must not exist, holding v
// (through a spare file when one is ready: spares.go).
func (p *Provider) writeJSON(name string, v any, mode fs.FileMode) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := p.spare.write(name, b, mode, true); !errors.Is(err, errNoSpare) {
		return err
	}
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	return errors.Join(err, f.Close())
}

// checkRef reports whether ref can name a workspace directory: the
// protocol's id alphabet, which is a safe path segment, and no leading dot,
// which keeps refs apart from our own temporary names.
func checkRef(ref string) error {
	if len(ref) == 0 || len(ref) > 64 || ref[0] == '.' {
		return errBadRef
	}
	for _, c := range []byte(ref) {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-', c == '.':
		default:
			return errBadRef
		}
	}
	return nil
}

var errBadRef = errors.New("local: workspace id is not a safe directory name")

// scrub drops the host path from a file-system error (step.Scrub): errors
// must never carry paths.
func scrub(err error) error { return step.Scrub(err) }

// removeAll removes dir and everything in it. A sandboxed process may have
// left directories without write or search permission, which stop
// os.RemoveAll for a broker that does not run as root; it makes them
// writable and tries again.
func removeAll(dir string) error {
	if os.RemoveAll(dir) == nil {
		return nil
	}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if d != nil && d.IsDir() {
			os.Chmod(p, 0o700) // best effort; RemoveAll below reports what is left
		}
		return nil
	})
	return scrub(os.RemoveAll(dir))
}

// The generated /etc: just enough for the tools to know root, resolve
// localhost and the sandbox's own name; nothing of the host's /etc.
const hostname = "sandbox"

var etcFiles = map[string]string{
	"passwd": "root:x:0:0:root:/root:/bin/sh\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
	"group": "root:x:0:\n" +
		"nogroup:x:65534:\n",
	"hosts": "127.0.0.1\tlocalhost\n" +
		"127.0.1.1\t" + hostname + "\n" +
		"::1\tlocalhost ip6-localhost ip6-loopback\n",
	"nsswitch.conf": "passwd: files\n" +
		"group: files\n" +
		"hosts: files\n",
}

// writeEtc (re)writes the generated /etc in dir. Each file is replaced by a
// rename, so a sandbox running meanwhile sees the old or the new file.
func writeEtc(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, content := range etcFiles {
		f, err := os.CreateTemp(dir, ".tmp-")
		if err != nil {
			return err
		}
		_, err = f.WriteString(content)
		err = errors.Join(err, f.Chmod(0o644), f.Close())
		if err == nil {
			err = os.Rename(f.Name(), filepath.Join(dir, name))
		}
		if err != nil {
			os.Remove(f.Name())
			return err
		}
	}
	return nil
}
