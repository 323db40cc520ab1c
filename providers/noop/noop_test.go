package noop_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sandgate/sandgate/providers"
	"github.com/sandgate/sandgate/providers/noop"
)

func settings(t *testing.T, src string) yaml.Node {
	t.Helper()
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(src), &n); err != nil {
		t.Fatalf("yaml: %v", err)
	}
	return *n.Content[0]
}

func TestOpenWarnsAndRefusesUnknownKeys(t *testing.T) {
	var logs bytes.Buffer
	env := providers.Env{Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	p, err := noop.Open(context.Background(), "bench", yaml.Node{}, env)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer p.Close()
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "provider=bench") {
		t.Errorf("Open logged %q; want a warning naming the provider", logs.String())
	}
	if _, err := noop.Open(context.Background(), "bench", settings(t, "bwrap_path: /x\n"), env); err == nil {
		t.Errorf("Open with an unknown key: nil error; want one")
	}
}

func TestSandboxLifecycle(t *testing.T) {
	ctx := context.Background()
	p := noop.New("bench")
	sb, err := p.Create(ctx, providers.CreateSpec{WorkspaceID: "ws_1", InstanceID: "inst_1"})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if r, err := p.Exec(ctx, sb, providers.ExecSpec{Argv: []string{"true"}}); err != nil || r.ExitCode != 0 {
		t.Fatalf("Exec = %+v, %v; want exit 0, nil", r, err)
	}
	if err := providers.WriteFileBytes(ctx, p, sb, "/w/a", []byte("hello")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if b, err := providers.ReadFileBytes(ctx, p, sb, "/w/a", 5); err != nil || string(b) != "hello" {
		t.Fatalf("ReadFile = %q, %v; want hello, nil", b, err)
	}
	if _, err := providers.ReadFileBytes(ctx, p, sb, "/w/a", 4); !errors.Is(err, providers.ErrFileTooLarge) {
		t.Errorf("ReadFile over max: %v; want ErrFileTooLarge", err)
	}
	if _, err := providers.ReadFileBytes(ctx, p, sb, "/w/b", 5); !errors.Is(err, providers.ErrFileNotFound) {
		t.Errorf("ReadFile of a missing file: %v; want ErrFileNotFound", err)
	}
	l, _ := p.List(ctx)
	if len(l) != 1 || l[0].Labels[providers.LabelWorkspace] != "ws_1" {
		t.Errorf("List = %+v; want the one sandbox labelled ws_1", l)
	}
	if err := p.Terminate(ctx, sb); err != nil {
		t.Fatalf("Terminate: %v", err)
	}
	if err := p.Terminate(ctx, sb); err != nil {
		t.Errorf("second Terminate: %v; want nil", err)
	}
	if _, err := p.Exec(ctx, sb, providers.ExecSpec{Argv: []string{"true"}}); !errors.Is(err, providers.ErrSandboxGone) {
		t.Errorf("Exec after Terminate: %v; want ErrSandboxGone", err)
	}
	if c := p.Capabilities(); c.Snapshots || c.VendorLifetime || c.Egress != providers.EgressNoneOnly || len(c.Sizes) == 0 {
		t.Errorf("Capabilities = %+v; want no snapshots, no vendor lifetime, no network, the standard sizes", c)
	}
}
