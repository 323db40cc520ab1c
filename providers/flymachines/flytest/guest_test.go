package flytest_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/providers/flymachines/flytest"
)

const token = "fm2_guest-test"

// api is a raw client of the fake.
type api struct {
	t *testing.T
	s *flytest.Server
}

func start(t *testing.T) api {
	t.Helper()
	s, err := flytest.New(t.Context(), flytest.Options{Token: token, DataDir: t.TempDir()})
	if err != nil {
		t.Fatalf("flytest.New: %v", err)
	}
	t.Cleanup(s.Close)
	s.CreateApp("guest-app", "personal")
	return api{t, s}
}

func (a api) call(method, path string, body any, out any) int {
	a.t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, _ := http.NewRequestWithContext(a.t.Context(), method, a.s.URL()+path, rd)
	req.Header.Set("Authorization", "FlyV1 "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: a.s.Transport()}).Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if out != nil {
		json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// machine creates a Machine with config cfg (image filled in) and waits
// until it has started.
func (a api) machine(cfg map[string]any) string {
	a.t.Helper()
	cfg["image"] = "registry.example/library/ubuntu:24.04"
	var m struct{ ID string }
	if st := a.call("POST", "/v1/apps/guest-app/machines", map[string]any{"config": cfg}, &m); st != http.StatusOK {
		a.t.Fatalf("create machine: status %d", st)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, _ := a.s.Machine(m.ID)
		if got.State == "started" {
			return m.ID
		}
		if time.Now().After(deadline) || got.State == "stopped" || got.State == "destroyed" || got.State == "failed" {
			a.t.Fatalf("machine %s did not start: %s", m.ID, got.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type execResult struct {
	Stdout, Stderr string
	ExitCode       int `json:"exit_code"`
}

func (a api) exec(id string, argv ...string) execResult {
	a.t.Helper()
	var r execResult
	if st := a.call("POST", "/v1/apps/guest-app/machines/"+id+"/exec", map[string]any{"command": argv, "timeout": 60}, &r); st != http.StatusOK {
		a.t.Fatalf("exec %q: status %d", argv, st)
	}
	return r
}

// A Machine's guest is one VM: an exec sees the Machine's main process
// (its init) and, as the VM's root, can stop it: nothing but a jail of
// the broker's own keeps a tenant from doing so.
func TestGuestSharesOnePIDNamespace(t *testing.T) {
	a := start(t)
	id := a.machine(map[string]any{"init": map[string]any{"exec": []string{"sleep", "987654"}}})
	r := a.exec(id, "sh", "-c", `ps ax -o pid=,args= | while read -r pid args; do [ "$args" = "sleep 987654" ] && echo $pid; done; true`)
	if r.ExitCode != 0 || r.Stdout == "" {
		t.Fatalf("ps ax does not show the main process: exit %d, %q %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	pid := strings.Fields(r.Stdout)[0]
	r = a.exec(id, "sh", "-c", "kill -STOP "+pid+" && sleep 0.2 && ps -o stat= -p "+pid+" && kill -CONT "+pid)
	if r.ExitCode != 0 || !strings.HasPrefix(strings.TrimSpace(r.Stdout), "T") {
		t.Fatalf("kill -STOP of the main process: exit %d, %q %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	// A process an exec leaves behind is seen by the next one.
	a.exec(id, "sh", "-c", "setsid sleep 876543 </dev/null >/dev/null 2>&1 &")
	if r := a.exec(id, "sh", "-c", "ps -eo args= | grep -q '[s]leep 876543'"); r.ExitCode != 0 {
		t.Fatalf("a later exec does not see an earlier exec's process: %q", r.Stderr)
	}
	// And the guest's root may create namespaces, as a VM's root can.
	if r := a.exec(id, "unshare", "--pid", "--fork", "--mount-proc", "--net", "--mount", "--uts", "--ipc", "true"); r.ExitCode != 0 {
		t.Fatalf("the guest's root cannot create namespaces: exit %d, %q", r.ExitCode, r.Stderr)
	}
}

// A guest has the host's network, as a real Machine has the internet: it
// reaches a listener on the host's loopback.
func TestGuestReachesHostLoopback(t *testing.T) {
	a := start(t)
	c := flytest.StartCanary(t)
	id := a.machine(map[string]any{})
	r := a.exec(id, "curl", "-sS", "--max-time", "30", "http://"+c.Addr()+"/")
	if r.ExitCode != 0 || r.Stdout != "sandgate-canary" {
		t.Fatalf("curl to the canary: exit %d, %q %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	if c.Hits() != 1 {
		t.Fatalf("canary hits = %d, want 1", c.Hits())
	}
}

// Every exec carries Fly's runtime environment, and the hostname is the
// Machine's id.
func TestGuestFlyEnvironment(t *testing.T) {
	a := start(t)
	id := a.machine(map[string]any{"env": map[string]string{"WS": "7f3a"}, "guest": map[string]any{"cpu_kind": "shared", "cpus": 1, "memory_mb": 512}})
	r := a.exec(id, "env")
	env := map[string]string{}
	for l := range strings.Lines(r.Stdout) {
		k, v, _ := strings.Cut(strings.TrimSuffix(l, "\n"), "=")
		env[k] = v
	}
	m, _ := a.s.Machine(id)
	want := map[string]string{
		"FLY_MACHINE_ID": id, "FLY_ALLOC_ID": id, "FLY_APP_NAME": "guest-app", "FLY_REGION": m.Region,
		"FLY_IMAGE_REF": "registry.example/library/ubuntu:24.04", "FLY_PRIVATE_IP": "fdaa::1",
		"FLY_MACHINE_VERSION": m.InstanceID, "FLY_VM_MEMORY_MB": "512", "WS": "7f3a",
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s = %q, want %q", k, env[k], v)
		}
	}
	if r := a.exec(id, "hostname"); strings.TrimSpace(r.Stdout) != id {
		t.Errorf("hostname = %q, want %q", r.Stdout, id)
	}
}

// config.files are in the guest at boot, before init runs, with their
// mode; the fake keeps them field by field.
func TestGuestFiles(t *testing.T) {
	a := start(t)
	secret := "c2VjcmV0Cg=="
	id := a.machine(map[string]any{
		"init": map[string]any{"exec": []string{"sh", "-c", "cat /etc/ws/token >/tmp/seen-at-boot; exec sleep 1000000"}},
		"files": []map[string]any{
			{"guest_path": "/etc/ws/token", "raw_value": secret, "mode": 0o600},
			{"guest_path": "/opt/app/run.sh", "raw_value": base64.StdEncoding.EncodeToString([]byte("#!/bin/sh\necho ran\n")), "mode": 0o755},
		},
	})
	r := a.exec(id, "sh", "-c", "stat -c '%a %U' /etc/ws/token /opt/app/run.sh && cat /etc/ws/token /tmp/seen-at-boot && /opt/app/run.sh")
	if want := "600 root\n755 root\nsecret\nsecret\nran\n"; r.Stdout != want || r.ExitCode != 0 {
		t.Fatalf("files in the guest: exit %d, %q (stderr %q), want %q", r.ExitCode, r.Stdout, r.Stderr, want)
	}
	m, _ := a.s.Machine(id)
	if len(m.Config.Files) != 2 || m.Config.Files[0].GuestPath != "/etc/ws/token" || *m.Config.Files[0].RawValue != secret || m.Config.Files[0].Mode != 0o600 {
		t.Fatalf("recorded files = %+v", m.Config.Files)
	}
	for name, f := range map[string]map[string]any{
		"relative path": {"guest_path": "etc/x", "raw_value": secret},
		"not base64":    {"guest_path": "/etc/x", "raw_value": "not base64!"},
		"secret":        {"guest_path": "/etc/x", "secret_name": "TOKEN"},
		"image config":  {"guest_path": "/etc/x", "image_config": "x"},
		"no value":      {"guest_path": "/etc/x"},
	} {
		cfg := map[string]any{"image": "x", "files": []map[string]any{f}}
		if st := a.call("POST", "/v1/apps/guest-app/machines", map[string]any{"config": cfg}, nil); st != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", name, st)
		}
	}
}

// The guest's root writes /etc and /var/lib as on a VM's own file
// system: a later exec sees the files; the host's /etc never changes.
func TestGuestRootWritesPersist(t *testing.T) {
	a := start(t)
	id := a.machine(map[string]any{})
	name := "sandgate-guest-test-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if r := a.exec(id, "sh", "-c", "echo pkg >/etc/"+name+" && mkdir -p /var/lib/"+name+" && echo db >/var/lib/"+name+"/x && echo bin >/usr/local/bin/"+name); r.ExitCode != 0 {
		t.Fatalf("root writes: exit %d, %q", r.ExitCode, r.Stderr)
	}
	if r := a.exec(id, "cat", "/etc/"+name, "/var/lib/"+name+"/x", "/usr/local/bin/"+name); r.Stdout != "pkg\ndb\nbin\n" {
		t.Fatalf("a later exec reads %q (stderr %q)", r.Stdout, r.Stderr)
	}
	for _, p := range []string{"/etc/" + name, "/usr/local/bin/" + name} {
		if _, err := os.Stat(p); err == nil {
			t.Fatalf("the guest's write reached the host's %s", p)
		}
	}
}
