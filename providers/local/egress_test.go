package local_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/cgi"
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
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// egressNames are the static hosts of the tests, all on loopback.
var egressNames = []string{"allowed.sg.test", "denied.sg.test", "a.sg.test", "sg.test"}

// startTLSSite starts the tests' TLS site: "hello NAME" for every name of
// egressNames, and a git repository below /git/.
func startTLSSite(t *testing.T) egresstest.Site {
	t.Helper()
	return egresstest.StartSite(t, egressNames, map[string]http.Handler{"/git/": gitServer(t)})
}

// gitServer serves a bare repository, repo.git, holding one commit with
// README "hello from git", over git's smart HTTP (git http-backend as a
// CGI) below /git/.
func gitServer(t *testing.T) http.Handler {
	t.Helper()
	root := t.TempDir()
	work := filepath.Join(root, "work")
	gitEnv := []string{"HOME=" + root, "GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@sg.test",
		"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@sg.test", "PATH=" + os.Getenv("PATH")}
	git := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env = dir, gitEnv
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", args, err, out)
		}
	}
	git(root, "init", "-q", "-b", "main", work)
	if err := os.WriteFile(filepath.Join(work, "README"), []byte("hello from git\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git(work, "add", "README")
	git(work, "commit", "-q", "-m", "first")
	git(root, "clone", "-q", "--bare", work, filepath.Join(root, "repo.git"))
	backend, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	return http.StripPrefix("/git", &cgi.Handler{Path: backend, Args: []string{"http-backend"}, Root: "/",
		Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "HOME=" + root, "GIT_CONFIG_NOSYSTEM=1"}})
}

// egressEnv is a local provider behind a real egress proxy that allows
// the site's port (and the proxy's defaults, 80 and 443) and maps every
// name of egressNames to 127.0.0.1.
type egressEnv struct {
	site    egresstest.Site
	proxy   *egress.Proxy
	p       *local.Provider
	dataDir string
	other   int // a port on the host's loopback that is not allowed
}

func newEgressEnv(t *testing.T) *egressEnv {
	t.Helper()
	return newEgressEnvIn(t, t.TempDir())
}

// newEgressEnvIn is newEgressEnv with the provider's data directory.
func newEgressEnvIn(t *testing.T, dataDir string) *egressEnv {
	t.Helper()
	site := startTLSSite(t)
	hosts := map[string]netip.Addr{}
	for _, n := range egressNames {
		hosts[n] = netip.MustParseAddr("127.0.0.1")
	}
	proxy, err := egress.New(egress.Config{Ports: []uint16{80, 443, uint16(site.Port)}, Hosts: hosts}, egress.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	e := &egressEnv{site: site, proxy: proxy, dataDir: dataDir, other: other.Addr().(*net.TCPAddr).Port}
	e.p = e.provider(t)
	return e
}

// provider opens a (further) provider over the env's data directory.
func (e *egressEnv) provider(t *testing.T) *local.Provider {
	t.Helper()
	p, err := local.New(t.Context(), local.Config{DataDir: e.dataDir, Egress: e.proxy}, providers.Env{BrokerID: broker})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(p) })
	return p
}

// workspace creates a workspace allowed domains, with the site's CA at
// /workspace/ca.pem.
func (e *egressEnv) workspace(t *testing.T, domains ...string) providers.Sandbox {
	t.Helper()
	spec := providertest.Spec(t)
	spec.AccountID = egressAccount
	spec.Egress.AllowedDomains = append([]string{}, domains...)
	sb := providertest.Create(t, e.p, spec)
	if err := providers.WriteFileBytes(t.Context(), e.p, sb, "/workspace/ca.pem", e.site.CAPEM); err != nil {
		t.Fatal(err)
	}
	return sb
}

