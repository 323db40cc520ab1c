package main

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// shippedConfigs are the broker configs the repository ships, each of
// which `serve --check` must pass.
var shippedConfigs = []string{"../../deploy/sandgate.yaml"}

// exitOf is the exit code of a tryCLI error; 0 for nil.
func exitOf(t testing.TB, err error) int {
	t.Helper()
	var ee *exec.ExitError
	if err == nil {
		return 0
	}
	if !errors.As(err, &ee) {
		t.Fatalf("not an exit: %v", err)
	}
	return ee.ExitCode()
}

// TestServeCheckShipped: every shipped config passes `serve --check`, with
// the files and variables its deployment supplies (the TLS pair and the
// operator token) given through the overrides.
func TestServeCheckShipped(t *testing.T) {
	pki := newPKI(t, t.TempDir())
	env := []string{"SANDGATE_TLS_CERT_FILE=" + pki.CertPath, "SANDGATE_TLS_KEY_FILE=" + pki.KeyPath,
		"SANDGATE_OPERATOR_TOKEN_ADMIN=" + operatorPrefix + randHex(16)}
	for _, path := range shippedConfigs {
		stdout, stderr, err := tryCLI(env, "serve", "--check", "--config", path)
		if err != nil || !strings.Contains(stdout, "config OK") {
			t.Errorf("serve --check --config %s: %v; stdout %q, stderr %q", path, err, stdout, stderr)
		}
	}
	// The same config with a key of another pair is refused: the pair
	// must match.
	other := newPKI(t, t.TempDir())
	env[1] = "SANDGATE_TLS_KEY_FILE=" + other.KeyPath
	_, stderr, err := tryCLI(env, "serve", "--check", "--config", shippedConfigs[0])
	if exitOf(t, err) != exitFailure || !strings.Contains(stderr, "tls.cert_file and tls.key_file") {
		t.Errorf("serve --check with a mismatched key: %v, stderr %q; want exit 1 naming tls.cert_file and tls.key_file", err, stderr)
	}
}

// TestServeCheckRefuses: three broken configs are refused, each message
// naming the YAML path and, where there is a choice, the allowed values.
func TestServeCheckRefuses(t *testing.T) {
	tests := []struct {
		file string
		want []string
	}{
		{"bad-size.yaml", []string{`defaults.default_size: "huge" is not a size; allowed: small, standard, large, xlarge`}},
		{"unknown-key.yaml", []string{`admission.risk.max_sise: unknown key "max_sise"`}},
		{"bad-provider.yaml", []string{`providers[0] (eu)`, `unknown key "region"`, `providers[1] (fly)`, "FLY_API_TOKEN is not set"}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			stdout, stderr, err := tryCLI(nil, "serve", "--check", "--config", filepath.Join("testdata", "check", tt.file))
			if code := exitOf(t, err); code != exitFailure {
				t.Fatalf("serve --check %s: exit %d; want %d (stdout %q, stderr %q)", tt.file, code, exitFailure, stdout, stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("serve --check %s: stderr %q; want it to hold %q", tt.file, stderr, w)
				}
			}
			for _, goType := range []string{"broker.Config", "struct {", "time.Duration", "modal.Settings"} {
				if strings.Contains(stderr, goType) {
					t.Errorf("serve --check %s: stderr %q names the Go type %q", tt.file, stderr, goType)
				}
			}
		})
	}
}

