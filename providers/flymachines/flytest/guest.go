package flytest

import (
	"encoding/base64"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/providers/internal/fakeserver"
)

// A fake Machine's guest stands for a Firecracker VM (local.Config.GuestVM):
// one pid namespace for the main process and every exec, the host's
// network (reaching the host's loopback as a real guest reaches the
// internet), a root with every capability inside the guest, writable /usr,
// /etc and / (fakeserver.GuestBoot), Fly's runtime environment in the main
// process and every exec, the Machine's id as its hostname, and
// config.files written before init runs.

// filesDir is where the fake stages config.files for the boot script, in
// the guest's /tmp; the script installs them and removes it.
const filesDir = "/tmp/.flyfake-files"

// checkFiles refuses config.files the fake cannot write as Fly would: a
// guest_path that is not absolute, a raw_value that is not base64, and
// secret_name or image_config, which need app secrets and image
// configs the fake does not have.
func checkFiles(files []File) string {
	for _, f := range files {
		n := 0
		for _, v := range []*string{f.RawValue, f.SecretName, f.ImageConfig} {
			if v != nil {
				n++
			}
		}
		switch {
		case !path.IsAbs(f.GuestPath) || path.Clean(f.GuestPath) == "/":
			return "files: guest_path must be an absolute file path"
		case n != 1:
			return "files: exactly one of raw_value, secret_name and image_config is required"
		case f.SecretName != nil:
			return "files: secret_name: secret not found"
		case f.ImageConfig != nil:
			return "files: image_config is not supported"
		case f.Mode > 0o7777:
			return "files: mode out of range"
		}
		if _, err := base64.StdEncoding.DecodeString(*f.RawValue); err != nil {
			return "files: raw_value must be base64"
		}
	}
	return ""
}

// stageFiles writes m's config.files below tmp, the host directory of
// the guest's /tmp, and returns the script that installs them in the
// guest. A file with no mode gets 0644.
func stageFiles(tmp string, files []File) (string, error) {
	if len(files) == 0 {
		return "", nil
	}
	host := filepath.Join(tmp, filepath.Base(filesDir))
	if err := os.MkdirAll(host, 0o700); err != nil {
		return "", err
	}
	var b strings.Builder
	for i, f := range files {
		data, _ := base64.StdEncoding.DecodeString(*f.RawValue) // checkFiles checked it
		if err := os.WriteFile(filepath.Join(host, strconv.Itoa(i)), data, 0o600); err != nil {
			return "", err
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		fmt.Fprintf(&b, "install -D -m %04o %s/%d %s || exit 1\n", mode, filesDir, i, shellQuote(path.Clean(f.GuestPath)))
	}
	b.WriteString("rm -rf " + filesDir + "\n")
	return b.String(), nil
}

// bootScript is the main command's script before the agent's: the guest's
// writable file systems, its hostname, and its files.
func bootScript(m *Machine, files string) string {
	return fakeserver.GuestBoot + "hostname " + shellQuote(m.ID) + " || exit 1\n" + files
}

// flyEnv is the environment Fly gives a Machine's processes besides its
// config.env (docs: "The Machine Runtime Environment"): the vendor's own
// variables win over the config's.
func flyEnv(m *Machine, privateIP string) map[string]string {
	env := maps.Clone(m.Config.Env)
	if env == nil {
		env = map[string]string{}
	}
	mem := 256
	if m.Config.Guest != nil {
		mem = m.Config.Guest.MemoryMB
	}
	maps.Copy(env, map[string]string{
		"FLY_APP_NAME":        m.App,
		"FLY_MACHINE_ID":      m.ID,
		"FLY_ALLOC_ID":        m.ID,
		"FLY_REGION":          m.Region,
		"FLY_PUBLIC_IP":       "2a09:8280:1::1:" + m.ID[:4],
		"FLY_IMAGE_REF":       m.Config.Image,
		"FLY_MACHINE_VERSION": m.InstanceID,
		"FLY_PRIVATE_IP":      privateIP,
		"FLY_PROCESS_GROUP":   "app",
		"FLY_VM_MEMORY_MB":    strconv.Itoa(mem),
	})
	return env
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Canary is a TCP listener on the host's loopback that counts
// connections: a guest reaches it unless a jail keeps it off the network.
type Canary = fakeserver.Canary

// StartCanary starts a Canary for the test and stops it when the test ends.
func StartCanary(tb testing.TB) *Canary { return fakeserver.StartCanary(tb) }
