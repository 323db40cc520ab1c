//go:build linux && (amd64 || arm64)

package guest_test

import (
	"os/exec"
	"testing"
)

// BenchmarkJailTrue is an exec of `true` through the agent's jail, as a
// vendor guest runs every exec; BenchmarkPlainTrue is the same exec
// without it. Their ratio is what the jail adds (docs/benchmarks.md).
func BenchmarkJailTrue(b *testing.B) {
	dir := agentDir(b)
	for b.Loop() {
		if err := exec.Command(agent, "run", "--agent-dir", dir, "--", "true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPlainTrue(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}
