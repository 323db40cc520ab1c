package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/protocol"
)

// dockerImage is what the Dockerfile's runtime stage says about the
// process a container of the image starts.
type dockerImage struct {
	User, Workdir   string
	Entrypoint, Cmd []string
}

// readDockerfile reads the runtime (last) stage of the Dockerfile.
func readDockerfile(t *testing.T, root string) dockerImage {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	img := dockerImage{User: "root", Workdir: "/"}
	for _, l := range strings.Split(string(b), "\n") {
		kw, arg, _ := strings.Cut(strings.TrimSpace(l), " ")
		var err error
		switch kw {
		case "FROM":
			img = dockerImage{User: "root", Workdir: "/"}
		case "USER":
			img.User = arg
		case "WORKDIR":
			img.Workdir = arg
		case "ENTRYPOINT":
			err = json.Unmarshal([]byte(arg), &img.Entrypoint)
		case "CMD":
			err = json.Unmarshal([]byte(arg), &img.Cmd)
		}
		if err != nil {
			t.Fatalf("Dockerfile: %s %s: want the exec (JSON) form: %v", kw, arg, err)
		}
	}
	if len(img.Entrypoint) == 0 {
		t.Fatal("Dockerfile: the runtime stage has no ENTRYPOINT")
	}
	return img
}

