package flymachines

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestWrapperLostOutput runs the guest wrapper on this host with its
// stdout file made unwritable (a directory in its place), as a guest whose
// disk is full would leave it: the answer says the output was lost, and it
// parses as an error. Before, it answered exit 0 with nothing kept,
// flagged as cut at the output cap, which it was not; and a write that
// failed after head had read everything was not flagged at all.
func TestWrapperLostOutput(t *testing.T) {
	d := filepath.Join(t.TempDir(), "x")
	if err := os.MkdirAll(filepath.Join(d, "so"), 0o700); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("sh", "-c", wrapScript, "sh", d, "0", "1024", "10", "", "1", "echo", "hello").Output()
	if err != nil {
		t.Fatalf("wrapper: %v", err)
	}
	res, err := parseWrapped(out, 1024)
	if err == nil || !strings.Contains(err.Error(), "could not keep") {
		t.Errorf("answer of a wrapper that could not keep stdout = %+v, %v; want an error saying the output was lost", res, err)
	}
	// The same wrapper, nothing in the way: the whole output.
	out, err = exec.Command("sh", "-c", wrapScript, "sh", filepath.Join(t.TempDir(), "y"), "0", "1024", "10", "", "1", "echo", "hello").Output()
	if err != nil {
		t.Fatalf("wrapper: %v", err)
	}
	if res, err := parseWrapped(out, 1024); err != nil || string(res.Stdout) != "hello\n" || res.StdoutTruncated {
		t.Errorf("answer of the wrapper = %+v, %v; want stdout %q, whole", res, err, "hello\n")
	}
}
