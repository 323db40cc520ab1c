package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/adminapi"
)

// readmeNotRun are the README's shell blocks the test does not run, each
// with what stands for it: they start long-running processes.
var readmeNotRun = map[string]string{
	"go run ./cmd/sandgate dev\n": "the test starts sandgate dev itself (startDev)",
	"make test\n":                 "it is the test suite",
	"export SANDGATE_OPERATOR_TOKEN_ADMIN=sgo_$(openssl rand -hex 24)   # the operator API's admin token\n" +
		"docker compose up -d --build\n" +
		"docker compose ps                        # sandgate turns healthy once Redis answers and its provider passed its check\n" +
		"docker compose exec sandgate sandgate admin account list   # the operator API is loopback-only: use it inside the container\n": "no Docker engine runs here; TestComposeFile and TestDockerfile check both files",
	"sandgate dev --provider fly-sprites   # with SPRITE_TOKEN (and SPRITES_API_URL, if not Sprites' own) in the environment\n":                                                     "TestFlySpritesWalkthrough runs it against the fake Sprites",
	"go run ./providers/modal/modaltest/cmd/modalfake --data-dir /tmp/modalfake >modal.env &\nsleep 5; set -a; . ./modal.env; set +a\ngo run ./cmd/sandgate dev --provider modal\n": "TestModalWalkthrough runs dev against the fake Modal",
}

// readmeShellBlocks returns README.md's ```sh blocks, in order.
func readmeShellBlocks(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	return out
}

// TestReadmeShellBlocks runs every shell block of README.md, in order, in
// one bash session (so the variables of one block reach the next), as a
// newcomer would: the install block from the checkout (with GOBIN a
// temporary directory, first on the PATH), every other block from the
// directory where `sandgate dev` runs. Nothing the README creates may be
// left running, and no block may keep a "…" placeholder.
func TestReadmeShellBlocks(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "curl", "sed", "date", "jq", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the README needs %s: %v", tool, err)
		}
	}
	blocks := readmeShellBlocks(t)
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	var script strings.Builder
	script.WriteString("set -euo pipefail\nshopt -s inherit_errexit\n")
	seen, installed := map[string]bool{}, false
	for i, b := range blocks {
		if strings.Contains(b, "…") {
			t.Errorf("README shell block %d keeps a … placeholder:\n%s", i+1, b)
		}
		if _, ok := readmeNotRun[b]; ok {
			seen[b] = true
			continue
		}
		fmt.Fprintf(&script, "\necho '### README block %d' >&2\n", i+1)
		if strings.Contains(b, "go install ./cmd/sandgate") {
			installed = true
			script.WriteString("cd \"$SANDGATE_TEST_REPO\"\n" + b)
			script.WriteString("test \"$(command -v sandgate)\" = \"$GOBIN/sandgate\"\n")
			continue
		}
		script.WriteString("cd \"$SANDGATE_TEST_DEV_DIR\"\n" + b)
	}
	for b, why := range readmeNotRun {
		if !seen[b] {
			t.Errorf("README has no shell block %q (not run: %s); update readmeNotRun", b, why)
		}
	}
	if !installed {
		t.Fatal("README has no block that installs the sandgate command (go install ./cmd/sandgate)")
	}
	if t.Failed() {
		t.FailNow()
	}

	d := startDev(t)
	gobin := t.TempDir()
	cmd := exec.Command("bash", "-c", script.String())
	cmd.Dir = d.workDir
	cmd.Env = cleanEnv("GOBIN="+gobin, "PATH="+gobin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"SANDGATE_TEST_REPO="+repo, "SANDGATE_TEST_DEV_DIR="+d.workDir)
	out, stderr := runScript(t, "README shell blocks", cmd, nil)
	for _, want := range []string{
		`"stdout_b64":"aGkK"`,                   // the walk-through's exec
		`"termination_reason":"released"`,       // its release
		"terminated emergency_stopped\n",        // workspace kill
		"Linux\nwrote 13 bytes\noperator-fix\n", // workspace exec, files put and get
		"terminated=0 failed=0\n",               // stop on
		"config OK: sandgate.yaml\n",            // production: serve --check
		`"stdout_b64":"TGludXgK"`,               // production: the smoke exec through serve
	} {
		if !strings.Contains(out, want) {
			t.Errorf("README output lacks %q", want)
		}
	}
	if n := strings.Count(out, `"contents_b64":"aGVsbG8K"`); n != 2 {
		t.Errorf("README output has the file read back %d times; want 2 (walk-through, warm start)", n)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("README output:\n%s\nstderr:\n%s", out, stderr)
	}
	var live adminapi.WorkspaceList
	if err := newAdminClient(t, d.AdminURL, d.AdminToken).Do(context.Background(), http.MethodGet, "/workspaces", nil, &live); err != nil {
		t.Fatal(err)
	}
	if len(live.Workspaces) != 0 {
		t.Errorf("after the README, live workspaces = %+v; want none (the README releases what it creates)", live.Workspaces)
	}
}
