package spritetest_test

import (
	"bytes"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/providers/flysprites/spritetest"
)

// sprite creates a sprite called name on s.
func sprite(t *testing.T, s *spritetest.Server, name string) {
	t.Helper()
	if st := do(t, s, "POST", "/v1/sprites", "application/json", `{"name":"`+name+`"}`); st != http.StatusCreated {
		t.Fatalf("create: status %d", st)
	}
}

func do(t *testing.T, s *spritetest.Server, method, path, ctype, body string) int {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), method, s.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.Token())
	if body != "" || method == "PUT" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := s.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func run(t *testing.T, s *spritetest.Server, name string, argv ...string) (code int, stdout, stderr string) {
	t.Helper()
	res, err := s.Run(t.Context(), name, argv...)
	if err != nil {
		t.Fatalf("run %q: %v", argv, err)
	}
	return res.ExitCode, string(res.Stdout), string(res.Stderr)
}

// A sprite is one VM: a command sees the processes earlier commands left
// and, as the guest's root, may stop them and create namespaces.
func TestSpriteGuestSharesOnePIDNamespace(t *testing.T) {
	s := spritetest.Start(t)
	sprite(t, s, "pids")
	run(t, s, "pids", "sh", "-c", "setsid sleep 876543 </dev/null >/dev/null 2>&1 &")
	code, out, errb := run(t, s, "pids", "sh", "-c", `ps ax -o pid=,args= | while read -r pid args; do [ "$args" = "sleep 876543" ] && echo $pid; done; true`)
	if code != 0 || strings.TrimSpace(out) == "" {
		t.Fatalf("ps ax does not show an earlier command's process: %d %q %q", code, out, errb)
	}
	pid := strings.Fields(out)[0]
	if code, out, errb := run(t, s, "pids", "sh", "-c", "kill -STOP "+pid+" && sleep 0.2 && ps -o stat= -p "+pid); code != 0 || !strings.HasPrefix(strings.TrimSpace(out), "T") {
		t.Fatalf("kill -STOP: %d %q %q", code, out, errb)
	}
	if _, out, _ := run(t, s, "pids", "hostname"); out != "pids\n" {
		t.Errorf("hostname = %q, want the sprite's name", out)
	}
	if code, _, errb := run(t, s, "pids", "unshare", "--pid", "--fork", "--mount-proc", "--net", "--mount", "--uts", "--ipc", "true"); code != 0 {
		t.Fatalf("the guest's root cannot create namespaces: %d %q", code, errb)
	}
}

// A sprite reaches the host's loopback, as a real one reaches the internet.
func TestSpriteGuestReachesHostLoopback(t *testing.T) {
	s := spritetest.Start(t)
	c := spritetest.StartCanary(t)
	sprite(t, s, "net")
	code, out, errb := run(t, s, "net", "curl", "-sS", "--max-time", "30", "http://"+c.Addr()+"/")
	if code != 0 || out != "sandgate-canary" || c.Hits() != 1 {
		t.Fatalf("curl to the canary: %d %q %q, hits %d", code, out, errb, c.Hits())
	}
}

// sudo -n works in the guest, as on the vendor's image, and runs as root
// with sudo's reset environment.
func TestSpriteGuestSudo(t *testing.T) {
	s := spritetest.Start(t)
	sprite(t, s, "sudo")
	code, out, errb := run(t, s, "sudo", "sudo", "-n", "sh", "-c", `echo "$(id -u) $SUDO_USER $HOME ${SECRET:-none}"`)
	if code != 0 || out != "0 sprite /root none\n" {
		t.Fatalf("sudo -n: %d %q %q", code, out, errb)
	}
	if code, _, _ := run(t, s, "sudo", "sudo", "-n", "-u", "nobody", "true"); code == 0 {
		t.Fatal("sudo -u nobody ran")
	}
}

// The guest's root writes /etc and /var/lib for later commands, never
// the host's; the fs API reads and writes anywhere in the guest.
func TestSpriteGuestRootWritesPersist(t *testing.T) {
	s := spritetest.Start(t)
	sprite(t, s, "rootfs")
	name := "sandgate-sprite-test-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if code, _, errb := run(t, s, "rootfs", "sh", "-c", "echo pkg >/etc/"+name+" && mkdir -p /var/lib/"+name+" && echo db >/var/lib/"+name+"/x"); code != 0 {
		t.Fatalf("root writes: %q", errb)
	}
	if _, out, errb := run(t, s, "rootfs", "cat", "/etc/"+name, "/var/lib/"+name+"/x"); out != "pkg\ndb\n" {
		t.Fatalf("a later command reads %q (%q)", out, errb)
	}
	if _, err := os.Stat("/etc/" + name); err == nil {
		t.Fatalf("the guest's write reached the host's /etc")
	}
	q := url.Values{"path": {"/.agent/bin/tool"}, "workingDir": {"/"}, "mode": {"0700"}, "mkdirParents": {"true"}}
	if st := do(t, s, "PUT", "/v1/sprites/rootfs/fs/write?"+q.Encode(), "application/octet-stream", "#!/bin/sh\necho tool ran\n"); st != http.StatusOK {
		t.Fatalf("fs write outside the home directories: status %d", st)
	}
	if code, out, errb := run(t, s, "rootfs", "sh", "-c", "stat -c '%a %u' /.agent/bin/tool && /.agent/bin/tool"); code != 0 || out != "700 0\ntool ran\n" {
		t.Fatalf("the fs API's file in the guest: %d %q %q", code, out, errb)
	}
	req, _ := http.NewRequestWithContext(t.Context(), "GET", s.URL+"/v1/sprites/rootfs/fs/read?"+url.Values{"path": {"/etc/" + name}, "workingDir": {"/"}}.Encode(), nil)
	req.Header.Set("Authorization", "Bearer "+s.Token())
	resp, err := s.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || b.String() != "pkg\n" {
		t.Fatalf("fs read of the guest's /etc: %d %q", resp.StatusCode, b.String())
	}
}
