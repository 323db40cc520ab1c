package blobstore_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/providers/blobstore"
)

func TestDir(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	d, err := blobstore.NewDir(root)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{0, 1, 2, 0xff}, 1000)
	n, err := d.Put(ctx, "snap_a", bytes.NewReader(data), 0)
	if err != nil || n != int64(len(data)) {
		t.Fatalf("Put = %d, %v; want %d, nil", n, err, len(data))
	}
	rc, size, err := d.Open(ctx, "snap_a")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if size != int64(len(data)) || !bytes.Equal(got, data) {
		t.Errorf("Open = %d bytes (size %d); want the %d put", len(got), size, len(data))
	}

	// Over the limit: refused, and the earlier blob of the id is kept.
	if _, err := d.Put(ctx, "snap_a", strings.NewReader("0123456789"), 9); !errors.Is(err, blobstore.ErrTooLarge) {
		t.Errorf("Put over the limit = %v; want ErrTooLarge", err)
	}
	if _, size, _ := d.Open(ctx, "snap_a"); size != int64(len(data)) {
		t.Errorf("blob after a refused Put has %d bytes; want the earlier %d", size, len(data))
	}
	// A failing reader leaves nothing behind either.
	if _, err := d.Put(ctx, "snap_b", io.MultiReader(strings.NewReader("part"), errReader{}), 0); err == nil {
		t.Error("Put from a failing reader succeeded")
	}
	if _, _, err := d.Open(ctx, "snap_b"); !errors.Is(err, blobstore.ErrNotFound) {
		t.Errorf("Open after a failed Put = %v; want ErrNotFound", err)
	}
	ents, _ := os.ReadDir(root)
	if len(ents) != 1 {
		t.Errorf("%d files in the store; want 1 (no temporary left)", len(ents))
	}

	if err := d.Delete(ctx, "snap_a"); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, "snap_a"); err != nil {
		t.Errorf("second Delete = %v; want nil", err)
	}
	if _, _, err := d.Open(ctx, "snap_a"); !errors.Is(err, blobstore.ErrNotFound) {
		t.Errorf("Open after Delete = %v; want ErrNotFound", err)
	}
	for _, bad := range []string{"", "../x", ".hidden", "a/b"} {
		if _, err := d.Put(ctx, bad, strings.NewReader("x"), 0); err == nil {
			t.Errorf("Put(%q) succeeded; want a refused id", bad)
		}
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("broken") }