// TestDevRefusesDataDirInUse: a second `sandgate dev` on a data directory
// in use exits at once, naming the first one's pid, and leaves the first
// one serving.
func TestDevRefusesDataDirInUse(t *testing.T) {
	d := startDev(t)
	_, stderr, err := tryCLI(nil, "dev", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir", d.dataDir)
	if code := exitOf(t, err); code != exitFailure {
		t.Fatalf("second sandgate dev: exit %d; want %d (stderr %q)", code, exitFailure, stderr)
	}
	if want := fmt.Sprintf("pid %d", d.cmd.Process.Pid); !strings.Contains(stderr, want) {
		t.Errorf("second sandgate dev: stderr %q; want it to name %q", stderr, want)
	}
	if _, err := d.Client(t, d.Token).Lease(t.Context()); err != nil {
		t.Errorf("the first sandgate dev after the second was refused: %v", err)
	}
}

// TestExitCodes: each class of failure exits with its own code, as the
// root command's help documents.
func TestExitCodes(t *testing.T) {
	rs, _, s := startOne(t)
	acct := createAccount(t, s.Admin(t), "exit-codes")
	tests := []struct {
		name string
		env  []string
		args []string
		want int
	}{
		{"usage: unknown flag", nil, []string{"serve", "--nope"}, exitUsage},
		{"usage: unknown command", nil, []string{"admin", "stp"}, exitUsage},
		{"usage: extra argument", s.AdminEnv(), []string{"usage", "reconcile", "extra"}, exitUsage},
		{"refused: bad token", []string{"SANDGATE_ADMIN_URL=" + s.AdminURL, "SANDGATE_ADMIN_TOKEN=" + operatorPrefix + "wrong"},
			[]string{"usage", "reconcile"}, exitRefused},
		{"unavailable: nothing listens", []string{"SANDGATE_ADMIN_URL=http://127.0.0.1:1", "SANDGATE_ADMIN_TOKEN=x"},
			[]string{"usage", "reconcile"}, exitUnavailable},
		{"other: config missing", nil, []string{"serve", "--check", "--config", filepath.Join(t.TempDir(), "none.yaml")}, exitFailure},
		{"no drift", s.AdminEnv(), []string{"usage", "reconcile"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, stderr, err := tryCLI(tt.env, tt.args...)
			if got := exitOf(t, err); got != tt.want {
				t.Errorf("sandgate %s: exit %d; want %d (stderr %q)", strings.Join(tt.args, " "), got, tt.want, stderr)
			}
		})
	}
	// The codes are documented where a scripter looks.
	help := runCLI(t, nil, "--help")
	for _, line := range strings.Split(exitHelp, "\n")[1:] {
		if !strings.Contains(help, line) {
			t.Errorf("sandgate --help lacks the exit code line %q", line)
		}
	}
	// Credits the ledger never recorded: drift.
	rdb := rs.Client()
	if err := rdb.HIncrBy(t.Context(), "sg:{"+acct+"}:funds", "credits", 5).Err(); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := tryCLI(s.AdminEnv(), "usage", "reconcile")
	if got := exitOf(t, err); got != exitDrift || !strings.Contains(stdout, "DRIFT") {
		t.Errorf("usage reconcile with drift: exit %d, stdout %q, stderr %q; want %d and DRIFT", got, stdout, stderr, exitDrift)
	}
}

// TestUsageExportReports: an export to a file reports its rows and bytes
// on stderr, and an empty JSON lines export leaves no "superfluous
// WriteHeader" in the broker's log (a flush of nothing would send the
// status before the handler's own).
func TestUsageExportReports(t *testing.T) {
	_, _, s := startOne(t)
	acct := createAccount(t, s.Admin(t), "export-empty")
	dir := t.TempDir()
	for _, tt := range []struct{ format, want string }{
		{"jsonl", "wrote 0 rows, 0 bytes"},
		{"csv", "wrote 0 rows, "},
	} {
		out := filepath.Join(dir, "usage."+tt.format)
		_, stderr, err := tryCLI(s.AdminEnv(), "usage", "export", "--account", acct, "--format", tt.format, "--out", out)
		if err != nil || !strings.Contains(stderr, tt.want) {
			t.Errorf("usage export --format %s: %v, stderr %q; want %q", tt.format, err, stderr, tt.want)
		}
	}
	if logs := s.Logs(); strings.Contains(logs, "superfluous") {
		t.Errorf("broker log after an empty export: %s", tail(logs, 2000))
	}
}
