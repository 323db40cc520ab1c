//go:build linux

package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandgate/sandgate/adminapi"
	"github.com/sandgate/sandgate/client"
	"github.com/sandgate/sandgate/protocol"
)

// The acceptance of the vendor guests' jail (docs/egress.md, "Vendor
// guests"): `sandgate dev --provider fly-machines|fly-sprites` against the
// fakes, whose guests have open network to the host's loopback as the
// real vendors give the internet, so that a missing jail shows as a
// reached canary.

func TestJailFlyMachines(t *testing.T) {
	t.Parallel()
	f := startFakeFly(t)
	testJail(t, "fly-machines", []string{
		"FLY_API_TOKEN=" + f.token, "FLY_FLAPS_BASE_URL=" + f.url,
		"SANDGATE_FLY_APP=sandgate-jail-" + randHex(4), "SANDGATE_FLY_ORG=sandgate-org", "SSL_CERT_FILE=" + f.caFile,
	})
}

func TestJailFlySprites(t *testing.T) {
	t.Parallel()
	token := "spr_e2e_" + randHex(16)
	apiURL, caFile, _ := startFakeSprites(t, token)
	testJail(t, "fly-sprites", []string{"SPRITE_TOKEN=" + token, "SPRITES_API_URL=" + apiURL, "SSL_CERT_FILE=" + caFile})
}

// canary is a TCP listener on the host's loopback that counts connections.
type canary struct {
	ln   net.Listener
	hits atomic.Int64
}

func startCanary(t *testing.T) *canary {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &canary{ln: ln}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c.hits.Add(1)
			conn.Write([]byte("HTTP/1.0 200 OK\r\nContent-Length: 6\r\n\r\ncanary"))
			conn.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return c
}

func (c *canary) port() string {
	_, p, _ := net.SplitHostPort(c.ln.Addr().String())
	return p
}

