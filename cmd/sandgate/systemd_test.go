package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// unitPath is the shipped systemd unit.
const unitPath = "../../deploy/systemd/sandgate.service"

// TestSystemdUnitVerifies runs `systemd-analyze verify` on the shipped
// unit, its binary path pointed at the sandgate just built (verify
// refuses an ExecStart that does not exist), and fails on any complaint:
// verify only warns, exit 0, about an unknown key or a directive in the
// wrong section. It needs no running systemd.
func TestSystemdUnitVerifies(t *testing.T) {
	b, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	unit := string(b)
	for _, line := range []string{
		"ExecStart=/usr/local/bin/sandgate serve --config /etc/sandgate/sandgate.yaml",
		"ExecStartPre=/usr/local/bin/sandgate serve --check --config /etc/sandgate/sandgate.yaml",
		"Restart=on-failure",
		"ExecReload=/bin/kill -HUP $MAINPID",
	} {
		if !strings.Contains(unit, "\n"+line+"\n") {
			t.Errorf("%s has no line %q", unitPath, line)
		}
	}
	dir := t.TempDir()
	copyPath := filepath.Join(dir, "sandgate.service")
	if err := os.WriteFile(copyPath, []byte(strings.ReplaceAll(unit, "/usr/local/bin/sandgate", sandgateBin)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("systemd-analyze", "verify", "--man=no", copyPath).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", unitPath, err, out)
	}
	// The check is real: a directive in the wrong section fails it.
	bad := strings.Replace(strings.ReplaceAll(unit, "/usr/local/bin/sandgate", sandgateBin), "[Service]\n", "[Service]\nWants=nothing.target\n", 1)
	if err := os.WriteFile(copyPath, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command("systemd-analyze", "verify", "--man=no", copyPath).CombinedOutput(); len(out) == 0 {
		t.Errorf("systemd-analyze verify passed a unit with Wants= in [Service] without a word")
	}
}