// fetch runs curl in sb for url with extra options and returns its
// output (the page, then the proxy's CONNECT status on a line of its
// own) and exit code; an HTTP error status (the proxy's refusal of a
// plain-HTTP request) fails.
func fetch(t *testing.T, p providers.Provider, sb providers.Sandbox, url string, opts ...string) (string, int) {
	t.Helper()
	argv := append([]string{"curl", "-fsS", "--max-time", "20", "--cacert", "/workspace/ca.pem",
		"-w", "\nconnect=%{http_connect}\n"}, opts...)
	res := providertest.Exec(t, p, sb, append(argv, url)...)
	return string(res.Stdout) + string(res.Stderr), res.ExitCode
}

func TestEgressAllowlist(t *testing.T) {
	t.Parallel()
	e := newEgressEnv(t)
	if got := e.p.Capabilities().Egress; got != providers.EgressProxy {
		t.Errorf("Capabilities().Egress = %v; want proxy", got)
	}
	sb := e.workspace(t, "allowed.sg.test")
	port := strconv.Itoa(e.site.Port)
	allowed := "https://allowed.sg.test:" + port + "/"

	t.Run("allowed domain", func(t *testing.T) {
		out, code := fetch(t, e.p, sb, allowed)
		if code != 0 || !strings.HasPrefix(out, "hello allowed.sg.test\n") {
			t.Fatalf("curl %s: exit %d, output %q; want the page", allowed, code, out)
		}
		if u := e.proxy.Usage(sb.Ref); u.BytesIn <= 0 || u.BytesOut <= 0 {
			t.Errorf("proxy usage of the workspace after a fetch = %+v; want bytes both ways", u)
		}
	})
	t.Run("proxy variables", func(t *testing.T) {
		res := providertest.Exec(t, e.p, sb, "env")
		env := string(res.Stdout)
		for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"} {
			if !strings.Contains(env, "\n"+k+"=http://127.0.0.1:3128\n") && !strings.HasPrefix(env, k+"=http://127.0.0.1:3128\n") {
				t.Errorf("%s is not http://127.0.0.1:3128 in the sandbox: %q", k, env)
			}
		}
	})

	// Each refused fetch: curl fails, and no page came back.
	refused := func(t *testing.T, url string, opts ...string) {
		t.Helper()
		out, code := fetch(t, e.p, sb, url, opts...)
		if code == 0 || strings.Contains(out, "hello") {
			t.Errorf("curl %s %q: exit %d, output %q; want it refused", url, opts, code, out)
		}
	}
	noEnvProxy := []string{"--noproxy", "*"}
	viaProxy := []string{"--proxy", "http://127.0.0.1:3128", "--noproxy", ""}
	t.Run("domain not allowed", func(t *testing.T) {
		refused(t, "https://denied.sg.test:"+port+"/")
		refused(t, "http://denied.sg.test:"+port+"/")
	})
	t.Run("site's address directly", func(t *testing.T) {
		refused(t, "https://127.0.0.1:"+port+"/", noEnvProxy...)
		refused(t, allowed, append(noEnvProxy, "--resolve", "allowed.sg.test:"+port+":127.0.0.1")...)
	})
	t.Run("IP literals", func(t *testing.T) {
		for _, ip := range []string{"127.0.0.1", "1.1.1.1", "[::1]", "169.254.169.254"} {
			refused(t, "https://"+ip+":"+port+"/", viaProxy...)
			refused(t, "http://"+ip+"/", viaProxy...)
			refused(t, "http://"+ip+"/", noEnvProxy...)
		}
	})
	t.Run("port not allowed", func(t *testing.T) {
		refused(t, "https://allowed.sg.test:"+strconv.Itoa(e.other)+"/")
		refused(t, "http://allowed.sg.test:"+strconv.Itoa(e.other)+"/")
		refused(t, "https://allowed.sg.test:22/")
	})
	t.Run("no resolver", func(t *testing.T) {
		for _, name := range []string{"example.com", "allowed.sg.test"} {
			res := providertest.Exec(t, e.p, sb, "getent", "hosts", name)
			if res.ExitCode == 0 {
				t.Errorf("getent hosts %s in the sandbox = %q; want it unresolved", name, res.Stdout)
			}
		}
		if res := providertest.Exec(t, e.p, sb, "test", "-e", "/etc/resolv.conf"); res.ExitCode == 0 {
			t.Errorf("the sandbox has /etc/resolv.conf")
		}
	})
	t.Run("SNI other than the CONNECT host", func(t *testing.T) {
		// curl tunnels to allowed.sg.test but speaks TLS for denied.sg.test.
		refused(t, "https://denied.sg.test:"+port+"/", "--connect-to", "denied.sg.test:"+port+":allowed.sg.test:"+port)
		// The same with openssl, and its control with the right SNI.
		sclient := func(sni string) (string, int) {
			res := providertest.Exec(t, e.p, sb, "sh", "-c",
				`printf 'GET / HTTP/1.0\r\nHost: '"$1"'\r\n\r\n' | openssl s_client -quiet -proxy 127.0.0.1:3128 -connect allowed.sg.test:`+port+
					` -servername "$1" -CAfile /workspace/ca.pem 2>&1`, "sh", sni)
			return string(res.Stdout), res.ExitCode
		}
		if out, code := sclient("allowed.sg.test"); !strings.Contains(out, "hello allowed.sg.test") {
			t.Errorf("openssl s_client through the proxy with SNI allowed.sg.test: exit %d, %q; want the page", code, out)
		}
		if out, code := sclient("denied.sg.test"); strings.Contains(out, "hello") {
			t.Errorf("openssl s_client, CONNECT allowed.sg.test with SNI denied.sg.test: exit %d, %q; want it refused", code, out)
		}
	})
	t.Run("git clone", func(t *testing.T) {
		res := providertest.Exec(t, e.p, sb, "sh", "-c", `git -c http.sslCAInfo=/workspace/ca.pem clone -q "$1" /workspace/repo && cat /workspace/repo/README`,
			"sh", "https://allowed.sg.test:"+port+"/git/repo.git")
		if res.ExitCode != 0 || string(res.Stdout) != "hello from git\n" {
			t.Errorf("git clone through the proxy: exit %d, stdout %q, stderr %q; want the repository", res.ExitCode, res.Stdout, res.Stderr)
		}
	})
	t.Run("durable command", func(t *testing.T) {
		err := e.p.StartCommand(t.Context(), sb, "cmd-egress", providers.ExecSpec{
			Argv: []string{"curl", "-sS", "--max-time", "20", "--cacert", "/workspace/ca.pem", allowed}, MaxOutputBytes: 1 << 10})
		if err != nil {
			t.Fatal(err)
		}
		st := waitCommand(t, e.p, sb, "cmd-egress")
		if st.ExitCode != 0 || string(st.Stdout) != "hello allowed.sg.test\n" {
			t.Errorf("durable curl: exit %d, stdout %q, stderr %q; want the page", st.ExitCode, st.Stdout, st.Stderr)
		}
	})
	t.Run("bytes final at terminate", func(t *testing.T) {
		before := e.proxy.Usage(sb.Ref)
		if err := e.p.Terminate(t.Context(), sb); err != nil {
			t.Fatal(err)
		}
		c := e.proxy.Forget(sb.Ref)
		if u := c.Unkept(); u.BytesIn < before.BytesIn || u.BytesIn <= 0 || !c.Exact {
			t.Errorf("Forget after Terminate = %+v (before %+v); want every byte, none kept", c, before)
		}
	})
}