func testJail(t *testing.T, provider string, vendorEnv []string) {
	ctx := context.Background()
	site, egEnv := egressSite(t)
	can := startCanary(t)
	d := startDevWith(t, append(vendorEnv, egEnv...), "--provider", provider)
	c := d.Client(t, "")
	sitePort := strconv.Itoa(site.Port)

	lease, err := c.Lease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lease.Egress.Ceiling != nil {
		t.Errorf("lease egress ceiling = %v; want null (domain allowlists through the broker's proxy)", lease.Egress.Ceiling)
	}

	// Short-lived instances: one whose workspace, made first, lives 90 s
	// and has a durable command the other workspaces' jails must not see,
	// and one whose workspace, made last, lives 40 s and ends while every
	// broker process is stopped (the test waits for that end: the
	// shorter, the sooner it is over; 40 s leaves a slow host its start
	// of a durable command and the broker's stop).
	a := newAdminClient(t, d.AdminURL, d.AdminToken)
	acct := createAccount(t, a, "jail-life")
	shortLived := func(name string, seconds int64) *client.Client {
		t.Helper()
		ireq := adminapi.CreateInstanceRequest{AccountID: acct, Name: name, Provider: provider}
		ireq.Scope.Limits.MaxLifetimeSeconds = seconds
		var inst adminapi.Instance
		if err := a.Do(ctx, http.MethodPost, "/instances", ireq, &inst); err != nil {
			t.Fatalf("create a short-lived instance: %v", err)
		}
		return d.Client(t, issueToken(t, a, inst.ID))
	}
	lc, lastc := shortLived("jail-life", 90), shortLived("jail-last", 40)
	short, _, err := lc.Acquire(ctx, "jail-life", protocol.AcquireRequest{Label: "jail-life", Egress: noEgress()})
	if err != nil {
		t.Fatalf("acquire the short-lived workspace: %v", err)
	}
	marker := strconv.Itoa(40000 + int(time.Now().UnixNano()%20000))
	if _, _, err := lc.StartCommand(ctx, short.WorkspaceID, "jail-sleeper", protocol.ExecRequest{Argv: []string{"sleep", marker}, TimeoutSeconds: 600}); err != nil {
		t.Fatalf("start a durable command: %v", err)
	}
	waitFor(t, "the durable command running on the host", func() (bool, error) { return hostProcess("sleep " + marker), nil })

	ws, _, err := c.Acquire(ctx, "jail-ws", protocol.AcquireRequest{Label: "jail", Egress: &protocol.Egress{AllowedDomains: []string{"allowed.sg.test"}},
		Env: map[string]string{"SG_JAIL": "yes"}})
	if err != nil {
		t.Fatalf("acquire with allowed.sg.test: %v", err)
	}
	exec := func(argv ...string) protocol.ExecResponse {
		t.Helper()
		res, err := c.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: argv, TimeoutSeconds: 120})
		if err != nil {
			t.Fatalf("exec %q: %v", argv, err)
		}
		return *res
	}
	if err := c.WriteFile(ctx, ws.WorkspaceID, "/tmp/ca.pem", site.CAPEM); err != nil {
		t.Fatal(err)
	}
	res := exec("curl", "-fsS", "--max-time", "30", "--cacert", "/tmp/ca.pem", "https://allowed.sg.test:"+sitePort+"/")
	if res.ExitCode != 0 || string(stdout(res)) != "hello allowed.sg.test\n" {
		t.Errorf("curl allowed.sg.test = exit %d, %q, %q; want the page", res.ExitCode, stdout(res), stderr(res))
	}

	// Everything else: each attempt prints its name and curl's status.
	public, admin := hostPort(t, d.URL), hostPort(t, d.AdminURL)
	vendor := vendorListen(t, d.Logs())
	attempts := []string{
		"denied https://denied.sg.test:" + sitePort + "/",
		"ip-literal https://127.0.0.1:" + sitePort + "/",
		"direct --noproxy * https://127.0.0.1:" + sitePort + "/",
		"direct-name --noproxy * https://allowed.sg.test:" + sitePort + "/",
		"canary http://127.0.0.1:" + can.port() + "/",
		"canary-direct --noproxy * http://127.0.0.1:" + can.port() + "/",
		"public --noproxy * https://" + public + "/v1/lease",
		"admin --noproxy * http://" + admin + "/healthz",
		"vendor --noproxy * https://" + vendor + "/",
	}
	// Every port the dev process listens on (its listeners and its
	// embedded Redis among them), directly and through the proxy.
	for _, port := range listeningPorts(t, d.cmd.Process.Pid) {
		attempts = append(attempts, "dev-port-"+port+" --noproxy * http://127.0.0.1:"+port+"/",
			"dev-port-"+port+"-proxied --noproxy x.invalid -x http://127.0.0.1:3128 http://127.0.0.1:"+port+"/")
	}
	// A plain-HTTP request the proxy refuses is an HTTP answer (curl
	// status 0) whose body names the refusal: reported as "refused".
	script := `for a in "$@"; do set -- $a; n=$1; shift; o=$(curl -ksS --max-time 10 "$@" 2>/dev/null); r=$?
	case $o in "sandgate egress: refused"*) r=refused;; esac; echo "$n $r"; done`
	res = exec(append([]string{"sh", "-c", script, "sh"}, attempts...)...)
	for _, line := range strings.Split(strings.TrimSpace(string(stdout(res))), "\n") {
		name, code, _ := strings.Cut(line, " ")
		if code == "0" || code == "" {
			t.Errorf("%s was reached from the jail (curl status %q)", name, code)
		}
	}
	if n := len(strings.Split(strings.TrimSpace(string(stdout(res))), "\n")); n != len(attempts) {
		t.Errorf("%d attempts reported; want %d:\n%s", n, len(attempts), stdout(res))
	}

	// A workspace with [] reaches nothing, not even through the variables.
	none, _, err := c.Acquire(ctx, "jail-none", protocol.AcquireRequest{Label: "jail-none", Egress: noEgress()})
	if err != nil {
		t.Fatal(err)
	}
	nres, err := c.Exec(ctx, none.WorkspaceID, protocol.ExecRequest{TimeoutSeconds: 120, Argv: []string{"sh", "-c",
		`env | grep -ci proxy; curl -ksS -o /dev/null --max-time 10 -x http://127.0.0.1:3128 https://allowed.sg.test:$1/ 2>/dev/null; echo "proxied $?"; ` +
			`curl -sS -o /dev/null --max-time 10 http://127.0.0.1:$2/ 2>/dev/null; echo "canary $?"`, "sh", sitePort, can.port()}})
	if err != nil {
		t.Fatal(err)
	}
	if out := string(stdout(*nres)); !strings.HasPrefix(out, "0\n") || strings.Contains(out, " 0\n") {
		t.Errorf("a workspace with [] egress: %q; want no proxy variables and nothing reached", out)
	}
	if n := can.hits.Load(); n != 0 {
		t.Errorf("the host's canary got %d connections from the jails; want none", n)
	}

	// Only the tenant's own processes, and nothing outside can be signalled.
	res = exec("ps", "ax", "-o", "pid=,args=")
	ps := strings.TrimSpace(string(stdout(res)))
	if res.ExitCode != 0 || strings.Contains(ps, "keeper") || strings.Contains(ps, "sleep "+marker) || len(strings.Split(ps, "\n")) > 3 {
		t.Errorf("ps ax in the jail (exit %d):\n%s\nwant only the jail's init and ps", res.ExitCode, ps)
	}
	exec("sh", "-c", "kill -STOP -1; kill -9 -1; kill -STOP 1; kill -9 1; true")
	if res := exec("echo", "still"); string(stdout(res)) != "still\n" {
		t.Errorf("the workspace after kill -9 -1: %q", stdout(res))
	}

	// No vendor identifier: env, the hostname, /proc/self/environ, /proc/1/environ.
	// The jail's pid 1 (the agent) is not dumpable: its environ reads
	// empty or not at all; either way it must not show an identifier.
	res = exec("sh", "-c", `env; hostname; tr '\0' '\n' </proc/self/environ; { tr '\0' '\n' </proc/1/environ; } 2>/dev/null; exit 0`)
	out := string(stdout(res))
	if res.ExitCode != 0 || !strings.Contains(out, "SG_JAIL=yes") {
		t.Errorf("the jail's environment (exit %d) lacks the workspace's env:\n%s", res.ExitCode, out)
	}
	for _, id := range []string{"FLY_", "SPRITE", "SANDGATE", strings.ToLower(strings.ReplaceAll(ws.WorkspaceID, "_", "-"))} {
		if strings.Contains(strings.ToUpper(out), strings.ToUpper(id)) {
			t.Errorf("the jail shows a vendor identifier (%s):\n%s", id, out)
		}
	}
	if res := exec("hostname"); string(stdout(res)) != "sandbox\n" {
		t.Errorf("hostname = %q; want sandbox", stdout(res))
	}
	// The jail's hostname and hosts files are the agent's, and its /run
	// (where the guest's services keep their sockets) is empty.
	if res := exec("sh", "-c", "cat /etc/hostname /etc/hosts; ls -A /run"); string(stdout(res)) !=
		"sandbox\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsandbox\n" {
		t.Errorf("hostname, hosts and /run in the jail = %q; want the agent's files and an empty /run", stdout(res))
	}

	// The jail's root writes to the image's file system, as apt-get does,
	// and a later exec sees it.
	if res := exec("sh", "-c", "echo jail >/etc/sg-jail && mkdir -p /var/lib/sg-jail && echo lib >/var/lib/sg-jail/f"); res.ExitCode != 0 {
		t.Errorf("root write to /etc: exit %d, %s", res.ExitCode, stderr(res))
	}
	if res := exec("cat", "/etc/sg-jail", "/var/lib/sg-jail/f"); string(stdout(res)) != "jail\nlib\n" {
		t.Errorf("a later exec reads %q; want the jail's root's writes", stdout(res))
	}

	// Every broker process stopped: the short-lived workspace's tenant
	// processes end at its expires_at all the same. It is made now, not
	// first: on a loaded machine the checks above can outlast its lifetime.
	last, _, err := lastc.Acquire(ctx, "jail-life-last", protocol.AcquireRequest{Label: "jail-life-last", Egress: noEgress()})
	if err != nil {
		t.Fatalf("acquire the last short-lived workspace: %v", err)
	}
	lastMarker := strconv.Itoa(60000 + int(time.Now().UnixNano()%20000)) // not the first one's
	if _, _, err := lastc.StartCommand(ctx, last.WorkspaceID, "jail-sleeper", protocol.ExecRequest{Argv: []string{"sleep", lastMarker}, TimeoutSeconds: 600}); err != nil {
		t.Fatalf("start a durable command: %v", err)
	}
	waitFor(t, "the last durable command running on the host", func() (bool, error) { return hostProcess("sleep " + lastMarker), nil })
	exp, err := time.Parse(time.RFC3339, last.ExpiresAt)
	if err != nil {
		t.Fatal(err)
	}
	d.stop()
	if !hostProcess("sleep " + lastMarker) {
		t.Fatalf("the durable command ended before expires_at (%s)", exp)
	}
	time.Sleep(time.Until(exp))
	waitFor(t, "the tenant's processes gone after expires_at", func() (bool, error) { return !hostProcess("sleep " + lastMarker), nil })
	if late := time.Since(exp); late > 45*time.Second {
		t.Errorf("the tenant's processes ended %v after expires_at", late)
	}
}

