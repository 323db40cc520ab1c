package modal_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/modal/modaltest"
	"github.com/sandgate/sandgate/providers/providertest"
)

// TestLongArgv: an argv of 100 KiB, over what Modal takes in
// TaskExecStart, runs once on the fake with every argument intact (quotes,
// spaces, an empty one), its stdin and exit status its own, and leaves no
// file behind; no request to Modal carries more than 64 KiB.
func TestLongArgv(t *testing.T) {
	fake := startFake(t, modaltest.Config{})
	p := newProvider(t, fake, "sandgate-argv")
	sb := providertest.Create(t, p, spec(t, "small", 10*time.Minute))

	big := strings.Repeat("x'y \"z\\ ", 100<<10/8)
	script := `printf '%s' "$1" | sha256sum | cut -d' ' -f1; printf '[%s]' "$2"; cat; ls -a /tmp | grep -c sandgate-argv; exit 7`
	argv := []string{"sh", "-c", script, "sh", big, ""}
	res, err := p.Exec(t.Context(), sb, providers.ExecSpec{Argv: argv, Stdin: []byte("in"), Timeout: time.Minute, MaxOutputBytes: 4096})
	if err != nil {
		t.Fatalf("Exec with a 100 KiB argv: %v", err)
	}
	sum := sha256.Sum256([]byte(big))
	want := hex.EncodeToString(sum[:]) + "\n[]in0\n"
	if got := string(res.Stdout); got != want || res.ExitCode != 7 {
		t.Errorf("stdout %q, exit %d; want %q, 7 (stderr %q)", got, res.ExitCode, want, res.Stderr)
	}
	for _, r := range fake.ExecStarts() {
		n := 0
		for _, a := range r.GetCommandArgs() {
			n += len(a) + 1
		}
		if n > 64<<10 {
			t.Errorf("a TaskExecStart carried %d bytes of command_args; want at most 64 KiB", n)
		}
	}
	if !bytes.Contains(res.Stdout, []byte("[]")) {
		t.Errorf("the empty argument was lost")
	}
}

// TestExecTimeoutMargin: the timeout Modal enforces on an exec is later
// than the in-sandbox one, so that the wrapper kills the command's
// children and reports the timeout, not Modal.
func TestExecTimeoutMargin(t *testing.T) {
	fake := startFake(t, modaltest.Config{})
	p := newProvider(t, fake, "sandgate-margin")
	sb := providertest.Create(t, p, spec(t, "small", 10*time.Minute))
	before := len(fake.ExecStarts())
	res, err := p.Exec(t.Context(), sb, providers.ExecSpec{Argv: []string{"sleep", "30"}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if !res.TimedOut {
		t.Errorf("result %+v; want timed out", res)
	}
	reqs := fake.ExecStarts()[before:]
	if len(reqs) != 1 {
		t.Fatalf("%d TaskExecStart requests; want 1", len(reqs))
	}
	if reqs[0].TimeoutSecs == nil || time.Duration(reqs[0].GetTimeoutSecs())*time.Second <= 2*time.Second {
		t.Errorf("timeout_secs sent to Modal = %d; want more than the in-sandbox 2 s", reqs[0].GetTimeoutSecs())
	}
}