// waitCommand polls a durable command until it has finished.
func waitCommand(t *testing.T, p *local.Provider, sb providers.Sandbox, id string) providers.CommandStatus {
	t.Helper()
	for {
		st, err := p.ReadCommand(t.Context(), sb, id, 1<<10)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == providers.CommandCompleted {
			return st
		}
		select {
		case <-t.Context().Done():
			t.Fatal("command did not finish")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestEgressWildcardAndNone(t *testing.T) {
	t.Parallel()
	e := newEgressEnv(t)
	port := strconv.Itoa(e.site.Port)
	wild := e.workspace(t, "*.sg.test")
	if out, code := fetch(t, e.p, wild, "https://a.sg.test:"+port+"/"); code != 0 || !strings.HasPrefix(out, "hello a.sg.test\n") {
		t.Errorf("*.sg.test fetching a.sg.test: exit %d, %q; want the page", code, out)
	}
	if out, code := fetch(t, e.p, wild, "https://sg.test:"+port+"/"); code == 0 || strings.Contains(out, "hello") {
		t.Errorf("*.sg.test fetching sg.test: exit %d, %q; want it refused", code, out)
	}

	none := e.workspace(t)
	res := providertest.Exec(t, e.p, none, "sh", "-c", `env | grep -i _proxy; ls /run/sandgate 2>&1`)
	if strings.Contains(string(res.Stdout), "PROXY=") || !strings.Contains(string(res.Stdout), "No such file") {
		t.Errorf("a workspace with [] sees %q; want no proxy variables and no /run/sandgate", res.Stdout)
	}
	for _, opts := range [][]string{nil, {"--proxy", "http://127.0.0.1:3128"}, {"--noproxy", "*"}} {
		if out, code := fetch(t, e.p, none, "https://allowed.sg.test:"+port+"/", opts...); code == 0 || strings.Contains(out, "hello") {
			t.Errorf("a workspace with [] fetching allowed.sg.test (%q): exit %d, %q; want nothing", opts, code, out)
		}
	}
	if out, code := fetch(t, e.p, none, "https://127.0.0.1:"+port+"/"); code == 0 || strings.Contains(out, "hello") {
		t.Errorf("a workspace with [] fetching 127.0.0.1: exit %d, %q; want nothing", code, out)
	}
}

// One workspace's sandbox has only its own socket, the proxy attributes
// every connection on a socket to the workspace it belongs to, and on the
// host only that workspace's uid (and root) may connect to it.
func TestEgressWorkspacesApart(t *testing.T) {
	t.Parallel()
	e := newEgressEnv(t)
	port := strconv.Itoa(e.site.Port)
	a := e.workspace(t, "allowed.sg.test")
	b := e.workspace(t, "a.sg.test")
	sockA := filepath.Join(e.dataDir, "workspaces", a.Ref, "egress", "egress.sock")
	sockB := filepath.Join(e.dataDir, "workspaces", b.Ref, "egress", "egress.sock")

	if out, code := fetch(t, e.p, b, "https://allowed.sg.test:"+port+"/"); code == 0 || strings.Contains(out, "hello") {
		t.Errorf("workspace b fetching a's domain: exit %d, %q; want it refused", code, out)
	}
	// The directory can be searched, not listed or changed, in the sandbox.
	res := providertest.Exec(t, e.p, b, "sh", "-c",
		`ls /run/sandgate; test -S /run/sandgate/egress/egress.sock && echo own; test -e "$1" && echo other; `+
			`rm -f /run/sandgate/egress/egress.sock 2>/dev/null && echo removed; ls /run/sandgate/egress >/dev/null 2>&1 && echo listed`,
		"sh", sockA)
	if got := string(res.Stdout); got != "egress\nforward\nown\n" {
		t.Errorf("in b's sandbox: %q; want /run/sandgate/{egress,forward}, b's socket, no other, nothing removed or listed", got)
	}
	if u := e.proxy.Usage(a.Ref); u.BytesIn != 0 || u.BytesOut != 0 {
		t.Errorf("a's usage after b's attempts = %+v; want none", u)
	}

	stA, stB := statUID(t, sockA), statUID(t, sockB)
	if stA == 0 || stA == stB {
		t.Fatalf("socket owners a %d, b %d; want each workspace's own uid", stA, stB)
	}
	// As b's uid on the host (as a sandbox that escaped would be), a's
	// socket is out of reach; as a's own uid, its own is reachable.
	connect := func(uid int, sock string) error {
		cmd := exec.Command("setpriv", "--reuid", strconv.Itoa(uid), "--regid", strconv.Itoa(uid), "--clear-groups",
			"curl", "-sS", "--max-time", "10", "--unix-socket", sock, "http://x/")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}
	if err := connect(0, sockA); err != nil {
		t.Fatalf("root connecting to a's socket: %v; want the proxy's answer", err)
	}
	if err := connect(stB, sockA); err == nil {
		t.Errorf("b's uid connected to a's socket on the host; want it refused")
	}
	// The workspace directory (0700, root) keeps every uid but root out
	// of the path on the host, a's own too: a reaches it in its sandbox.
	if err := connect(stA, sockA); err == nil {
		t.Errorf("a's uid connected to a's socket on the host, outside its sandbox; want the path refused")
	}
}

func statUID(t *testing.T, name string) int {
	t.Helper()
	fi, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("egress socket mode %v; want a socket, 0600", fi.Mode())
	}
	return int(fi.Sys().(*syscall.Stat_t).Uid)
}

// A broker restart: a new provider over the same data directory serves
// the socket of a workspace that survived, and its sandboxes reach the
// allowed domain again. The data directory's path is long: a socket's
// own path could not hold it (107 bytes).
func TestEgressAfterRestart(t *testing.T) {
	t.Parallel()
	e := newEgressEnvIn(t, filepath.Join(t.TempDir(), strings.Repeat("long-data-directory-", 5)))
	sb := e.workspace(t, "allowed.sg.test")
	url := "https://allowed.sg.test:" + strconv.Itoa(e.site.Port) + "/"
	e.p.Close() // the broker stops; the workspace stays
	if out, code := fetch(t, e.p, sb, url); code == 0 {
		t.Errorf("with its broker stopped, the workspace fetched %q; want no network", out)
	}
	p2 := e.provider(t)
	if out, code := fetch(t, p2, sb, url); code != 0 || !strings.HasPrefix(out, "hello allowed.sg.test\n") {
		t.Errorf("after a restart: exit %d, %q; want the page", code, out)
	}
	// The reopened workspace's bytes are handed to Record as its
	// account's: the account came back from the workspace's record.
	var handed []egress.Delta
	if err := e.proxy.Record(t.Context(), func(_ context.Context, ds []egress.Delta) ([]egress.Kept, error) {
		handed = ds
		return make([]egress.Kept, len(ds)), nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(handed) != 1 || handed[0].WorkspaceID != sb.Ref || handed[0].AccountID != egressAccount || handed[0].BytesIn <= 0 || handed[0].BytesOut <= 0 {
		t.Errorf("Record after a restart handed %+v; want %s of %s with bytes both ways", handed, sb.Ref, egressAccount)
	}
}

// egressAccount is the account of the egress tests' workspaces.
const egressAccount = "acct_egress"

func TestCreateRefusesDomainsWithoutEgress(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	if got := p.Capabilities().Egress; got != providers.EgressNoneOnly {
		t.Errorf("Capabilities().Egress without a proxy = %v; want none-only", got)
	}
	spec := providertest.Spec(t)
	spec.Egress.AllowedDomains = []string{"allowed.sg.test"}
	if _, err := p.Create(context.Background(), spec); err == nil {
		t.Errorf("Create with domains and no egress proxy = nil error; want a refusal")
	}
}

// Two providers on one data directory (two broker processes): each takes
// the workspace's socket over before it runs an exec, and the sandboxes
// of either reach the allowed domain.
func TestEgressTwoProviders(t *testing.T) {
	t.Parallel()
	e := newEgressEnv(t)
	sb := e.workspace(t, "allowed.sg.test")
	url := "https://allowed.sg.test:" + strconv.Itoa(e.site.Port) + "/"
	p2 := e.provider(t)
	for i, p := range []*local.Provider{p2, e.p, p2} {
		if out, code := fetch(t, p, sb, url); code != 0 || !strings.HasPrefix(out, "hello allowed.sg.test\n") {
			t.Errorf("fetch %d: exit %d, %q; want the page", i, code, out)
		}
	}
}
