package local_test

import (
	"bytes"
	"testing"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/providertest"
)

// TestProgramNotExecuted checks that a program that cannot be executed
// answers as a shell would: 127 when it does not exist, 126 when it
// cannot be executed, and a stderr line naming it, never bwrap's exit
// code 1 and "bwrap:" line; with the output kept in the result or
// streamed to the caller's writers. A command that writes the same
// words among others keeps its own answer.
func TestProgramNotExecuted(t *testing.T) {
	t.Parallel()
	p := newProvider(t, t.TempDir(), broker)
	sb := providertest.Create(t, p, providertest.Spec(t))
	tests := []struct {
		argv   []string
		code   int
		stderr string
	}{
		{[]string{"nosuchprog", "-x"}, 127, "nosuchprog: command not found\n"},
		{[]string{"/workspace/nope"}, 127, "/workspace/nope: No such file or directory\n"},
		{[]string{"/etc/passwd"}, 126, "/etc/passwd: Permission denied\n"},
		{[]string{"/workspace"}, 126, "/workspace: Permission denied\n"},
		{[]string{"sh", "-c", "echo 'bwrap: execvp sh: x' >&2; echo more >&2; exit 1"}, 1, "bwrap: execvp sh: x\nmore\n"},
		{[]string{"sh", "-c", "echo 'bwrap: execvp' >&2; exit 3"}, 3, "bwrap: execvp\n"},
	}
	for _, tt := range tests {
		res := providertest.Exec(t, p, sb, tt.argv...)
		if res.ExitCode != tt.code || string(res.Stderr) != tt.stderr || res.StderrBytes != int64(len(tt.stderr)) {
			t.Errorf("%q: exit %d, stderr %q (%d bytes); want %d, %q", tt.argv, res.ExitCode, res.Stderr, res.StderrBytes, tt.code, tt.stderr)
		}
		var stdout, stderr bytes.Buffer
		res = providertest.ExecWith(t, p, sb, providers.ExecSpec{Argv: tt.argv, Stdout: &stdout, Stderr: &stderr})
		if res.ExitCode != tt.code || stderr.String() != tt.stderr {
			t.Errorf("%q streamed: exit %d, stderr %q; want %d, %q", tt.argv, res.ExitCode, stderr.String(), tt.code, tt.stderr)
		}
	}
}