func stdout(r protocol.ExecResponse) []byte {
	b, _ := base64.StdEncoding.DecodeString(r.StdoutB64)
	return b
}
func stderr(r protocol.ExecResponse) []byte {
	b, _ := base64.StdEncoding.DecodeString(r.StderrB64)
	return b
}

// hostPort is the host:port of url.
func hostPort(t *testing.T, url string) string {
	t.Helper()
	_, rest, _ := strings.Cut(url, "://")
	return rest
}

// vendorListen is the vendor listener's address from dev's log.
func vendorListen(t *testing.T, logs string) string {
	t.Helper()
	const key = `"egress_vendor_listen":"`
	i := strings.Index(logs, key)
	if i < 0 {
		t.Fatalf("dev's log names no egress vendor listener:\n%s", tail(logs, 4<<10))
	}
	addr, _, _ := strings.Cut(logs[i+len(key):], `"`)
	return addr
}

// hostProcess reports whether a process whose command line is args runs
// on this host (the fakes' guests are processes of it).
func hostProcess(args string) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%s/cmdline", e.Name()))
		if err == nil && strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " ")) == args {
			return true
		}
	}
	return false
}

// listeningPorts returns the TCP ports process pid listens on, read from
// /proc: its socket inodes, matched with the listening sockets of its
// network namespace. Among dev's are its embedded Redis and its listeners.
func listeningPorts(t *testing.T, pid int) []string {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil {
			if in, ok := strings.CutPrefix(l, "socket:["); ok {
				inodes[strings.TrimSuffix(in, "]")] = true
			}
		}
	}
	var ports []string
	for _, f := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st … inode
			fields := strings.Fields(line)
			if len(fields) < 10 || fields[3] != "0A" || !inodes[fields[9]] { // 0A: LISTEN
				continue
			}
			_, hexPort, _ := strings.Cut(fields[1], ":")
			if n, err := strconv.ParseUint(hexPort, 16, 16); err == nil {
				ports = append(ports, strconv.FormatUint(n, 10))
			}
		}
	}
	if len(ports) < 4 { // public, admin, vendor, Redis
		t.Fatalf("dev listens on ports %v; want at least its three listeners and its Redis", ports)
	}
	return ports
}
