package local_test

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate"
	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/local"
	"github.com/sandgate/sandgate/providers/providertest"
)

// usedBytes returns the bytes the files under dir take on disk.
func usedBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// TestCommandOutputQuota: 200 durable commands of 8 MiB output each
// cannot put more than the workspace's disk quota of output on the host:
// the starts past it are refused as not started, and what the commands
// kept stays within the quota.
func TestCommandOutputQuota(t *testing.T) {
	t.Parallel()
	const quotaMiB = 32
	dataDir := t.TempDir()
	p, err := local.New(t.Context(), local.Config{DataDir: dataDir, Tiers: map[string]local.Tier{"small": {DiskMiB: quotaMiB}}},
		providers.Env{BrokerID: broker})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(p) })
	sb, err := p.Create(t.Context(), providers.CreateSpec{WorkspaceID: "ws_chatty", InstanceID: "inst_x",
		Size: sandgate.Size{Name: "small", CPUCores: 1, MemoryMiB: 256}, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	commands := filepath.Join(dataDir, "workspaces", sb.Ref, "commands")
	var started []string
	refused := 0
	for i := range 200 {
		id := "c" + strconv.Itoa(i)
		err := p.StartCommand(t.Context(), sb, id, providers.ExecSpec{Argv: []string{"head", "-c", "8388608", "/dev/zero"},
			Timeout: time.Minute, MaxOutputBytes: 8 << 20})
		switch {
		case err == nil:
			started = append(started, id)
		case errors.Is(err, providers.ErrCommandNotStarted):
			refused++
		default:
			t.Fatalf("StartCommand(%s): %v; want started or ErrCommandNotStarted", id, err)
		}
	}
	if len(started) == 0 || refused == 0 {
		t.Fatalf("started %d, refused %d of 200; want the first ones started and the rest refused", len(started), refused)
	}
	for _, id := range started {
		if st := providertest.WaitCommand(t, p, sb, id, 1); st.StdoutBytes != 8<<20 {
			t.Errorf("command %s: %d bytes of output; want 8 MiB", id, st.StdoutBytes)
		}
	}
	if used := usedBytes(commands); used > quotaMiB<<20 {
		t.Errorf("the commands keep %d MiB on the host; want at most the workspace's quota, %d MiB", used>>20, quotaMiB)
	}
}

// TestCommandCountCap: a workspace starts at most max_commands durable
// commands; a repeated start of one it has still answers as before.
func TestCommandCountCap(t *testing.T) {
	t.Parallel()
	p, err := local.New(t.Context(), local.Config{DataDir: t.TempDir(), MaxCommands: 2}, providers.Env{BrokerID: broker})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	t.Cleanup(func() { providertest.Discard(p) })
	sb := providertest.Create(t, p, providertest.Spec(t))
	spec := providers.ExecSpec{Argv: []string{"true"}, Timeout: time.Minute, MaxOutputBytes: 100}
	for _, id := range []string{"a", "b"} {
		if err := p.StartCommand(t.Context(), sb, id, spec); err != nil {
			t.Fatalf("StartCommand(%s): %v", id, err)
		}
	}
	if err := p.StartCommand(t.Context(), sb, "c", spec); !errors.Is(err, providers.ErrCommandNotStarted) {
		t.Errorf("third StartCommand past max_commands 2: %v; want ErrCommandNotStarted", err)
	}
	if err := p.StartCommand(t.Context(), sb, "a", spec); err != nil {
		t.Errorf("repeated StartCommand(a) at the cap: %v; want nil (launched before)", err)
	}
}
