package main

import (
	"context"
	"encoding/base64"
	"os"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandgate/sandgate/images/imagestest"
	"github.com/sandgate/sandgate/protocol"
)

// TestImageServeE2E runs `sandgate serve` with an image store and an
// in-process registry: a workspace acquired on an image by tag runs its
// execs and durable commands on the image, and is released.
func TestImageServeE2E(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	host := imagestest.Registry(t, nil)
	ref := host + "/e2e/busybox:1"
	imagestest.Push(t, ref, imagestest.Image(t, v1.Config{}, imagestest.BusyboxLayer(t, "sandgate-e2e-image")))

	cfg := newServeConfig(t, startRedis(t).Addr, serveOptions{})
	raw, err := os.ReadFile(cfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	yaml := strings.Replace(string(raw), "  sizes: [small, standard]\n", "  sizes: [small, standard]\n  images: [host, \""+ref+"\"]\n  default_image: host\n", 1) +
		"images:\n  insecure: [\"" + host + "\"]\n"
	if err := os.WriteFile(cfg.Path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	gw := startServe(t, cfg)
	adm := gw.Admin(t)
	c := gw.Client(t, issueToken(t, adm, createInstance(t, adm, createAccount(t, adm, "e2e-images"), 2)))

	ws, _, err := c.Acquire(ctx, "image-1", protocol.AcquireRequest{Label: "img", Image: ref, Egress: noEgress()})
	if err != nil {
		t.Fatalf("acquire on %s: %v", ref, err)
	}
	res, err := c.Exec(ctx, ws.WorkspaceID, protocol.ExecRequest{Argv: []string{"cat", "/etc/os-release"}})
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	out, _ := base64.StdEncoding.DecodeString(res.StdoutB64)
	if res.ExitCode != 0 || string(out) != "ID=sandgate-e2e-image\n" {
		t.Errorf("cat /etc/os-release on the image = exit %d %q; want the image's", res.ExitCode, out)
	}
	// A durable command runs on the image too.
	if _, _, err := c.StartCommand(ctx, ws.WorkspaceID, "image:cat", protocol.ExecRequest{Argv: []string{"cat", "/etc/os-release"}}); err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
	var st *protocol.CommandStatus
	waitFor(t, "the command on the image", func() (bool, error) {
		st, err = c.ReadCommand(ctx, ws.WorkspaceID, "image:cat")
		return err == nil && st.State == protocol.CommandCompleted, err
	})
	out, _ = base64.StdEncoding.DecodeString(st.StdoutB64)
	if st.ExitCode == nil || *st.ExitCode != 0 || string(out) != "ID=sandgate-e2e-image\n" {
		t.Errorf("durable cat /etc/os-release on the image = %+v %q; want the image's", st, out)
	}
	if _, err := c.Release(ctx, ws.WorkspaceID); err != nil {
		t.Errorf("release: %v", err)
	}
}