// TestImageEntrypoint starts the image's entrypoint and command as
// docker compose starts the sandgate service, without Docker (no engine
// runs here): as the image's user, with the compose file's capabilities
// and nothing else, with a /dev like Docker's (a tmpfs holding the usual
// nodes and the service's devices), with each of the service's volumes at
// its path (the config file, the TLS volume, the data volume) and the
// binary at the entrypoint's path, all in a mount namespace of its own.
// The broker must reach /readyz with the shipped config and run a
// workspace through everything the local provider does: exec, a timeout,
// files, a snapshot and a warm start, a durable command and its cancel,
// release. Only the listeners' ports (chosen at run time) and the Redis
// and collector addresses differ from the compose file.
func TestImageEntrypoint(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"unshare", "setpriv", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the test needs %s (util-linux): %v", tool, err)
		}
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	img := readDockerfile(t, root)
	b, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	svc := c.Services["sandgate"]
	if !slices.Equal(svc.CapDrop, []string{"ALL"}) || len(svc.CapAdd) == 0 {
		t.Fatalf("sandgate service: cap_drop %v, cap_add %v; want [ALL] and the capabilities it needs", svc.CapDrop, svc.CapAdd)
	}
	// The systemd unit grants the same set.
	unit, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	var unitCaps []string
	for _, l := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(l, "CapabilityBoundingSet="); ok {
			unitCaps = strings.Fields(strings.ReplaceAll(v, "CAP_", ""))
		}
	}
	if !slices.Equal(slices.Sorted(slices.Values(unitCaps)), slices.Sorted(slices.Values(svc.CapAdd))) {
		t.Errorf("%s: CapabilityBoundingSet %v; want the compose file's cap_add %v", unitPath, unitCaps, svc.CapAdd)
	}
	user := img.User
	if svc.User != "" {
		user = svc.User
	}
	cmdline := slices.Concat(img.Entrypoint, img.Cmd)
	if cmd := anyStrings(svc.Command); len(cmd) > 0 {
		cmdline = slices.Concat(img.Entrypoint, cmd)
	}

	dir := t.TempDir()
	rs := startRedis(t)
	pki := newPKI(t, dir)
	token := "sgo_" + randHex(24)
	var sh strings.Builder
	sh.WriteString("set -eu\n")
	// A mount point the host lacks is made in an overlay of its parent,
	// so nothing is left on the host.
	overlaid := map[string]bool{}
	mountPoint := func(path string, isDir bool) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		parent := filepath.Dir(path)
		for !exists(parent) {
			parent = filepath.Dir(parent)
		}
		if !overlaid[parent] {
			overlaid[parent] = true
			n := fmt.Sprint(len(overlaid))
			up, work := filepath.Join(dir, "up"+n), filepath.Join(dir, "work"+n)
			fmt.Fprintf(&sh, "mkdir -p %q %q\nmount -t overlay overlay -o lowerdir=%s,upperdir=%s,workdir=%s %q\n", up, work, parent, up, work, parent)
		}
		if isDir {
			fmt.Fprintf(&sh, "mkdir -p %q\n", path)
		} else {
			fmt.Fprintf(&sh, "mkdir -p %q && touch %q\n", filepath.Dir(path), path)
		}
	}
	bind := func(src, dst string, ro bool) {
		st, err := os.Stat(src)
		if err != nil {
			t.Fatal(err)
		}
		mountPoint(dst, st.IsDir())
		fmt.Fprintf(&sh, "mount --bind %q %q\n", src, dst)
		if ro {
			fmt.Fprintf(&sh, "mount -o remount,bind,ro %q\n", dst)
		}
	}
	for _, v := range svc.Volumes {
		parts := strings.Split(v, ":")
		src, dst := parts[0], parts[1]
		ro := len(parts) > 2 && parts[2] == "ro"
		switch {
		case strings.HasPrefix(src, "."):
			src = filepath.Join(root, src)
		case filepath.IsAbs(src):
			if src == dst {
				continue // the host's own hierarchy, already there
			}
		default: // a named volume: a fresh directory
			src = filepath.Join(dir, "volume-"+src)
			if err := os.MkdirAll(src, 0o700); err != nil {
				t.Fatal(err)
			}
			if strings.HasSuffix(dst, "/tls") { // what tls-init writes there
				copyFile(t, pki.CertPath, filepath.Join(src, "tls.crt"))
				copyFile(t, pki.KeyPath, filepath.Join(src, "tls.key"))
			}
		}
		bind(src, dst, ro)
	}
	bind(sandgateBin, img.Entrypoint[0], true)

	// Docker's /dev: a tmpfs with the usual nodes, and the devices the
	// service is given.
	devDir := filepath.Join(dir, "dev")
	fmt.Fprintf(&sh, "mkdir -p %[1]q && mount -t tmpfs -o nosuid,mode=755 tmpfs %[1]q\n", devDir)
	nodes := []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"}
	for _, d := range slices.Concat(nodes, svc.Devices) {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			t.Fatalf("device %s: %v", d, err)
		}
		kind := "c"
		if st.Mode&unix.S_IFMT == unix.S_IFBLK {
			kind = "b"
		}
		fmt.Fprintf(&sh, "mknod -m 666 %q %s %d %d\n", filepath.Join(devDir, filepath.Base(d)), kind, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
	fmt.Fprintf(&sh, "mkdir %[1]q/pts %[1]q/shm && ln -s /proc/self/fd %[1]q/fd && mount --move %[1]q /dev\n", devDir)

	caps := "-all"
	for _, c := range svc.CapAdd {
		caps += ",+" + strings.ToLower(c)
	}
	setpriv := []string{"setpriv", "--bounding-set", caps}
	if user != "root" && user != "0" {
		setpriv = append(setpriv, "--reuid", user, "--regid", user, "--clear-groups", "--inh-caps", caps, "--ambient-caps", caps)
	}
	fmt.Fprintf(&sh, "cd %q\nexec %s -- %s\n", img.Workdir, shellJoin(setpriv), shellJoin(cmdline))

	env := []string{
		"SANDGATE_REDIS_ADDR=" + rs.Addr,
		"SANDGATE_LISTEN=127.0.0.1:0",
		"SANDGATE_ADMIN_LISTEN=127.0.0.1:0",
	}
	for k, v := range svc.Environment {
		switch {
		case k == "SANDGATE_REDIS_ADDR", strings.HasPrefix(k, "OTEL_"), strings.HasPrefix(k, "SANDGATE_ADMIN_"):
			// Replaced above; no collector here; the CLI's, not the broker's.
		case strings.HasPrefix(v, "${"):
			env = append(env, k+"="+token) // the one secret compose takes from the operator
		default:
			env = append(env, k+"="+v)
		}
	}
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", sh.String())
	cmd.Env = cleanEnv(env...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 10 * time.Second
	p := startCmd(t, "the image's entrypoint", cmd)

	var pub, adm string
	waitFor(t, "the broker to listen", func() (bool, error) {
		if p.exited() {
			t.Fatalf("the entrypoint exited (%v):\n%s\nset-up:\n%s", p.err, p.Logs(), sh.String())
		}
		var ok bool
		pub, adm, ok = listenAddrs(p.stderr.String())
		return ok, errors.New("no \"sandgate listening\" log line yet")
	})
	waitFor(t, "/readyz", func() (bool, error) {
		resp, err := http.Get("http://" + adm + "/readyz")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Errorf("status %d", resp.StatusCode)
	})

	a := newAdminClient(t, "http://"+adm, token)
	cl := newClient(t, "https://"+pub, pki.Roots, issueToken(t, a, createInstance(t, a, createAccount(t, a, "image"), 2)))
	ctx := context.Background()
	ws := acquire(t, cl, "image-"+randHex(4))
	if r, err := cl.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"echo", "hi"}}); err != nil || r.ExitCode != 0 || r.StdoutB64 != "aGkK" {
		t.Fatalf("exec echo hi = %+v, %v", r, err)
	}
	if r, err := cl.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"sh", "-c", "sleep 60 & sleep 60"}, TimeoutSeconds: 1}); err != nil || !r.TimedOut {
		t.Errorf("exec past its timeout = %+v, %v; want timed_out", r, err)
	}
	if err := cl.WriteFile(ctx, ws.WorkspaceID, "/workspace/notes/hello.txt", []byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	snap, _, err := cl.Snapshot(ctx, ws.WorkspaceID, "image-snap-"+randHex(4), "/workspace/notes")
	if err != nil {
		t.Fatal(err)
	}
	warm, _, err := cl.Acquire(ctx, "image-warm-"+randHex(4), protocol.AcquireRequest{Label: "warm", Egress: noEgress(), SnapshotID: snap.SnapshotID})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := cl.ReadFile(ctx, warm.WorkspaceID, "/workspace/notes/hello.txt"); err != nil || string(got) != "hello\n" {
		t.Errorf("the warm start's file = %q, %v", got, err)
	}
	if _, _, err := cl.StartCommand(ctx, ws.WorkspaceID, "image-cmd", protocol.ExecRequest{Argv: []string{"sleep", "60"}}); err != nil {
		t.Fatal(err)
	}
	if err := cl.CancelCommand(ctx, ws.WorkspaceID, "image-cmd"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the durable command to end canceled", func() (bool, error) {
		st, err := cl.ReadCommand(ctx, ws.WorkspaceID, "image-cmd")
		if err != nil {
			return false, err
		}
		return st.State == protocol.CommandCanceled, fmt.Errorf("state %s", st.State)
	})
	for _, id := range []string{warm.WorkspaceID, ws.WorkspaceID} {
		if w, err := cl.Release(ctx, id); err != nil || w.TerminationReason == nil || *w.TerminationReason != "released" {
			t.Errorf("release %s = %+v, %v", id, w, err)
		}
	}
	if err := cl.DeleteSnapshot(ctx, snap.SnapshotID); err != nil {
		t.Error(err)
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// shellJoin quotes each word for sh.
func shellJoin(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
