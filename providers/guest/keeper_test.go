//go:build linux && (amd64 || arm64)

package guest_test

import (
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/internal/egresstest"
	"github.com/sandgate/sandgate/internal/testpki"
	"golang.org/x/sys/unix"
)

// startKeeper starts the keeper of the agent directory dir in g with args
// and returns its host pid, once it serves, and a channel that yields its
// exit status.
func startKeeper(t *testing.T, g *guestVM, dir string, args ...string) (int, <-chan int) {
	t.Helper()
	cmd := g.command(append([]string{"keeper", "--agent-dir", dir}, args...)...)
	// A file, not a pipe: the keeper's detached children would hold a
	// pipe open and Wait with it.
	errf, err := os.Create(filepath.Join(t.TempDir(), "keeper.stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer errf.Close()
	cmd.Stderr = errf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done, waited := make(chan int, 1), make(chan struct{})
	go func() {
		cmd.Wait()
		done <- cmd.ProcessState.ExitCode()
		close(waited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-waited
		if b, _ := os.ReadFile(errf.Name()); t.Failed() && len(b) > 0 {
			t.Logf("keeper stderr: %s", b)
		}
	})
	register(t, dir, g)
	waitFor(t, "the keeper to serve", func() bool { _, err := os.Stat(filepath.Join(dir, "keeper")); return err == nil })
	return waitChild(t, cmd.Process.Pid), done
}

// startJail starts `run -- argv` in g and returns a channel that yields
// its exit status, once the tenant runs.
func startJail(t *testing.T, g *guestVM, dir string, argv ...string) <-chan int {
	t.Helper()
	cmd := g.command(append([]string{"run", "--agent-dir", dir, "--"}, argv...)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	go func() {
		cmd.Wait()
		done <- cmd.ProcessState.ExitCode()
	}()
	t.Cleanup(func() { cmd.Process.Kill() })
	agentPid := waitChild(t, cmd.Process.Pid)
	init := waitChild(t, agentPid)
	waitChild(t, init)
	return done
}

// jailSetup is how long a test gives itself, before a keeper's deadline,
// to start the keeper and its jails: --until is in whole seconds, and on
// a loaded machine a jail takes seconds to start; one started after the
// deadline is refused, and the test would then wait for it in vain. On
// a 2-vCPU host running the whole suite, setting a jail up can take more
// than 15 s.
const jailSetup = 30 * time.Second

func TestKeeperEndsJailsAtDeadline(t *testing.T) {
	t.Parallel() // mostly waiting for the deadline: beside the others
	g, dir := startGuest(t), agentDir(t)
	keeper, keeperDone := startKeeper(t, g, dir, "--until", strconv.FormatInt(time.Now().Add(jailSetup).Unix(), 10))
	// The tenant tries to stop and kill the keeper by its pid in the
	// guest: that pid is not the keeper's in the jail (at most one of the
	// jail's own, which the jail's init ignores).
	kp := strconv.Itoa(nsPid(t, keeper))
	r := g.command("run", "--agent-dir", dir, "--", "sh", "-c",
		"kill -STOP "+kp+"; kill -9 "+kp+"; cat /proc/"+kp+"/cmdline; ps -e -o args=; true")
	out, err := r.Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "keeper") {
		t.Errorf("the tenant sees the keeper: %q", out)
	}
	// Sleeping, or running for a moment (a Go program's main thread may
	// be scheduled just then); never stopped, traced or gone.
	if s := procState(keeper); s != "S" && s != "R" {
		t.Errorf("the keeper is in state %q, want S (sleeping) or R (running)", s)
	}
	// A jail that would outlive the deadline, with a process that left
	// its session.
	jailDone := startJail(t, g, dir, "sh", "-c", "setsid sleep 1000 & sleep 1000")
	if st := <-keeperDone; st != 0 {
		t.Errorf("keeper status %d, want 0", st)
	}
	if st := <-jailDone; st != signalExitStatus(syscall.SIGKILL) {
		t.Errorf("jail status %d, want %d", st, signalExitStatus(syscall.SIGKILL))
	}
	// Nothing but the guest's own init is left.
	waitFor(t, "the guest's processes to end", func() bool {
		return len(children(g.init)) == 0
	})
}

func TestKeeperDetachAndSIGTERM(t *testing.T) {
	g, dir := startGuest(t), agentDir(t)
	cmd := g.command("keeper", "--detach", "--agent-dir", dir, "--until", strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("keeper --detach: %v: %s", err, out)
	}
	// The exec that started it has returned; the keeper runs on, in a
	// session of its own, reparented to the guest's init.
	var keeper int
	for _, c := range children(g.init) {
		if b, _ := os.ReadFile("/proc/" + strconv.Itoa(c) + "/cmdline"); strings.Contains(string(b), "keeper") {
			keeper = c
		}
	}
	if keeper == 0 || !alive(keeper) {
		t.Fatal("no keeper runs after --detach returned")
	}
	if sid, _ := unix.Getsid(keeper); sid != keeper {
		t.Errorf("the keeper's session is %d, want its own (%d)", sid, keeper)
	}
	jailDone := startJail(t, g, dir, "sleep", "1000")
	// The vendor's stop.
	if err := syscall.Kill(keeper, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if st := <-jailDone; st != signalExitStatus(syscall.SIGKILL) {
		t.Errorf("jail status %d, want %d", st, signalExitStatus(syscall.SIGKILL))
	}
	waitFor(t, "the keeper to exit", func() bool { return !alive(keeper) })
}

func TestEgressThroughForwarder(t *testing.T) {
	site := egresstest.StartSite(t, []string{"allowed.sg.test", "denied.sg.test"}, nil)
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "plain %s %s\n", r.Host, r.Header.Get("Proxy-Authorization"))
	}))
	t.Cleanup(plain.Close)
	plainPort := plain.Listener.Addr().(*net.TCPAddr).Port
	loop := netip.MustParseAddr("127.0.0.1")
	proxy, err := egress.New(egress.Config{
		Ports:    []uint16{uint16(site.Port), uint16(plainPort)},
		TLSPorts: []uint16{uint16(site.Port)},
		Hosts:    map[string]netip.Addr{"allowed.sg.test": loop, "denied.sg.test": loop},
	}, egress.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	// The broker's vendor listener: the proxy in credential mode, over TLS.
	pki := testpki.Issue(t, "sandgate vendor listener CA", []string{"proxy.sg.test"}, nil)
	addr := egresstest.ServeVendor(t, proxy, pki)
	cred, err := proxy.Register(egress.Workspace{ID: "ws-egress-1", AllowedDomains: []string{"allowed.sg.test"}})
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	credFile, caFile, sock := filepath.Join(dir, "egress.cred"), filepath.Join(dir, "egress.ca"), filepath.Join(dir, "egress.sock")
	siteCA := filepath.Join(t.TempDir(), "site-ca.pem")
	for name, b := range map[string][]byte{
		credFile: []byte(cred + "\n"),
		caFile:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pki.CADER}),
		siteCA:   site.CAPEM,
	} {
		if err := os.WriteFile(name, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The guest names the proxy in its /etc/hosts when the keeper starts.
	g := startGuest(t)
	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, []byte("127.0.0.1 proxy.sg.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("nsenter", "-t", strconv.Itoa(g.init), "-m", "--", "mount", "--bind", hosts, "/etc/hosts").CombinedOutput(); err != nil {
		t.Fatalf("the guest's hosts: %v: %s", err, out)
	}
	_, proxyPort, _ := net.SplitHostPort(addr.String())
	startKeeper(t, g, dir, "--until", strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10),
		"--egress-sock", sock, "--egress-proxy", "proxy.sg.test:"+proxyPort, "--egress-server-name", "proxy.sg.test",
		"--egress-user", "ws-egress-1", "--egress-cred-file", credFile, "--egress-ca", caFile)
	waitFor(t, "the forwarder's socket", func() bool { _, err := os.Stat(sock); return err == nil })
	if fi, _ := os.Stat(sock); fi.Mode().Perm() != 0o600 {
		t.Errorf("the forwarder's socket has mode %v, want 0600", fi.Mode().Perm())
	}
	// Whatever the guest's /etc/hosts says later (a tenant that reached
	// it), the forwarder reaches the proxy it resolved at its start.
	if err := os.WriteFile(hosts, []byte("127.0.0.2 proxy.sg.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	port := strconv.Itoa(site.Port)
	jailed := func(script string) result {
		t.Helper()
		return run(t, nil, "run", "--agent-dir", dir, "--egress-sock", sock, "--", "sh", "-c", script)
	}
	curl := "curl -sS --max-time 60 --cacert " + siteCA + " "
	// Through the proxy variables; a Proxy-Authorization of the tenant's
	// own is replaced.
	r := jailed(curl + "https://allowed.sg.test:" + port + "/ && " + curl + "--proxy-user ws-egress-1:guess https://allowed.sg.test:" + port + "/")
	if r.status != 0 || r.stdout != "hello allowed.sg.test\nhello allowed.sg.test\n" {
		t.Fatalf("allowed: status %d, stdout %q, stderr %q", r.status, r.stdout, r.stderr)
	}
	// Plain HTTP, two requests of one client: the proxy's shared listener
	// ends each connection after its answer, and the client opens
	// another; the destination gets no Proxy-Authorization.
	pp := strconv.Itoa(plainPort)
	r = jailed("curl -sS --max-time 60 http://allowed.sg.test:" + pp + "/a http://allowed.sg.test:" + pp + "/b")
	if want := "plain allowed.sg.test:" + pp + " \n"; r.status != 0 || r.stdout != want+want {
		t.Errorf("plain HTTP: status %d, stdout %q, stderr %q", r.status, r.stdout, r.stderr)
	}
	if r := jailed("curl -sS --max-time 60 -o /dev/null -w '%{http_code}' http://denied.sg.test:" + pp + "/"); r.stdout != "403" {
		t.Errorf("plain HTTP to a denied host: %q, want 403", r.stdout)
	}
	for name, script := range map[string]string{
		"denied":           curl + "https://denied.sg.test:" + port + "/",
		"direct":           curl + "--noproxy '*' https://127.0.0.1:" + port + "/",
		"direct by name":   curl + "--noproxy '*' --resolve allowed.sg.test:" + port + ":127.0.0.1 https://allowed.sg.test:" + port + "/",
		"the proxy itself": curl + "--noproxy '*' -k https://" + addr.String() + "/",
		"credential":       "cat " + credFile,
		"socket by path":   "curl -sS --max-time 60 --unix-socket " + sock + " http://x/",
	} {
		if r := jailed(script); r.status == 0 || strings.Contains(r.stdout, "hello") {
			t.Errorf("%s: status %d, stdout %q: want a failure", name, r.status, r.stdout)
		}
	}
	// The proxy variables are the local provider's.
	r = jailed("env | grep -i proxy | sort")
	want := "ALL_PROXY=http://127.0.0.1:3128\nHTTPS_PROXY=http://127.0.0.1:3128\nHTTP_PROXY=http://127.0.0.1:3128\n" +
		"NO_PROXY=localhost,127.0.0.1,::1\nall_proxy=http://127.0.0.1:3128\nhttp_proxy=http://127.0.0.1:3128\n" +
		"https_proxy=http://127.0.0.1:3128\nno_proxy=localhost,127.0.0.1,::1\n"
	if r.stdout != want {
		t.Errorf("proxy variables:\n%s\nwant:\n%s", r.stdout, want)
	}
	if u := proxy.Usage("ws-egress-1"); u.BytesIn == 0 {
		t.Errorf("the proxy counted nothing for the workspace: %+v", u)
	}
	// Without --egress-sock, nothing at all.
	if r := run(t, nil, "run", "--agent-dir", dir, "--", "sh", "-c", curl+"--proxy http://127.0.0.1:3128 https://allowed.sg.test:"+port+"/"); r.status == 0 {
		t.Errorf("a jail without egress reached the site: %q", r.stdout)
	}
}

func TestRunRefusesWithoutLiveKeeper(t *testing.T) {
	// No keeper at all.
	cmd := exec.Command(agent, "run", "--agent-dir", agentDir(t), "--", "echo", "ran")
	out, _ := cmd.Output()
	if st := cmd.ProcessState.ExitCode(); st != 125 || len(out) != 0 {
		t.Errorf("without a keeper: status %d, stdout %q; want 125 and nothing run", st, out)
	}

	// A keeper killed from outside the jails.
	g, dir := startGuest(t), agentDir(t)
	g.keep(t, dir, time.Hour)
	if r := jail(t, dir, nil, "echo", "ran"); r.status != 0 || r.stdout != "ran\n" {
		t.Fatalf("with the keeper: status %d, stdout %q, stderr %q", r.status, r.stdout, r.stderr)
	}
	var keeper int
	for _, c := range children(g.init) {
		if b, _ := os.ReadFile("/proc/" + strconv.Itoa(c) + "/cmdline"); strings.Contains(string(b), "keeper") {
			keeper = c
		}
	}
	if keeper == 0 {
		t.Fatal("no keeper in the guest")
	}
	if err := syscall.Kill(keeper, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the keeper to die", func() bool { return !alive(keeper) })
	r := jail(t, dir, nil, "echo", "ran")
	if r.status != 125 || r.stdout != "" || !strings.Contains(r.stderr, "keeper is not running") {
		t.Errorf("after the keeper died: status %d, stdout %q, stderr %q; want 125, a refusal", r.status, r.stdout, r.stderr)
	}
}

// TestJailEndsAtDeadlineWithoutKeeper: a jail ends at the guest's
// deadline even when its keeper, stopped, does not end it.
func TestJailEndsAtDeadlineWithoutKeeper(t *testing.T) {
	t.Parallel() // mostly waiting for the deadline: beside the others
	g, dir := startGuest(t), agentDir(t)
	keeper, _ := startKeeper(t, g, dir, "--until", strconv.FormatInt(time.Now().Add(jailSetup).Unix(), 10))
	jailDone := startJail(t, g, dir, "sleep", "1000")
	if err := syscall.Kill(keeper, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(keeper, syscall.SIGCONT) })
	if st := <-jailDone; st != signalExitStatus(syscall.SIGKILL) {
		t.Errorf("jail status %d, want %d", st, signalExitStatus(syscall.SIGKILL))
	}
	if r := jail(t, dir, nil, "echo", "ran"); r.status != 125 || r.stdout != "" {
		t.Errorf("after the deadline: status %d, stdout %q; want 125, nothing run", r.status, r.stdout)
	}
}
