package local

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// A run recorded after a Terminate moved its workspace's directory to the
// trash (a resident the create's warm-up started, its record written beside
// its start) leaves no directory of that workspace behind.
func TestRecordExecAfterTerminate(t *testing.T) {
	l := layout(filepath.Join(t.TempDir(), "workspaces", "ws_gone"))
	if recordExec(l, os.Getpid()) {
		t.Error("recordExec in a workspace that is gone = true; want false")
	}
	if _, err := os.Stat(string(l)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the workspace's directory after a late record: %v; want it absent", err)
	}
	if err := os.MkdirAll(string(l), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, when := range []string{"first", "again"} {
		if !recordExec(l, os.Getpid()) {
			t.Errorf("recordExec in a live workspace (%s) = false; want the record written", when)
		}
	}
}
