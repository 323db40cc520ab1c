package local_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// brokerEnv makes TestHelperBroker act as a broker process: it runs one
// exec, `sh -c 'sleep 300; :' MARKER`, and waits to be killed.
const brokerEnv = "SANDGATE_LOCAL_TEST_BROKER"

// TestHelperBroker is not a test of its own: TestExecsDieWithBroker runs the
// test binary with brokerEnv set, and kills it.
func TestHelperBroker(t *testing.T) {
	arg := os.Getenv(brokerEnv)
	if arg == "" {
		return
	}
	dataDir, marker, _ := strings.Cut(arg, ":")
	p, err := local.New(context.Background(), local.Config{DataDir: dataDir}, providers.Env{BrokerID: broker})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	sb, err := p.Create(context.Background(), providertest.Spec(t))
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	for {
		p.Exec(context.Background(), sb, providers.ExecSpec{Argv: []string{"sh", "-c", "sleep 300; :", marker}, MaxOutputBytes: 10})
	}
}

// TestExecsDieWithBroker kills a broker process (SIGKILL) at moments spread
// over an exec's start, bwrap's set-up included, and checks that no process
// of the exec outlives it: bwrap's own --die-with-parent leaves a window in
// which its pid 1 would be orphaned.
func TestExecsDieWithBroker(t *testing.T) {
	t.Parallel()
	for i := range 12 {
		marker := "die-with-broker-" + randomMarker()
		dataDir := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperBroker$", "-test.count=1")
		cmd.Env = append(os.Environ(), brokerEnv+"="+dataDir+":"+marker)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Wait for the exec (its processes carry the marker), then let it
		// run on a little longer each round: round 0 kills at once.
		waitUntil(t, "the exec to start", func() bool { return len(marked(marker)) > 0 })
		time.Sleep(time.Duration(i) * time.Duration(i) * time.Millisecond)
		cmd.Process.Kill()
		cmd.Wait()
		waitUntil(t, "the exec's processes to die with the broker", func() bool { return len(marked(marker)) == 0 })
		if left := marked(marker); len(left) > 0 {
			for _, pid := range left {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			t.Fatalf("round %d: processes %v outlived the broker; broker output:\n%s", i, left, out.String())
		}
		// The next broker on the data directory ends the workspace (its
		// cleanup terminates what is listed).
		newProvider(t, dataDir, broker)
	}
}

// marked returns the processes whose command line holds marker.
func marked(marker string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(b, []byte(marker)) && !gone(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// waitUntil polls cond until it holds, failing the test after a generous
// bound (a backstop, not a timing assertion).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Errorf("timed out waiting for %s", what)
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func randomMarker() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
